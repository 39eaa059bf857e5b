"""The table-driven conversion between a family's Hugging Face state dict and bertjax params, both ways.

`to_params` and `to_state` run any family's table (hf_family.Family): the table for a config ({i} over
the parameter groups, rows whose path the config lacks left out), every tensor's shape checked against
the model's own (jax.eval_shape), dtypes, the tied copies, fresh values for what a checkpoint lacks (the
pooler and heads of a bare encoder, a task's new classifier), and the scanned layout at the edges (the
table speaks of layers_0 ... layers_{L-1}). Everything else here is private: bertjax.interop.hf is the
public API.
"""

import contextlib
import dataclasses
import logging
from typing import Any

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
from flax import traverse_util

from bertjax.compression import pruning
from bertjax.interop.hf_family import Family
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models import heads

log = logging.getLogger(__name__)

# bertjax params a pretraining checkpoint may lack (a bare encoder's, possibly without a pooler), and
# those of a task head: freshly initialised instead. Everything else must be in the checkpoint.
_OPTIONAL = ("bert/pooler", "mlm_head/", "nsp_head/")
_OPTIONAL_IN_A_HEAD = ("bert/pooler", "classifier/")


def to_params(family: Family, state: dict[str, np.ndarray], cfg: BertConfig, seed: int = 0,
              kind: str | None = None, num_labels: int | None = None):
    """A family's HF state dict -> (params, missing): BertForPreTraining's (kind None) or the `kind`
    head's, plain and in cfg.param_dtype, in the layout cfg.scan_layers asks for. missing: the param
    paths the state dict lacks, freshly initialised from `seed`."""
    shapes = _param_shapes(cfg, kind, num_labels)
    state = family.to_table(dict(state), cfg)
    names = _canonical(family, state)
    rows = _rows(family, cfg, shapes, kind, reading=True)
    flat, used = _converted_rows(state, names, rows, shapes, np.dtype(cfg.param_dtype))
    if kind is None:  # a head reads no decoder: a pretraining checkpoint's is left
        used |= _checked_tied(family, state, names)
    _report_unused(family, names, used, kind)
    missing = [path for path in shapes if path not in flat]
    _check_required(family, missing, rows, cfg, kind)
    if missing:
        named = {path for _, path, _ in rows}
        expected = [path for path in missing if path not in named]  # the HF class has no such tensor
        if expected:
            log.info("no %s tensor, freshly initialised: %s", family.name, expected)
        if len(expected) < len(missing):
            log.warning("not in the checkpoint, freshly initialised: %s", [p for p in missing if p in named])
        flat.update(_fresh_params(cfg, missing, seed, kind, num_labels))
    params = _unflatten(flat)
    return (_stack(params, cfg) if cfg.scan_layers else params), missing


def to_state(family: Family, params: dict, cfg: BertConfig, kind: str | None = None,
             encoder_only: bool = False) -> dict:
    """bertjax params (boxed or plain, unrolled or scanned; BertForPreTraining's, or the `kind` head's)
    -> the family's HF state dict. Params its class has no name for are left out where the class lacks
    them (the pooler and NSP head of a masked-LM class, the pooler of a per-token class); tied copies are
    not written, as transformers' own save_pretrained does. encoder_only: the encoder's tensors alone
    (those under the family's base prefix), from params that may have no pretraining heads (an embedder's)."""
    params = nn.meta.unbox(params)
    params = params.get("params", params)  # a whole variables dict
    # Pruned heads (model.layer_heads): no transformers class has pruned_heads, so they are written at
    # full shapes, the removed heads all zeros: the same outputs.
    cfg, params = pruning.with_all_heads(params, cfg)
    encoder = params["bert"]["encoder"]
    if "layers" in encoder:  # scanned layout: back to layers_0 ... layers_{L-1}
        encoder = bert_model.unstack_layers(encoder, cfg)
        params = {**params, "bert": {**params["bert"], "encoder": encoder}}
    flat = _flatten(params)
    num_labels = None if kind is None else _classifier_width(flat, kind)
    shapes = _param_shapes(cfg, kind, num_labels)
    rows = _rows(family, cfg, shapes, kind)
    if encoder_only:
        rows = [row for row in rows if row[0].startswith(family.base)]
    droppable = _OPTIONAL if kind is None else ("bert/pooler",)
    unmapped = sorted(path for path in set(flat) - {path for _, path, _ in rows} if not path.startswith(droppable))
    if unmapped:
        what = family.architecture if kind is None else family.task_classes[kind].architecture
        raise ValueError(f"bertjax params with no name in {what}: {unmapped}")
    state = {}
    for hf_name, path, transform in rows:
        if path not in flat:
            raise ValueError(f"bertjax param {path} is missing from the params being exported")
        p = np.asarray(flat[path])
        if tuple(p.shape) != shapes[path]:
            raise ValueError(f"bertjax param {path}: the config implies shape {shapes[path]}, found {tuple(p.shape)}")
        state[hf_name] = np.ascontiguousarray(transform.to_hf(p))  # contiguous: safetensors writes the buffer
    return family.from_table(state, cfg)


# --------------------------------------------------------------------------------------------------
# The table for a config
# --------------------------------------------------------------------------------------------------


def _rows(family: Family, cfg: BertConfig, shapes: dict, kind: str | None = None,
          reading: bool = False) -> list:
    """The family's table for this config: {i} over the parameter groups, {j} over a MobileBERT layer's
    extra feed-forward networks, rows the config lacks left out.
    With a task kind: the encoder's rows and the rows of the kind's class's head; `reading`, the
    pretraining class's pooler too where the task class has none (a fine-tuning start may use it)."""
    table = family.table
    if kind is not None:
        task = family.task_class(kind, cfg)
        pretraining_pooler = reading and not task.pooler
        encoder = tuple(row for row in table if row[1].startswith("bert/")
                        and (pretraining_pooler or not row[1].startswith("bert/pooler")))
        table = encoder + task.rows
    rows = []
    for hf_name, path, transform in table:
        groups = range(cfg.num_groups) if "{i}" in hf_name else [None]
        extra = range(cfg.num_feedforward_networks - 1) if "{j}" in hf_name else [None]
        rows += [(hf_name.format(i=i, j=j), path.format(i=i, j=j), transform) for i in groups for j in extra]
    return [row for row in rows if row[1] in shapes]


def _canonical(family: Family, state: dict) -> dict[str, str]:
    """Canonical name -> the checkpoint's: a bare encoder's tensors (BertModel, RobertaModel, ...) get the
    class's prefix."""
    names = {}
    outside = (family.base,) + family.heads + family.task_prefixes
    for name in state:
        new = name if name.startswith(outside) else family.base + name
        if new in names:
            raise ValueError(f"HF tensors {names[new]!r} and {name!r} are the same parameter under two names")
        names[new] = name
    return names


def _unrolled(cfg: BertConfig) -> BertConfig:
    return dataclasses.replace(cfg, scan_layers=False)


def _network(cfg: BertConfig, kind: str | None, num_labels: int | None):
    """(module, dummy inputs): BertForPreTraining, or the task head of `kind` (heads.HEADS)."""
    if kind is None:
        return bert_model.BertForPreTraining(_unrolled(cfg)), bert_model.dummy_batch(1, 1, 1)
    return heads.network(kind, _unrolled(cfg), num_labels), heads.dummy_inputs(kind)


def _param_shapes(cfg: BertConfig, kind: str | None = None,
                  num_labels: int | None = None) -> dict[str, tuple]:
    """bertjax param path -> shape, from the model itself (eval_shape: no memory, no FLOPs)."""
    module, inputs = _network(cfg, kind, num_labels)
    with _on_host():
        variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), **inputs)
        flat = _flatten(nn.meta.unbox(variables["params"]))
    return {path: tuple(x.shape) for path, x in flat.items()}


def _flatten(tree: dict) -> dict[str, Any]:
    """{"bert": {"pooler": {"kernel": x}}} -> {"bert/pooler/kernel": x}."""
    return traverse_util.flatten_dict(tree, sep="/")


def _unflatten(flat: dict[str, Any]) -> dict:
    return traverse_util.unflatten_dict(flat, sep="/")


def _classifier_width(flat: dict, kind: str) -> int:
    if "classifier/bias" not in flat:
        raise ValueError(f"the params have no classifier: they are not a {kind!r} head's (bertjax.models.heads)")
    return int(np.shape(flat["classifier/bias"])[0])


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def _check_float(name: str, x: np.ndarray):
    if not (x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16):
        raise ValueError(f"HF tensor {name!r} has dtype {x.dtype}, expected a floating-point tensor")


def _converted_rows(state: dict[str, np.ndarray], names: dict[str, str], rows, shapes: dict, param_dtype):
    """The rows the checkpoint has, in bertjax's layout and param_dtype (path -> array), and the canonical
    HF names they used; each tensor's shape is checked against the config's."""
    flat: dict[str, np.ndarray] = {}
    used = set()
    for hf_name, path, transform in rows:
        if hf_name not in names:
            continue
        source = names[hf_name]
        x = state[source]
        expected = transform.hf_shape(shapes[path])
        if tuple(x.shape) != expected:
            raise ValueError(
                f"HF tensor {source!r}: the config implies shape {expected}, the checkpoint has {tuple(x.shape)}"
            )
        _check_float(source, x)
        # np.array copies: the result owns its memory (not a view into a file buffer) in param_dtype.
        flat[path] = np.array(transform.to_bertjax(np.asarray(x), shapes[path]), dtype=param_dtype)
        used.add(hf_name)
    return flat, used


def _checked_tied(family: Family, state: dict[str, np.ndarray], names: dict[str, str]) -> set[str]:
    """The tied decoder tensors the checkpoint has, each checked equal to the tensor bertjax ties it to."""
    used = set()
    for tied, source in family.tied.items():
        if tied in names:
            x, y = state[names[tied]], state.get(names.get(source, ""))
            if y is None or x.shape != y.shape or not np.array_equal(x, y):
                raise ValueError(f"HF tensor {names[tied]!r} differs from {source!r}: bertjax ties the masked-LM "
                                 "decoder to the word embeddings, so an untied checkpoint cannot be loaded exactly")
            used.add(tied)
    return used


def _report_unused(family: Family, names: dict[str, str], used: set[str], kind: str | None):
    """Logs the checkpoint's tensors the network does not have (the torch module's *_ids buffers aside)."""
    unused = sorted(names[n] for n in names if n not in used and not n.endswith("_ids"))
    if kind is not None and unused and all(n.startswith(family.heads) for n in unused):
        log.info("not used by a %r head: the pretraining heads %s", kind, unused)  # fine-tuning replaces them
    elif unused:
        # E.g. the classifier of a fine-tuned task class: not part of pretraining.
        what = family.architecture if kind is None else family.task_classes[kind].architecture
        log.warning("ignoring %d tensor(s) that %s has no place for: %s", len(unused), what, unused)


def _check_required(family: Family, missing: list[str], rows, cfg: BertConfig, kind: str | None):
    """Only the pooler and the heads may be absent (and freshly initialised); an encoder tensor may not."""
    optional = _OPTIONAL if kind is None else _OPTIONAL_IN_A_HEAD
    required = [path for path in missing if not path.startswith(optional)]
    if required:
        hf_names = {path: hf_name for hf_name, path, _ in rows}
        example = hf_names.get(required[0], required[0])
        raise ValueError(f"the checkpoint lacks {len(required)} encoder tensor(s), e.g. {example!r} (for "
                         f"{required[0]}): is it a {family.name} checkpoint with num_hidden_layers={cfg.num_layers}?")


@contextlib.contextmanager
def _on_host():
    """Where host-side jax work goes (shapes, fresh leaves, stacking): the CPU device where the CPU
    backend exists (it may be switched off with JAX_PLATFORMS), and no mesh nor logical axis rules, so
    that a caller's training mesh (continued pretraining converts inside it) cannot reach these
    single-device computations."""
    try:
        device = jax.default_device(jax.devices("cpu")[0])
    except RuntimeError:
        device = contextlib.nullcontext()
    with device, jax.set_mesh(None), nn.logical_axis_rules(()):
        yield


def _fresh_params(cfg: BertConfig, paths: list[str], seed: int, kind: str | None = None,
                  num_labels: int | None = None) -> dict[str, np.ndarray]:
    """Fresh values for the given param paths, as the network's init would draw them."""
    module, inputs = _network(cfg, kind, num_labels)

    def init(key):
        flat = _flatten(nn.meta.unbox(module.init(key, **inputs)["params"]))
        # Returning only the wanted leaves lets XLA drop the initialisation of everything else (the
        # encoder, which the checkpoint did provide).
        return {path: flat[path] for path in paths}

    with _on_host():
        fresh = jax.jit(init)(jax.random.PRNGKey(seed))
    return {path: np.asarray(x) for path, x in fresh.items()}


def _stack(params: dict, cfg: BertConfig) -> dict:
    # Stacked on the host: the result is a host tree like the unrolled one, whatever the default device.
    with _on_host():
        encoder = bert_model.stack_layers(params["bert"]["encoder"], cfg)
        encoder = jax.tree_util.tree_map(np.asarray, encoder)
    return {**params, "bert": {**params["bert"], "encoder": encoder}}
