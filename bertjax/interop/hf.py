"""Hugging Face BERT checkpoints <-> bertjax params, in both directions, without torch or transformers.

The whole correspondence is one table, `TABLE`: a row per Hugging Face tensor name, the bertjax param
path it becomes and the transform between the two layouts. Both directions and the shape checks are
driven by that table, so a name added or fixed there is right everywhere at once.

Layouts differ in two ways only:
  * torch.nn.Linear stores weight [out, in] and computes x @ W.T; flax Dense stores kernel [in, out].
  * bertjax keeps the attention heads as their own axes (DenseGeneral kernels [H, N, D] and [N, D, H]),
    so that the "heads" axis can be sharded; Hugging Face concatenates them head-major into one H-wide
    axis (its view(B, S, N, D) after the projection), which is a plain reshape of ours.
Both are exact (transposes and reshapes), so HF -> bertjax -> HF is bit-exact.

The task heads of bertjax/heads.py map to the matching transformers classes (BertForSequenceClassification,
BertForMultipleChoice, BertForQuestionAnswering, BertForTokenClassification) through the same encoder
rows plus one row pair for the head's dense layer (`HF_HEADS`).

The files of a Hugging Face directory are read and written by bertjax/interop/hf_files.py.

Shape legend (as in bertjax/model.py):
  H hidden size   N attention heads   D head size H/N   F feed-forward size   V vocabulary   L layers
  T segment (token type) vocabulary
"""

import contextlib
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
from flax import traverse_util

from bertjax.compression import pruning
from bertjax.interop import hf_files
from bertjax.models import heads
from bertjax.models import bert as bert_model
from bertjax.tasks import kinds

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------

# Hugging Face BertConfig field -> BertConfig field, with HF's own default where the field may be absent
# (None: the field is required, because no sensible default exists).
_CONFIG_FIELDS = (
    ("vocab_size", "vocab_size", None),
    ("hidden_size", "hidden_size", None),
    ("num_hidden_layers", "num_layers", None),
    ("num_attention_heads", "num_heads", None),
    ("intermediate_size", "intermediate_size", None),
    ("max_position_embeddings", "max_position_embeddings", 512),
    ("type_vocab_size", "type_vocab_size", 2),
    ("hidden_dropout_prob", "hidden_dropout_rate", 0.1),
    ("attention_probs_dropout_prob", "attention_dropout_rate", 0.1),
    ("layer_norm_eps", "layer_norm_eps", 1e-12),
    ("initializer_range", "initializer_range", 0.02),
)


def config_from_hf(hf_config: dict, **overrides: Any) -> bert_model.BertConfig:
    """A Hugging Face BERT config.json (as a dict) -> BertConfig; `overrides` set BertConfig fields.

    Rejects what the bertjax network cannot reproduce rather than loading it into a subtly different
    model: another model type (RoBERTa, for instance, offsets its positions), a non-exact GELU, or
    relative position embeddings.
    """
    model_type = hf_config.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"config.json has model_type={model_type!r}: only 'bert' checkpoints can be loaded")
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(
            f"config.json has hidden_act={act!r}: bertjax BERT uses the exact (erf) GELU, hidden_act='gelu'"
        )
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(
            f"config.json has position_embedding_type={position!r}: bertjax BERT has only 'absolute' "
            "(learned) position embeddings"
        )
    fields = {}
    for hf_name, name, default in _CONFIG_FIELDS:
        if hf_name in hf_config:
            fields[name] = hf_config[hf_name]
        elif default is None:
            raise ValueError(f"config.json has no {hf_name!r}, which a BERT config must give")
        else:
            fields[name] = default
    known = {f.name for f in dataclasses.fields(bert_model.BertConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown BertConfig field(s) {unknown} in the overrides: choose from {sorted(known)}")
    if overrides.get("pre_layer_norm"):
        # Hugging Face BERT is post-LN; the same weights in a pre-LN network compute something else.
        raise ValueError("pre_layer_norm=True cannot be used with a Hugging Face BERT checkpoint (post-LN)")
    fields.update(overrides)
    return bert_model.BertConfig(**fields)


def config_to_hf(cfg: bert_model.BertConfig, kind: str | None = None, num_labels: int | None = None,
                 label_names: list[str] | None = None) -> dict:
    """BertConfig -> a config.json dict that transformers.BertForPreTraining reads, or with a task `kind`
    (a key of heads.HEADS) the matching task class: its architecture, labels (id2label / label2id from
    label_names, default LABEL_i) and problem_type, as transformers' own save_pretrained writes them."""
    if cfg.pre_layer_norm:
        raise ValueError("a pre_layer_norm=True model has no Hugging Face BERT equivalent (which is post-LN)")
    if cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise ValueError(f"model.head_size={cfg.head_dim} x model.num_heads={cfg.num_heads} is not model.hidden_size="
                         f"{cfg.hidden_size}: Hugging Face BERT has head size hidden_size / num_attention_heads")
    defaults = bert_model.BertConfig()
    changed = sorted(k for k in bert_model.FAMILY_OPTIONS if getattr(cfg, k) != getattr(defaults, k))
    if changed:
        raise ValueError(f"model options {changed} are not BERT's: RoBERTa, ALBERT and ModernBERT models are "
                         "written by bertjax.interop.hf_families.save_hf_checkpoint (bertjax.export does that)")
    hf = {"model_type": "bert", "architectures": ["BertForPreTraining"]}
    if kind is not None:
        hf.update(_head_config(kind, num_labels, label_names))
    for hf_name, name, _ in _CONFIG_FIELDS:
        hf[hf_name] = getattr(cfg, name)
    hf.update(
        hidden_act="gelu",
        position_embedding_type="absolute",
        pad_token_id=0,  # BERT vocabularies put [PAD] at 0; HF uses it only to zero that row at init.
        tie_word_embeddings=True,  # the MLM decoder is the word-embedding matrix, as in bertjax
        # The dtype the weights are written in (save_hf_checkpoint writes the params' own dtype).
        # transformers 5 reads "dtype", 4.x "torch_dtype".
        dtype=cfg.param_dtype,
        torch_dtype=cfg.param_dtype,
    )
    return hf


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Transform:
    """How one tensor changes layout; the three functions must agree (each other's inverse / shape)."""

    name: str
    # HF array, bertjax shape -> bertjax array
    to_bertjax: Callable[[np.ndarray, tuple], np.ndarray]
    # bertjax array -> HF array
    to_hf: Callable[[np.ndarray], np.ndarray]
    # bertjax shape -> the HF shape it corresponds to (for the shape checks in both directions)
    hf_shape: Callable[[tuple], tuple]


COPY = Transform("copy", lambda x, shape: x, lambda p: p, lambda shape: tuple(shape))
# torch Linear weight [out, in] <-> flax Dense kernel [in, out].
LINEAR = Transform("linear", lambda x, shape: x.T, lambda p: p.T, lambda shape: tuple(shape[::-1]))
# q/k/v projection: Linear weight [N*D, H] <-> DenseGeneral kernel [H, N, D]. HF's heads are
# head-major along the output axis (it views [B, S, N*D] as [B, S, N, D]), which is C order.
QKV_KERNEL = Transform(
    "qkv_kernel",
    lambda x, shape: x.T.reshape(shape),  # [N*D, H] -> [H, N*D] -> [H, N, D]
    lambda p: p.reshape(p.shape[0], -1).T,  # [H, N, D] -> [H, N*D] -> [N*D, H]
    lambda shape: (shape[1] * shape[2], shape[0]),
)
# q/k/v bias [N*D] <-> [N, D].
QKV_BIAS = Transform(
    "qkv_bias",
    lambda x, shape: x.reshape(shape),
    lambda p: p.reshape(-1),
    lambda shape: (shape[0] * shape[1],),
)
# Attention output: Linear weight [H, N*D] <-> DenseGeneral kernel [N, D, H] (contracting heads and D).
ATTENTION_OUT_KERNEL = Transform(
    "attention_out_kernel",
    lambda x, shape: x.T.reshape(shape),  # [H, N*D] -> [N*D, H] -> [N, D, H]
    lambda p: p.reshape(-1, p.shape[-1]).T,  # [N, D, H] -> [N*D, H] -> [H, N*D]
    lambda shape: (shape[2], shape[0] * shape[1]),
)

_LAYER = "bert.encoder.layer.{i}."
_BJ_LAYER = "bert/encoder/layers_{i}/"

# (Hugging Face name in a BertForPreTraining state dict, bertjax param path, transform).
# Rows with {i} are repeated for every layer. The MLM decoder weight is not a row: both sides tie it to
# the word embeddings (see _TIED below).
TABLE = (
    # Embeddings: [V, H], [512, H], [T, H] tables and their LayerNorm.
    ("bert.embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings/embedding", COPY),
    ("bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings/embedding", COPY),
    ("bert.embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings/embedding", COPY),
    ("bert.embeddings.LayerNorm.weight", "bert/embeddings/layer_norm/scale", COPY),
    ("bert.embeddings.LayerNorm.bias", "bert/embeddings/layer_norm/bias", COPY),
    # Encoder block i: self-attention.
    (_LAYER + "attention.self.query.weight", _BJ_LAYER + "attention/query/kernel", QKV_KERNEL),
    (_LAYER + "attention.self.query.bias", _BJ_LAYER + "attention/query/bias", QKV_BIAS),
    (_LAYER + "attention.self.key.weight", _BJ_LAYER + "attention/key/kernel", QKV_KERNEL),
    (_LAYER + "attention.self.key.bias", _BJ_LAYER + "attention/key/bias", QKV_BIAS),
    (_LAYER + "attention.self.value.weight", _BJ_LAYER + "attention/value/kernel", QKV_KERNEL),
    (_LAYER + "attention.self.value.bias", _BJ_LAYER + "attention/value/bias", QKV_BIAS),
    (_LAYER + "attention.output.dense.weight", _BJ_LAYER + "attention/output/kernel", ATTENTION_OUT_KERNEL),
    (_LAYER + "attention.output.dense.bias", _BJ_LAYER + "attention/output/bias", COPY),
    (_LAYER + "attention.output.LayerNorm.weight", _BJ_LAYER + "attention_layer_norm/scale", COPY),
    (_LAYER + "attention.output.LayerNorm.bias", _BJ_LAYER + "attention_layer_norm/bias", COPY),
    # Encoder block i: feed-forward H -> F -> H.
    (_LAYER + "intermediate.dense.weight", _BJ_LAYER + "mlp/intermediate/kernel", LINEAR),
    (_LAYER + "intermediate.dense.bias", _BJ_LAYER + "mlp/intermediate/bias", COPY),
    (_LAYER + "output.dense.weight", _BJ_LAYER + "mlp/output/kernel", LINEAR),
    (_LAYER + "output.dense.bias", _BJ_LAYER + "mlp/output/bias", COPY),
    (_LAYER + "output.LayerNorm.weight", _BJ_LAYER + "mlp_layer_norm/scale", COPY),
    (_LAYER + "output.LayerNorm.bias", _BJ_LAYER + "mlp_layer_norm/bias", COPY),
    # Pooler: dense H -> H (tanh) on [CLS].
    ("bert.pooler.dense.weight", "bert/pooler/kernel", LINEAR),
    ("bert.pooler.dense.bias", "bert/pooler/bias", COPY),
    # Masked-LM head: transform dense H -> H, GELU, LayerNorm; output bias [V] (decoder tied).
    ("cls.predictions.transform.dense.weight", "mlm_head/transform/kernel", LINEAR),
    ("cls.predictions.transform.dense.bias", "mlm_head/transform/bias", COPY),
    ("cls.predictions.transform.LayerNorm.weight", "mlm_head/layer_norm/scale", COPY),
    ("cls.predictions.transform.LayerNorm.bias", "mlm_head/layer_norm/bias", COPY),
    ("cls.predictions.bias", "mlm_head/output_bias", COPY),
    # Next-sentence head: dense H -> 2 on the pooled output.
    ("cls.seq_relationship.weight", "nsp_head/kernel", LINEAR),
    ("cls.seq_relationship.bias", "nsp_head/bias", COPY),
)

# Tensors some checkpoints carry that are copies of a table tensor (older transformers wrote the tied
# decoder out): accepted if equal to their source, never written.
_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Non-parameter buffers of the torch module, ignored (suffixes, so they match with or without "bert.").
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# bertjax params a checkpoint may lack (BertModel checkpoints, possibly without a pooler): these are
# freshly initialised instead. Everything else must be in the checkpoint.
_OPTIONAL_PREFIXES = ("bert/pooler/", "mlm_head/", "nsp_head/")


def _expanded_table(num_layers: int) -> list[tuple[str, str, Transform]]:
    rows = []
    for hf_name, path, transform in TABLE:
        if "{i}" in hf_name:
            rows.extend((hf_name.format(i=i), path.format(i=i), transform) for i in range(num_layers))
        else:
            rows.append((hf_name, path, transform))
    return rows


def _unrolled(cfg: bert_model.BertConfig) -> bert_model.BertConfig:
    # The table speaks of layers_0 ... layers_{L-1}; the scanned layout is converted at the edges.
    return dataclasses.replace(cfg, scan_layers=False)


def _network(cfg: bert_model.BertConfig, kind: str | None, num_labels: int | None):
    """(module, dummy inputs): BertForPreTraining, or the task head of `kind` (heads.HEADS)."""
    if kind is None:
        return bert_model.BertForPreTraining(_unrolled(cfg)), bert_model.dummy_batch(1, 1, 1)
    return heads.network(kind, _unrolled(cfg), num_labels), heads.dummy_inputs(kind)


def _param_shapes(cfg: bert_model.BertConfig, kind: str | None = None,
                  num_labels: int | None = None) -> dict[str, tuple]:
    """bertjax param path -> shape, from the model (BertForPreTraining or the head of `kind`) itself
    (eval_shape: no memory, no FLOPs)."""
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


def _check_float(name: str, x: np.ndarray):
    if not (x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16):
        raise ValueError(f"HF tensor {name!r} has dtype {x.dtype}, expected a floating-point tensor")


def _canonical_names(state: dict[str, np.ndarray]) -> dict[str, str]:
    """Canonical (BertForPreTraining, LayerNorm.weight/bias) name -> the name used in this checkpoint.

    BertModel checkpoints have no "bert." prefix; checkpoints converted from TensorFlow long ago name
    the LayerNorm parameters gamma/beta.
    """
    canonical = {}
    for name in state:
        new = name
        if not new.startswith(("bert.", "cls.") + _HF_HEAD_PREFIXES):
            new = "bert." + new
        if ".LayerNorm.gamma" in new or ".LayerNorm.beta" in new:
            new = new.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        if new in canonical:
            raise ValueError(f"HF tensors {canonical[new]!r} and {name!r} are the same parameter under two names")
        canonical[new] = name
    return canonical


# --------------------------------------------------------------------------------------------------
# The table-driven core
# --------------------------------------------------------------------------------------------------


def hf_to_params(state: dict[str, np.ndarray], cfg: bert_model.BertConfig, seed: int = 0):
    """A Hugging Face BERT state dict (name -> numpy array) -> (bertjax params, missing).

    params: the plain nested dict of BertForPreTraining params in cfg.param_dtype, in the layout
    cfg.scan_layers asks for. missing: the bertjax param paths that were not in the checkpoint (pooler
    and heads of a BertModel checkpoint); those keep a fresh initialisation from `seed`.
    Every tensor's shape is checked against the config; a mismatch raises ValueError naming it.
    """
    return _from_hf(state, cfg, seed, kind=None, num_labels=None)


def _from_hf(state: dict[str, np.ndarray], cfg: bert_model.BertConfig, seed: int, kind: str | None,
             num_labels: int | None):
    """hf_to_params for BertForPreTraining (kind None) or a task head: the table-driven core."""
    shapes = _param_shapes(cfg, kind, num_labels)
    names = _canonical_names(state)
    table = _expanded_table(cfg.num_layers) if kind is None else _head_rows(cfg.num_layers, kind, pooler=True)
    flat, used = _converted_rows(state, names, table, shapes, np.dtype(cfg.param_dtype))
    if kind is None:  # a head reads no decoder: a pretraining checkpoint's is left
        used |= _checked_tied(state, names)
    _report_unused(names, used, kind)
    missing = [path for path in shapes if path not in flat]
    _check_required(missing, table, cfg, kind)
    if missing:
        log.warning("not in the checkpoint, freshly initialised: %s", missing)
        flat.update(_fresh_params(cfg, missing, seed, kind, num_labels))

    params = _unflatten(flat)
    if cfg.scan_layers:
        params = _stack(params, cfg)
    return params, missing


def _converted_rows(state: dict[str, np.ndarray], names: dict[str, str], table, shapes: dict, param_dtype):
    """The table's rows the checkpoint has, in bertjax's layout and param_dtype (path -> array), and the
    canonical HF names they used; each tensor's shape is checked against the config's."""
    flat: dict[str, np.ndarray] = {}
    used = set()
    for hf_name, path, transform in table:
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


def _checked_tied(state: dict[str, np.ndarray], names: dict[str, str]) -> set[str]:
    """The tied decoder tensors the checkpoint has, each checked equal to the tensor bertjax ties it to."""
    used = set()
    for tied, source_name in _TIED.items():
        if tied in names:
            x, source = state[names[tied]], state.get(names.get(source_name, ""))
            if source is None or x.shape != source.shape or not np.array_equal(x, source):
                raise ValueError(
                    f"HF tensor {names[tied]!r} is not equal to {source_name!r}: bertjax ties the masked-LM "
                    "decoder to the word embeddings (and its bias to cls.predictions.bias), so an untied "
                    "checkpoint cannot be loaded exactly"
                )
            used.add(tied)
    return used


def _report_unused(names: dict[str, str], used: set[str], kind: str | None):
    """Logs the checkpoint's tensors the network does not have (buffers aside)."""
    unexpected = sorted(
        names[n] for n in names if n not in used and not n.endswith(_BUFFERS)
    )
    what = "BertForPreTraining" if kind is None else f"a {kind!r} head"
    if kind is not None and unexpected and all(n.startswith("cls.") for n in unexpected):
        # A pretraining checkpoint's MLM and NSP heads: fine-tuning replaces them, as expected.
        log.info("not used by %s: the pretraining heads %s", what, unexpected)
    elif unexpected:
        # E.g. the classifier of a fine-tuned BertForSequenceClassification: not part of pretraining.
        log.warning("ignoring %d tensor(s) that %s does not have: %s", len(unexpected), what, unexpected)


def _check_required(missing: list[str], table, cfg: bert_model.BertConfig, kind: str | None):
    """Only the pooler and the heads may be absent (and freshly initialised); an encoder tensor may not."""
    optional = _OPTIONAL_PREFIXES if kind is None else ("bert/pooler/", "classifier/")
    required = [p for p in missing if not p.startswith(optional)]
    if required:
        hf_names = {path: hf_name for hf_name, path, _ in table}
        raise ValueError(
            f"the checkpoint lacks {len(required)} encoder tensor(s), e.g. {hf_names[required[0]]!r} "
            f"(for {required[0]}): is it a BERT checkpoint with num_hidden_layers={cfg.num_layers}?"
        )


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


def _fresh_params(cfg: bert_model.BertConfig, paths: list[str], seed: int, kind: str | None = None,
                  num_labels: int | None = None) -> dict[str, np.ndarray]:
    """Fresh values for the given param paths, as BertForPreTraining.init (or the head's) would draw them."""
    module, inputs = _network(cfg, kind, num_labels)

    def init(key):
        flat = _flatten(nn.meta.unbox(module.init(key, **inputs)["params"]))
        # Returning only the wanted leaves lets XLA drop the initialisation of everything else (the
        # encoder, which the checkpoint did provide).
        return {path: flat[path] for path in paths}

    with _on_host():
        fresh = jax.jit(init)(jax.random.PRNGKey(seed))
    return {path: np.asarray(x) for path, x in fresh.items()}


def _stack(params: dict, cfg: bert_model.BertConfig) -> dict:
    # Stacked on the host: the result is a host tree like the unrolled one, whatever the default device.
    with _on_host():
        encoder = bert_model.stack_layers(params["bert"]["encoder"], cfg)
        encoder = jax.tree_util.tree_map(np.asarray, encoder)
    return {**params, "bert": {**params["bert"], "encoder": encoder}}


def params_to_hf(params: dict, cfg: bert_model.BertConfig) -> dict[str, np.ndarray]:
    """bertjax BertForPreTraining params (boxed or plain, unrolled or scanned) -> HF state dict.

    Names are those of transformers.BertForPreTraining; the tied decoder weight/bias are not written
    (transformers ties them on load, as its own save_pretrained does).
    """
    return _to_hf(params, cfg, kind=None)


def _to_hf(params: dict, cfg: bert_model.BertConfig, kind: str | None) -> dict[str, np.ndarray]:
    """params_to_hf for BertForPreTraining (kind None) or a task head: the table-driven core."""
    params = nn.meta.unbox(params)
    if set(params) == {"params"}:  # a whole variables dict
        params = params["params"]
    # Pruned heads (model.layer_heads): transformers 5's BERT has no pruned_heads, so they are written at
    # full shapes, the removed heads all zeros: the same outputs.
    cfg, params = pruning.with_all_heads(params, cfg)
    encoder = params["bert"]["encoder"]
    if "layers" in encoder:  # scanned layout: back to layers_0 ... layers_{L-1}
        encoder = bert_model.unstack_layers(encoder, cfg)
        params = {**params, "bert": {**params["bert"], "encoder": encoder}}
    flat = _flatten(params)
    num_labels = None
    if kind is not None:
        num_labels = _classifier_width(flat, kind)
        if not HF_HEADS[kind].pooler:  # the HF class has no pooler: ours is computed but never read
            flat = {path: x for path, x in flat.items() if not path.startswith("bert/pooler/")}
    shapes = _param_shapes(cfg, kind, num_labels)
    rows = _expanded_table(cfg.num_layers) if kind is None else _head_rows(cfg.num_layers, kind, HF_HEADS[kind].pooler)
    unmapped = sorted(set(flat) - {path for _, path, _ in rows})
    if unmapped:
        raise ValueError(f"bertjax params with no Hugging Face name: {unmapped} (pre_layer_norm models have none)")
    state = {}
    for hf_name, path, transform in rows:
        if path not in flat:
            raise ValueError(f"bertjax param {path} is missing from the params being exported")
        p = np.asarray(flat[path])
        if tuple(p.shape) != shapes[path]:
            raise ValueError(f"bertjax param {path}: the config implies shape {shapes[path]}, found {tuple(p.shape)}")
        # Contiguous, because safetensors writes the raw buffer.
        state[hf_name] = np.ascontiguousarray(transform.to_hf(p))
    return state


# --------------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------------


def load_hf_checkpoint(path: str | os.PathLike, model_config_overrides: dict | None = None):
    """A Hugging Face BERT directory -> (BertConfig, params, missing).

    params are the plain BertForPreTraining params (unrolled, or stacked when the overrides set
    scan_layers=True); missing lists the bertjax params the checkpoint did not have (heads of a BertModel
    checkpoint), which are freshly initialised. model_config_overrides set BertConfig fields that the
    checkpoint does not fix (dtype, dropout, scan_layers, remat_policy, ...).
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    cfg = config_from_hf(json.loads((path / "config.json").read_text()), **(model_config_overrides or {}))
    params, missing = hf_to_params(hf_files.read_hf_weights(path), cfg)
    return cfg, params, missing


# What a masked-LM-only directory leaves out: BertForMaskedLM has neither the pooler nor the NSP head.
_NOT_IN_MASKED_LM = ("bert.pooler.", "cls.seq_relationship.")


def save_hf_checkpoint(path: str | os.PathLike, cfg: bert_model.BertConfig, params: dict,
                       vocab_path: str | os.PathLike | None = None, lower_case: bool = True,
                       masked_lm_only: bool = False):
    """Write a directory that transformers.BertForPreTraining.from_pretrained(path) loads.

    config.json, model.safetensors (the params' own dtype, BertForPreTraining names, tied decoder left
    out as transformers does itself) and, given a vocabulary, vocab.txt plus a tokenizer_config.json
    so that AutoTokenizer.from_pretrained(path) works too. masked_lm_only: the weights of
    BertForMaskedLM alone (no pooler, no NSP head), which AutoModelForMaskedLM and the fill-mask
    pipeline load without reporting unused weights (transformers 5 reports every one).
    """
    state, hf_config = params_to_hf(params, cfg), config_to_hf(cfg)
    if masked_lm_only:
        state = {k: v for k, v in state.items() if not k.startswith(_NOT_IN_MASKED_LM)}
        hf_config["architectures"] = ["BertForMaskedLM"]
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case)


# --------------------------------------------------------------------------------------------------
# Task heads (bertjax/heads.py) <-> transformers' task classes
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HFHead:
    """The transformers class a task kind corresponds to, and how its config.json describes it."""

    architecture: str  # the class, written to config.json's "architectures"
    prefix: str  # its head's dense layer: <prefix>.weight [K, H], <prefix>.bias [K]
    pooler: bool  # whether the class has bert.pooler (the per-token classes are built without one)
    labels: bool  # whether id2label / label2id describe the K outputs (the class reads num_labels)
    problem_type: str | None  # what transformers' loss should be for this kind, where it asks
    auto_class: str  # the AutoModelFor... class that loads it (the model card's example)


# One per task kind, read from the kind's own record (bertjax/tasks/kinds/); keyed like heads.HEADS
# (tests check that the keys agree).
HF_HEADS = {name: HFHead(**kind.hf_class) for name, kind in kinds.KINDS.items()}
_HF_HEAD_PREFIXES = tuple(sorted({f"{spec.prefix}." for spec in HF_HEADS.values()}))


def _hf_head(kind: str) -> HFHead:
    heads.head(kind)  # an unknown kind fails there, listing the known ones
    return HF_HEADS[kind]


def _head_rows(num_layers: int, kind: str, pooler: bool) -> list[tuple[str, str, Transform]]:
    """The encoder's rows of the table (with or without the pooler) and the head's dense layer."""
    prefix = _hf_head(kind).prefix
    encoder = [row for row in _expanded_table(num_layers) if row[1].startswith("bert/")]
    if not pooler:
        encoder = [row for row in encoder if not row[1].startswith("bert/pooler/")]
    return encoder + [(f"{prefix}.weight", "classifier/kernel", LINEAR), (f"{prefix}.bias", "classifier/bias", COPY)]


def _classifier_width(flat: dict, kind: str) -> int:
    if "classifier/bias" not in flat:
        raise ValueError(f"the params have no classifier: they are not a {kind!r} head's (bertjax.models.heads)")
    return int(np.shape(flat["classifier/bias"])[0])


def _head_config(kind: str, num_labels: int | None, label_names: list[str] | None) -> dict:
    spec = _hf_head(kind)
    out = {"architectures": [spec.architecture]}
    if spec.problem_type is not None:
        out["problem_type"] = spec.problem_type
    if spec.labels:
        num_labels = heads.resolve_num_labels(kind, num_labels)
        label_names = list(label_names) if label_names is not None else [f"LABEL_{i}" for i in range(num_labels)]
        if len(label_names) != num_labels or len(set(label_names)) != num_labels:
            raise ValueError(f"label_names {label_names} must be {num_labels} distinct names, one per output")
        out["id2label"] = {str(i): name for i, name in enumerate(label_names)}
        out["label2id"] = {name: i for i, name in enumerate(label_names)}
    elif label_names is not None:
        raise ValueError(f"a {kind!r} head has no label names (its outputs are not classes)")
    return out


def hf_to_head_params(state: dict[str, np.ndarray], cfg: bert_model.BertConfig, kind: str,
                      num_labels: int | None = None, seed: int = 0):
    """A Hugging Face BERT state dict -> (params of the `kind` head, missing), as hf_to_params.

    From the task's own class (BertForSequenceClassification for "classification", ...) everything
    loads; from a pretraining (BertForPreTraining) or BertModel state dict, the encoder loads and the
    classifier is fresh (listed in missing), its MLM/NSP heads are left. num_labels: the classifier
    width where the kind does not fix it; None takes it from the state dict's head.
    """
    names = _canonical_names(state)
    weight = names.get(f"{_hf_head(kind).prefix}.weight")
    if num_labels is None and heads.head(kind).num_labels is None and weight is not None:
        num_labels = int(state[weight].shape[0])
    return _from_hf(state, cfg, seed, kind, heads.resolve_num_labels(kind, num_labels))


def head_params_to_hf(params: dict, cfg: bert_model.BertConfig, kind: str) -> dict[str, np.ndarray]:
    """bertjax params of the `kind` head (boxed or plain, unrolled or scanned) -> the state dict of its
    transformers class. The classes without a pooler (span, tagging) get none: ours goes unused."""
    return _to_hf(params, cfg, kind)


def load_hf_head(path: str | os.PathLike, kind: str, num_labels: int | None = None,
                 model_config_overrides: dict | None = None):
    """A Hugging Face BERT directory -> (BertConfig, params of the `kind` head, missing).

    The directory of the task's own class loads whole; any other BERT directory (bert-base-uncased,
    BertForPreTraining, another task's) gives the encoder, with a fresh classifier (in missing).
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    hf_config = json.loads((path / "config.json").read_text())
    cfg = config_from_hf(hf_config, **(model_config_overrides or {}))
    if hf_config.get("classifier_dropout") not in (None, cfg.hidden_dropout_rate):
        # bertjax's heads drop out at BERT's hidden rate, where HF's classifier_dropout falls back to.
        log.warning("%s sets classifier_dropout=%s: bertjax heads use hidden_dropout_rate=%s", path,
                    hf_config["classifier_dropout"], cfg.hidden_dropout_rate)
    state = task_state(path, hf_config, hf_files.read_hf_weights(path), kind, _hf_head(kind).architecture,
                       _HF_HEAD_PREFIXES)
    params, missing = hf_to_head_params(state, cfg, kind, num_labels)
    return cfg, params, missing


def task_state(path, hf_config: dict, state: dict[str, np.ndarray], kind: str, architecture: str,
               head_prefixes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """What a `kind` head reads of a directory's tensors: all of them when it is the kind's own class
    (`architecture`; its problem_type checked), else all but the tensors under `head_prefixes`, the task
    heads of the class it is (another task's classifier means nothing to this one). Every family's."""
    spec = _hf_head(kind)
    if architecture in (hf_config.get("architectures") or []):
        problem_type = hf_config.get("problem_type")
        if problem_type is not None and spec.problem_type is not None and problem_type != spec.problem_type:
            raise ValueError(f"{path} is a {problem_type!r} checkpoint, not {spec.problem_type!r}: load it as "
                             f"another kind than {kind!r}")
        return state
    other = sorted(name for name in state if name.startswith(head_prefixes))
    if other:
        log.warning("%s is a %s checkpoint: its head %s is not loaded into a %r head",
                    path, hf_config.get("architectures"), other, kind)
    return {name: x for name, x in state.items() if name not in other}


def save_hf_head(path: str | os.PathLike, cfg: bert_model.BertConfig, params: dict, kind: str,
                 label_names: list[str] | None = None, vocab_path: str | os.PathLike | None = None,
                 lower_case: bool = True):
    """Write a directory that transformers' class for `kind` (and AutoModelFor... of that task) loads
    with no missing or unexpected weight: as save_hf_checkpoint, for a task head's params."""
    state = head_params_to_hf(params, cfg, kind)
    num_labels = int(state[f"{_hf_head(kind).prefix}.bias"].shape[0])
    hf_config = config_to_hf(cfg, kind, num_labels if heads.head(kind).num_labels is None else None, label_names)
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case)
