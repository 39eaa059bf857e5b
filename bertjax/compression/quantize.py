"""int8 post-training quantisation of a trained or fine-tuned encoder for inference, with qwix.

Every dense layer's kernel (attention query/key/value/output, the feed-forward pair, the pooler, the
pretraining and task heads) is stored as int8 with one float32 scale per output channel (symmetric:
scale = max |w| over the contracted axes / 127.5, qwix's int8 bound; q = round(w / scale)). The
embedding tables (word, position, segment) are stored as int8 too, with one scale per row (per token),
quantised by the same qwix function; they are looked up, not multiplied, so they are turned back into
float inside the compiled function, where XLA computes only the rows a batch gathers. (The masked-LM
decoder, which multiplies by the word embeddings, reads them dequantised.) Two modes:

  int8-weights  weight-only: the activations stay float; the int8 kernel is turned back into float
                (q x scale) inside the compiled function, where XLA fuses it into the matmul.
  int8-dynamic  the input of each dense layer is also quantised to int8 at run time, one scale per
                token (dynamic, per-token symmetric), and the matmul runs int8 x int8 -> int32.
  int8          the default: DEFAULT below, chosen by what measured faster on CPU at the same
                accuracy (docs/performance.md, "int8 quantisation").

qwix intercepts the jnp.einsum / lax.dot_general calls of the flax linen modules as they are written
(models/layers.py), so the network code is unchanged. The attention's own products (q k^T, the
probabilities times v) and the masked-LM decoder are left float: their "weights" are activations or
the embeddings.

Stored form: a plain nested dict of arrays, each quantised kernel replaced by {"qvalue": int8 [kernel
shape], "scale": float32 [kernel shape with 1 on the contracted axes]}, each embedding table by
{"qrows": int8 [V, E], "row_scale": float32 [V, 1]}; everything else as it was. This is what
LoadedBert.params holds, what a params export writes and what a SavedModel keeps as variables;
`network` turns a flax module into one that applies those params.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import qwix
# qwix's param wrappers (WithAux, HowToQuantize) are not exported at its top level.
from qwix._src.core import qarray
from qwix._src.providers import ptq

from bertjax.models import bert as bert_model
from bertjax.models import heads
from bertjax.tasks import kinds

WEIGHTS, DYNAMIC = "int8-weights", "int8-dynamic"
DEFAULT = DYNAMIC  # faster than weight-only on CPU, as accurate (docs/performance.md)
MODES = ("int8", WEIGHTS, DYNAMIC)

# Module paths whose matmuls stay float: the attention's q k^T and probabilities x v (in the attention
# module itself, not its query/key/value/output projections), the masked-LM decoder (the word
# embeddings, in mlm_head itself, not its transform), and the embeddings (the one-hot lookup).
_FLOAT_MODULES = r"(?!(.*/)?(attention|mlm_head|embeddings)$).*"
_STORED_KEYS = frozenset({"qvalue", "scale"})
_TABLE_KEYS = frozenset({"qrows", "row_scale"})
# Per row (token) of a [V, E] table: the scale keeps axis 0.
_PER_ROW = qarray.HowToQuantize(qtype=jnp.int8, channelwise_axes=[0], tiled_axes={}, calibration_method="absmax")


def resolve(mode: str | None) -> str | None:
    """The concrete mode ("int8" is the default one), or None for float; one line for an unknown mode."""
    if mode is None:
        return None
    if mode not in MODES:
        raise ValueError(f"quantize={mode!r}: choose one of {', '.join(MODES)} (or none for float32)")
    return DEFAULT if mode == "int8" else mode


def rules(mode: str) -> list:
    """qwix's rules for a mode: int8 weights everywhere but _FLOAT_MODULES, int8 inputs in int8-dynamic."""
    mode = resolve(mode)
    activations = jnp.int8 if mode == DYNAMIC else None
    return [qwix.QuantizationRule(module_path=_FLOAT_MODULES, weight_qtype=jnp.int8, act_qtype=activations,
                                  weight_calibration_method="absmax")]


class QuantizedNetwork:
    """A flax module run with int8 kernels: `apply({"params": stored}, ...)` as the module's own apply,
    its params in the stored form (see the module docstring)."""

    def __init__(self, module: nn.Module, mode: str):
        self.module, self.mode = module, resolve(mode)
        self._quantized = qwix.quantize_model(module, qwix.PtqProvider(rules(self.mode)))

    def apply(self, variables: dict, *args, **kwargs):
        return self._quantized.apply({"params": from_stored(variables["params"])}, *args, **kwargs)

    def abstract_params(self, *init_args):
        """The quantised params' shapes (qwix's tree, how each kernel is quantised) for these inputs."""
        shapes = jax.eval_shape(lambda: self._quantized.init(jax.random.key(0), *init_args)["params"])
        return nn.unbox(shapes)


def network(module: nn.Module, mode: str | None):
    """`module` itself for float (mode None), else the QuantizedNetwork of the mode."""
    return module if mode is None else QuantizedNetwork(module, mode)


def quantize(module: nn.Module, params: dict, init_args: tuple, mode: str) -> dict:
    """Float params of `module` -> the stored int8 form (see the module docstring). init_args: inputs of
    any shape the module takes (the kernels' shapes do not depend on them). params may be a part of the
    module's tree (a missing head stays missing)."""
    abstract = QuantizedNetwork(module, mode).abstract_params(*init_args)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    quantized = qwix.quantize_params(params, abstract)
    return quantize_tables(to_stored(quantized))


def is_table(path) -> bool:
    """An embedding table: .../embeddings/<word_embeddings | position_embeddings | ...>/embedding."""
    names = [getattr(k, "key", str(k)) for k in path]
    return len(names) >= 3 and names[-1] == "embedding" and names[-3] == "embeddings"


def quantize_tables(params: dict) -> dict:
    """Each embedding table (is_table) -> {"qrows": int8, "row_scale": float32 [V, 1]}, by qwix."""
    def per_row(path, leaf):
        if not is_table(path):
            return leaf
        table = qarray.quantize(jnp.asarray(leaf, jnp.float32), _PER_ROW)
        return {"qrows": table.qvalue, "row_scale": table.scale}

    return jax.tree_util.tree_map_with_path(per_row, params)


def to_stored(quantized: dict) -> dict:
    """qwix's params (kernels as WithAux(QArray)) -> plain nested dicts of arrays."""
    def plain(leaf):
        if isinstance(leaf, ptq.WithAux):
            return {"qvalue": leaf.array.qvalue, "scale": leaf.array.scale}
        return leaf

    return jax.tree_util.tree_map(plain, quantized, is_leaf=lambda x: isinstance(x, ptq.WithAux))


def from_stored(stored: dict) -> dict:
    """The stored form -> qwix's params: each {"qvalue", "scale"} becomes the quantised kernel it holds.
    Works under jit and on any subtree (the encoder's alone)."""
    if not isinstance(stored, dict):
        return stored
    if set(stored) == _TABLE_KEYS:  # a table, dequantised here (in a compiled function: at the rows gathered)
        return qarray.dequantize(qarray.QArray(qvalue=stored["qrows"], scale=stored["row_scale"], qtype=jnp.int8))
    if set(stored) == _STORED_KEYS:
        qvalue, scale = stored["qvalue"], stored["scale"]
        # The output channels are the axes the scale keeps; qwix reads nothing else of `how` at apply.
        channels = [axis for axis, size in enumerate(scale.shape) if size != 1 or qvalue.shape[axis] == 1]
        how = qarray.HowToQuantize(qtype=jnp.int8, channelwise_axes=channels, tiled_axes={},
                                   calibration_method="absmax")
        return ptq.WithAux(qarray.QArray(qvalue=qvalue, scale=scale, qtype=jnp.int8), how)
    return {key: from_stored(value) for key, value in stored.items()}


def is_stored(params: dict) -> bool:
    """Whether params hold int8 kernels or tables in the stored form."""
    def walk(tree):
        if not isinstance(tree, dict):
            return False
        return set(tree) in (_STORED_KEYS, _TABLE_KEYS) or any(walk(v) for v in tree.values())

    return walk(params)


def parameter_count(params: dict) -> int:
    """The network's parameters: a quantised kernel or table counts its int8 values, not its scales."""
    if isinstance(params, dict):
        if set(params) == _STORED_KEYS:
            return int(np.size(params["qvalue"]))
        if set(params) == _TABLE_KEYS:
            return int(np.size(params["qrows"]))
        return sum(parameter_count(value) for value in params.values())
    return int(np.size(params))


def weight_bytes(params: dict, kernels_only: bool = False) -> int:
    """Bytes of the arrays as held: what a params export writes, less the file's headers. kernels_only:
    the dense layers' kernels alone (int8 values and scales, or float32)."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not kernels_only or "kernel" in [getattr(entry, "key", None) for entry in path]:
            total += np.asarray(leaf).nbytes
    return int(total)


def quantize_model(config, params: dict, task, mode: str):
    """A loaded model's (config, float params) -> (config, stored int8 params): the task network's
    params for a fine-tuned model (task: its checkpoint's task record), else BertForPreTraining's (the
    heads it has). A scanned encoder is unrolled first: its params are then one kernel per layer, each
    with its own scales, as the unrolled network reads them."""
    if config.scan_layers:
        params = {**params, "bert": {**params["bert"],
                                     "encoder": bert_model.unstack_layers(params["bert"]["encoder"], config)}}
        config = dataclasses.replace(config, scan_layers=False)
    if task is None:
        module = bert_model.BertForPreTraining(config)
        batch = bert_model.dummy_batch(1, 2, 1)
        init_args = (batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["masked_lm_positions"])
    else:
        if task.feature_based:
            raise ValueError("quantize: the feature-based tagger (a BiLSTM on frozen features) is not quantised; "
                             "load it without quantize")
        num_labels = kinds.get(task.kind).num_labels(task.labels)
        module = heads.network(task.kind, config, num_labels)
        inputs = heads.dummy_inputs(task.kind, 1, 2, int(task.num_choices or 1))
        init_args = (inputs["input_ids"], inputs["segment_ids"], inputs["input_mask"])
    return config, quantize(module, params, init_args, mode)
