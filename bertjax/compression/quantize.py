"""Post-training quantisation of a trained or fine-tuned encoder for inference (int8, and group-wise
int4 / int8), with qwix.

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
(models/layers.py, models/attention.py), so the network code is unchanged. The attention's own products (q k^T, the
probabilities times v) and the masked-LM decoder are left float: their "weights" are activations or
the embeddings.

Stored form: a plain nested dict of arrays, each quantised kernel replaced by {"qvalue": int8 [kernel
shape], "scale": float32 [kernel shape with 1 on the contracted axes]}, each embedding table by
{"qrows": int8 [V, E], "row_scale": float32 [V, 1]}; everything else as it was. This is what
LoadedBert.params holds, what a params export writes and what a SavedModel keeps as variables;
`network` turns a flax module into one that applies those params.

Group-wise low bits (Q-BERT's group-wise quantisation, Shen et al. 2020): `int4-gG` and `int8-gG` (e.g.
int4-g128, int4-g32, int8-g128) give each dense kernel one scale per group of G consecutive input
elements per output channel (the contracted axes read flattened, row-major, as the matmul reads them:
the attention output's [N, D, H] kernel groups G of its N x D inputs, spanning heads where G > D; an
input narrower than G is one group; inputs that do not split into groups of G take the largest smaller
group that does). Symmetric, qwix's bound (qmax + 0.5: 7.5 for int4, 127.5 for int8),
round to nearest, clipped to [-8, 7] or [-128, 127]. The group scales are qwix's sub-channel scales
(HowToQuantize.tiled_axes), chosen per kernel rather than by a rule's tile_size, which names one tile
for the last contracted axis of every layer and so cannot group the attention output's heads together
nor fit a kernel narrower than G. int4 values are stored two to a byte ({"qpacked": uint8 [kernel shape
with the last axis halved, rounded up], "scale"}): qwix's int4 arrays hold one value per byte in numpy
and in a .npz, as large as int8. The last axis of every kernel is an output channel, so the scale's last
axis gives the unpacked length. These modes are weight-only (the kernels are unpacked and turned back
into float inside the compiled function, which is the path qwix takes for sub-channel scales of float
inputs anyway); the embedding tables stay int8 per row, as in the int8 modes.
"""

import dataclasses
import math
import re

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
GROUPED = re.compile(r"int(4|8)-g([0-9]+)")  # int4-g128: int4 weights, a scale per 128 input elements
# A precision chosen per encoder layer on a dev set (bertjax/runs/precision_plan.py): its params say which
# (each kernel stored as int8 or packed int4), so it is read back, never made, by this name.
MIXED = "mixed"

# Module paths whose matmuls stay float: the attention's q k^T and probabilities x v (in the attention
# module itself, not its query/key/value/output projections), the masked-LM decoder (the word
# embeddings, in mlm_head itself, not its transform), and the embeddings (the one-hot lookup).
_FLOAT_MODULES = r"(?!(.*/)?(attention|mlm_head|embeddings)$).*"
_STORED_KEYS = frozenset({"qvalue", "scale"})
_PACKED_KEYS = frozenset({"qpacked", "scale"})  # int4, two values a byte
_TABLE_KEYS = frozenset({"qrows", "row_scale"})
# Per row (token) of a [V, E] table: the scale keeps axis 0.
_PER_ROW = qarray.HowToQuantize(qtype=jnp.int8, channelwise_axes=[0], tiled_axes={}, calibration_method="absmax")


@dataclasses.dataclass(frozen=True)
class Scheme:
    """What a mode does to the dense kernels: their bits, the input elements per scale (None: one scale
    per output channel) and whether the inputs are quantised too."""

    bits: int
    group: int | None
    dynamic: bool

    @property
    def qtype(self):
        return jnp.int4 if self.bits == 4 else jnp.int8


def resolve(mode: str | None) -> str | None:
    """The concrete mode ("int8" is the default one), or None for float; one line for an unknown mode."""
    if mode is None:
        return None
    grouped = GROUPED.fullmatch(mode)
    if mode not in (*MODES, MIXED) and not (grouped and int(grouped.group(2)) >= 2):
        raise ValueError(f"quantize={mode!r}: choose one of {', '.join(MODES)}, or int4-gG / int8-gG (a scale per G "
                         "input elements, G >= 2: int4-g128, int4-g32, int8-g128) (or none for float32)")
    return DEFAULT if mode == "int8" else mode


def scheme(mode: str) -> Scheme:
    """The Scheme of a mode (resolve's spellings)."""
    mode = resolve(mode)
    grouped = GROUPED.fullmatch(mode)
    if grouped:
        return Scheme(int(grouped.group(1)), int(grouped.group(2)), False)
    if mode == MIXED:  # its kernels carry their own bits and groups; the rules only need some weight type
        return Scheme(8, 0, False)
    return Scheme(8, None, mode == DYNAMIC)


def describe(mode: str) -> str:
    """A mode in words, for model cards."""
    if resolve(mode) == MIXED:
        return "int4 or int8 as a plan measured on the dev set chose per encoder layer, with float32 group scales"
    s = scheme(mode)
    per = f"per group of {s.group} input elements per output channel" if s.group else "per output channel"
    return f"int{s.bits} with a float32 scale {per}"


def same_weights(stored: str, wanted: str) -> bool:
    """Whether params stored by mode `stored` run in mode `wanted`: the per-channel int8 modes share their
    weights (only the inputs differ); a grouped mode's weights are its own."""
    a, b = scheme(stored), scheme(wanted)
    return (a.bits, a.group) == (b.bits, b.group)


def mix(low: dict, high: dict, layers) -> dict:
    """Stored params of one network quantised two ways -> the encoder layers named in `layers`
    ("layers_3", ...) from `high`, the other layers from `low`, everything else (embeddings, pooler,
    heads: small, and read by every token) from `high`."""
    encoder = {name: (high if name in layers or not name.startswith("layers_") else low)["bert"]["encoder"][name]
               for name in high["bert"]["encoder"]}
    return {**high, "bert": {**high["bert"], "encoder": encoder}}


def rules(mode: str) -> list:
    """qwix's rules for a mode: quantised weights everywhere but _FLOAT_MODULES, int8 inputs in int8-dynamic.
    (Grouped modes tile each kernel in `grouped`, not here: see the module docstring.)"""
    s = scheme(mode)
    activations = jnp.int8 if s.dynamic else None
    return [qwix.QuantizationRule(module_path=_FLOAT_MODULES, weight_qtype=s.qtype, act_qtype=activations,
                                  weight_calibration_method="absmax")]


class QuantizedNetwork:
    """A flax module run with quantised kernels: `apply({"params": stored}, ...)` as the module's own apply,
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
    """Float params of `module` -> the stored quantised form (see the module docstring). init_args: inputs of
    any shape the module takes (the kernels' shapes do not depend on them). params may be a part of the
    module's tree (a missing head stays missing)."""
    abstract = QuantizedNetwork(module, mode).abstract_params(*init_args)
    group = scheme(mode).group
    if group:
        abstract = grouped(abstract, group)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    # One compiled function for the whole tree: run op by op, each kernel shape compiles its own dozen.
    return jax.jit(lambda tree: quantize_tables(to_stored(qwix.quantize_params(tree, abstract))))(params)


def group_tiles(shape: tuple, contracted: list[int], group: int) -> dict[int, int] | None:
    """qwix's tiled_axes for groups of `group` consecutive elements of the contracted axes read flattened
    (row-major): the last axes whole while the group spans them, then a divisor of the next, then tiles
    of 1. None where no such tiling exists (a group that does not fit the axes' sizes)."""
    tiles, remaining = {}, group
    for axis in reversed(contracted):
        size = shape[axis]
        if remaining >= size:
            if remaining % size:
                return None
            tiles[axis], remaining = size, remaining // size
        else:
            if size % remaining:
                return None
            tiles[axis], remaining = remaining, 1
    return tiles


def grouped(abstract: dict, group: int) -> dict:
    """qwix's abstract params with each kernel's scales tiled in groups of `group` input elements (fewer
    where the kernel's inputs are fewer: one group). A kernel whose inputs do not split into groups of
    `group` takes the largest smaller group that splits them (96 for 192 inputs at G = 128): finer, never
    coarser, than asked; smaller_groups lists them."""
    def tile(path, leaf):
        if not isinstance(leaf, ptq.WithAux):
            return leaf
        shape, how = tuple(leaf.shape), leaf.how
        contracted = [axis for axis in range(len(shape)) if axis not in how.channelwise_axes]
        width = math.prod(shape[axis] for axis in contracted)
        # The largest size up to G that tiles the inputs (size 1 always does: a scale per input element).
        tiles = next(t for t in map(lambda size: group_tiles(shape, contracted, size), range(min(group, width), 0, -1))
                     if t is not None)
        return leaf.replace(how=dataclasses.replace(how, tiled_axes=tiles))

    return jax.tree_util.tree_map_with_path(tile, abstract, is_leaf=lambda x: isinstance(x, ptq.WithAux))


def smaller_groups(stored: dict, group: int) -> list[tuple[str, int]]:
    """(kernel path, group size) of each stored kernel of a grouped mode whose groups are smaller than
    `group` while its inputs are more: those grouped() gave the largest size that splits them. A group
    is the product over the axes of kernel size / scale size (the output channels' ratio is 1; the last
    axis, packed or not, is an output channel)."""
    found = []

    def visit(path, tree):
        if not isinstance(tree, dict):
            return
        if set(tree) in (_STORED_KEYS, _PACKED_KEYS):
            kernel = tree.get("qvalue", tree.get("qpacked"))
            pairs = [(int(n), int(k)) for n, k in zip(kernel.shape[:-1], tree["scale"].shape[:-1])]
            size = math.prod(n // k for n, k in pairs)
            # The contracted axes lead (every kernel here is [inputs..., outputs...]): through the last one the
            # scale tiles, axis 0 at least. A contracted axis in tiles of 1 keeps its size in the scale.
            contracted = 1 + max([a for a, (n, k) in enumerate(pairs) if k < n], default=0)
            inputs = math.prod(n for n, _ in pairs[:contracted])
            if size < group and size < inputs:
                found.append(("/".join(path), size))
            return
        for key, value in tree.items():
            visit(path + [str(key)], value)

    visit([], stored)
    return found


def pack_int4(values) -> jax.Array:
    """int4 values [..., n] -> uint8 [..., ceil(n / 2)]: element 2i in the low nibble, 2i + 1 in the high."""
    values = jnp.asarray(values).astype(jnp.int8)
    if values.shape[-1] % 2:
        values = jnp.pad(values, [(0, 0)] * (values.ndim - 1) + [(0, 1)])
    nibbles = jax.lax.bitcast_convert_type(values, jnp.uint8) & 0xF
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed, n: int) -> jax.Array:
    """pack_int4's inverse: uint8 [..., m] -> int8 values in [-8, 7], [..., n]."""
    packed = jnp.asarray(packed)
    nibbles = jnp.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :n]
    values = nibbles.astype(jnp.int8)
    return jnp.where(values >= 8, values - 16, values)


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
        if not isinstance(leaf, ptq.WithAux):
            return leaf
        array = leaf.array
        if jnp.dtype(array.qvalue.dtype) == jnp.dtype(jnp.int4):
            if len(array.shape) - 1 not in leaf.how.channelwise_axes:  # the unpacked length is read off the scale
                raise ValueError(f"int4 packing needs the kernel's last axis to be an output channel, not {leaf.how}")
            return {"qpacked": pack_int4(array.qvalue), "scale": array.scale}
        return {"qvalue": array.qvalue, "scale": array.scale}

    return jax.tree_util.tree_map(plain, quantized, is_leaf=lambda x: isinstance(x, ptq.WithAux))


def from_stored(stored: dict) -> dict:
    """The stored form -> qwix's params: each {"qvalue", "scale"} becomes the quantised kernel it holds.
    Works under jit and on any subtree (the encoder's alone)."""
    if not isinstance(stored, dict):
        return stored
    if set(stored) == _TABLE_KEYS:  # a table, dequantised here (in a compiled function: at the rows gathered)
        return qarray.dequantize(qarray.QArray(qvalue=stored["qrows"], scale=stored["row_scale"], qtype=jnp.int8))
    if set(stored) in (_STORED_KEYS, _PACKED_KEYS):
        scale = stored["scale"]
        if "qpacked" in stored:
            qvalue, qtype = unpack_int4(stored["qpacked"], scale.shape[-1]), jnp.int4
        else:
            qvalue, qtype = stored["qvalue"], jnp.int8
        # The output channels are the axes the scale keeps whole, the groups those it tiles; qwix reads
        # nothing else of `how` at apply (the scale's shape says how to broadcast it).
        channels = [axis for axis, size in enumerate(scale.shape) if size == qvalue.shape[axis]]
        tiles = {axis: qvalue.shape[axis] // size for axis, size in enumerate(scale.shape)
                 if 1 < size < qvalue.shape[axis]}
        how = qarray.HowToQuantize(qtype=qtype, channelwise_axes=channels, tiled_axes=tiles,
                                   calibration_method="absmax")
        return ptq.WithAux(qarray.QArray(qvalue=qvalue, scale=scale, qtype=qtype), how)
    return {key: from_stored(value) for key, value in stored.items()}


@jax.jit
def dequantized(stored: dict) -> dict:
    """The stored form -> float params: each kernel and table q x scale, what a weight-only network
    multiplies by (the float network on these computes what it computes, to float32 rounding)."""
    return jax.tree_util.tree_map(lambda leaf: qarray.dequantize(leaf.array) if isinstance(leaf, ptq.WithAux) else leaf,
                                  from_stored(stored), is_leaf=lambda leaf: isinstance(leaf, ptq.WithAux))


def is_stored(params: dict) -> bool:
    """Whether params hold quantised kernels or tables in the stored form."""
    def walk(tree):
        if not isinstance(tree, dict):
            return False
        return set(tree) in (_STORED_KEYS, _PACKED_KEYS, _TABLE_KEYS) or any(walk(v) for v in tree.values())

    return walk(params)


def parameter_count(params: dict) -> int:
    """The network's parameters: a quantised kernel or table counts its int8 values, not its scales."""
    if isinstance(params, dict):
        if set(params) == _STORED_KEYS:
            return int(np.size(params["qvalue"]))
        if set(params) == _PACKED_KEYS:  # two values a byte; the scale's last axis is the kernel's
            return int(np.prod(np.shape(params["qpacked"])[:-1])) * int(np.shape(params["scale"])[-1])
        if set(params) == _TABLE_KEYS:
            return int(np.size(params["qrows"]))
        return sum(parameter_count(value) for value in params.values())
    return int(np.size(params))


def weight_bytes(params: dict, kernels_only: bool = False) -> int:
    """Bytes of the arrays as held: what a params export writes, less the file's headers. kernels_only:
    the dense layers' kernels alone (int8 or packed int4 values and their scales, or float32)."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not kernels_only or "kernel" in [getattr(entry, "key", None) for entry in path]:
            total += np.asarray(leaf).nbytes
    return int(total)


def quantize_model(config, params: dict, task, mode: str):
    """A loaded model's (config, float params) -> (config, stored quantised params): the task network's
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
