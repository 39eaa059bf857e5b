"""FP8 matmuls with delayed scaling (model.matmul_dtype="fp8"), for H100-class GPUs.

flax.linen.fp8_ops does the arithmetic (Fp8DirectDotGeneralOp): the input and the kernel quantized to
float8_e4m3fn, the output's gradient to float8_e5m2, each by a per-tensor scale taken from the amax
history of earlier steps, the result in the compute dtype. Master weights and the optimizer stay in
param_dtype. The scaling state (amax histories, scales) lives in flax's
OVERWRITE_WITH_GRADIENT collection, never in "params", so the params tree is the default's: the
"gradient" a step takes of it is its new value (training/step.py), never seen by the optimizer.

What is ours, and why:
  - ScaledDot is flax's op, except that without the collection (evaluation, bertjax.load, export: params
    alone) it computes the plain dot in the compute dtype; flax's op fails there. A checkpoint of an fp8
    run thus serves everywhere the default's does.
  - einsum() routes HeadProjection's contractions through the same op as one dot_general, rather than
    flax's Fp8Einsum: jnp.einsum may hand the op the kernel as its left operand, whose scale flax then
    keeps as the input's, and Fp8Einsum has no form without the collection.
  - Layers narrower than MIN_FEATURES (the NSP head, task classifiers, ELECTRA's predictor) stay in the
    compute dtype: their few logits are where quantization error costs most, and a GEMM that narrow gains
    nothing from FP8.
"""

from flax.linen import fp8_ops
from jax import lax

COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT  # the scaling state's variable collection
MIN_FEATURES = 16  # narrower outputs stay in the compute dtype (see the module docstring)


class ScaledDot(fp8_ops.Fp8DirectDotGeneralOp):
    """lax.dot_general's signature, in FP8 with delayed scaling; the plain dot where the collection is
    absent and immutable (the model applied with params alone)."""

    def _scaled(self) -> bool:
        return self.is_mutable_collection(COLLECTION) or self.has_variable(COLLECTION, "input_scale")

    def setup(self):
        if self._scaled():  # otherwise flax's setup would ask for variables that are not there
            super().setup()
        elif self.is_mutable_collection("params"):  # being created where a lifted transform drops the state
            raise ValueError("model.matmul_dtype=fp8: nn.scan over the layers does not carry the fp8 scaling "
                             "state: set model.scan_layers=False")

    def __call__(self, x, kernel, dimension_numbers, precision=None, preferred_element_type=None):
        if not self._scaled():
            return lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type)
        # flax's op sets its own precision and returns the compute dtype (x's, after it casts x to the kernel's).
        return super().__call__(x, kernel, dimension_numbers)


def dot_general_cls(cfg, features: int):
    """nn.Dense's dot_general_cls for a layer of `features` outputs: ScaledDot under
    model.matmul_dtype="fp8" (from MIN_FEATURES outputs up), else None (nn.Dense's own dot)."""
    if getattr(cfg, "matmul_dtype", "default") == "fp8" and features >= MIN_FEATURES:
        return ScaledDot
    return None


def einsum(equation: str, x, kernel):
    """jnp.einsum(equation, x, kernel) through ScaledDot, for contractions of x's trailing axes with the
    kernel's leading ones, the output x's other axes then the kernel's: "bsh,hnd->bsnd", "bsnd,ndh->bsh".
    Call it inside a compact module (it declares a ScaledDot there)."""
    inputs, out = equation.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    contracted = "".join(c for c in lhs if c in rhs)
    k = len(contracted)
    if not (k and lhs.endswith(contracted) and rhs.startswith(contracted) and out == lhs[:-k] + rhs[k:]):
        raise ValueError(f"fp8.einsum({equation!r}): only x's trailing axes against the kernel's leading ones "
                         "(as 'bsh,hnd->bsnd'); set model.matmul_dtype=default for this layer's equation")
    dims = ((tuple(range(x.ndim - k, x.ndim)), tuple(range(k))), ((), ()))
    return ScaledDot()(x, kernel, dims)


def variables(params) -> dict:
    """The variables net.apply takes from what a step differentiates: params alone, or in an fp8 run
    {"params": ..., COLLECTION: ...} (flax's convention, as flax.training.train_state keeps them)."""
    return params if COLLECTION in params else {"params": params}
