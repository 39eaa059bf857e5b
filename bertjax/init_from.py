"""The one init-from: what a path given as a starting model names, read once into a Start, and its weights.

    start = init_from.resolve(path, what="train.init_from")  # kind, checkpoint, config, tokenizer: no weights
    model = init_from.load(start, model_overrides=...)        # its weights (a Pretrained)

A path is a bertjax workdir or checkpoint, a params export, a Hugging Face directory of any family, or a
sentence-transformers directory around one. Pretraining's `train.init_from`, fine-tuning's, distillation's
teacher, Theseus' predecessor, `python -m bertjax.export --from` and `bertjax.load` each resolve their path
here once and hand the Start on, so that every program accepts the same paths, says the same thing when one is
wrong, and reads a path's records once. bertjax's own files are read by training/saved_models.py and
training/checkpoint.py, Hugging Face and sentence-transformers directories by interop/.
"""

import dataclasses
import json
from typing import Any

import jax
from etils import epath

from bertjax.interop import hf, hf_files, sentence_transformers
from bertjax.models.config import BertConfig, resolve_platform
from bertjax.text import files
from bertjax.training import checkpoint, saved_models
from bertjax.training import workdir as workdirs
from bertjax.training.checkpoint_meta import CheckpointMeta, EmbeddingRecord, TaskRecord

BERTJAX = "bertjax"
PARAMS_EXPORT = "params_export"
HUGGING_FACE = "hugging_face"
SENTENCE_TRANSFORMERS = "sentence_transformers"

KINDS_READ = ("a bertjax workdir/checkpoint, a params export (params.npz, config.json), a Hugging Face directory "
              "(config.json and model.safetensors or pytorch_model.bin) or a sentence-transformers directory "
              "(modules.json)")


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """What builds the tokenizer a model was trained with (the TensorFlow tokenizer is made on demand)."""

    kind: str  # "wordpiece" | "sentencepiece" | "bpe"
    vocab_path: str  # a local file (vocab.txt, a SentencePiece .model, a byte-level BPE tokenizer.json)
    lower_case: bool

    def load(self):
        from bertjax.text import tokenizers  # imports TensorFlow: the init-from is read without it (synthetic runs)

        return tokenizers.load_tokenizer(self.kind, self.vocab_path, lower_case=self.lower_case)


@dataclasses.dataclass(frozen=True)
class Start:
    """A starting model's path, read once: everything about it but its weights."""

    path: str  # as given
    what: str  # the setting that named it, for error messages ("train.init_from")
    kind: str  # BERTJAX | PARAMS_EXPORT | HUGGING_FACE | SENTENCE_TRANSFORMERS
    config: BertConfig  # the network as stored (no compute overrides)
    tokenizer: TokenizerFiles | None  # None: a run on synthetic data
    checkpoint: str | None = None  # BERTJAX: the checkpoint the path stands for (best dev, else newest)
    meta: CheckpointMeta | None = None  # a bertjax checkpoint's or params export's record
    embedder: Any = None  # SENTENCE_TRANSFORMERS: its modules (interop/sentence_transformers.Embedder)

    @property
    def is_bertjax_run(self) -> bool:
        return self.kind == BERTJAX

    @property
    def task(self) -> TaskRecord | None:
        return self.meta.task if self.meta is not None else None

    @property
    def hf_directory(self) -> str | None:
        """The Hugging Face directory holding the weights (a sentence-transformers Transformer module's)."""
        return {HUGGING_FACE: self.path, SENTENCE_TRANSFORMERS: getattr(self.embedder, "transformer", None)}.get(
            self.kind)


@dataclasses.dataclass
class Pretrained:
    """A Start's weights, with the config the run computes them under (its compute overrides applied)."""

    config: BertConfig
    params: Any  # BertForPreTraining params, or a task head's ({"bert", "classifier"})
    tokenizer: TokenizerFiles | None  # None: a run on synthetic data
    source: str
    # A bertjax checkpoint's meta (step, model, task, ...), a params export's config.json (the same, and
    # quantize where its params are int8); None for Hugging Face.
    meta: CheckpointMeta | None
    missing: list[str]  # params the source lacked, freshly initialised (Hugging Face only)
    # A sentence-transformers directory's pooling, prompts, ... and its Dense params ({"kernel", "bias"}),
    # kept apart from `params` (BertForPreTraining's for every reader of the init-from).
    st_embedding: EmbeddingRecord | None = None
    st_dense: dict | None = None

    @property
    def task(self) -> TaskRecord | None:
        return self.meta.task if self.meta is not None else None

    @property
    def embedding(self) -> EmbeddingRecord | None:
        """How the model embeds sentences (its meta's, or a sentence-transformers directory's), or None."""
        if self.st_embedding is not None:
            return self.st_embedding
        return self.meta.embedding if self.meta is not None else None


def kind_of(path: str) -> str | None:
    """BERTJAX, PARAMS_EXPORT, HUGGING_FACE, SENTENCE_TRANSFORMERS, or None when `path` is none of them."""
    if saved_models.chosen_checkpoint(path) is not None:
        return BERTJAX
    if sentence_transformers.is_directory(path):  # its Transformer may be the root's Hugging Face directory: first
        return SENTENCE_TRANSFORMERS
    # A bertjax workdir has a config.json too (the run's config): the weights tell the others apart.
    if saved_models.is_params_export(path):
        return PARAMS_EXPORT
    if (epath.Path(path) / "config.json").exists() and hf_files.find_weights(path) is not None:
        return HUGGING_FACE
    return None


def resolve(path: str, what: str = "init_from", tokenizer: bool = True) -> Start:
    """The Start of `path`: its kind, its checkpoint and record, the network it holds and its tokenizer's
    files (tokenizer=False: not looked for), each read once. A path that is missing or none of the kinds is
    one error naming `what`."""
    path = str(path)
    if not path:
        raise ValueError(f"{what} is empty: give {KINDS_READ}")
    if not epath.Path(path).exists():
        raise FileNotFoundError(f"{what}={path} does not exist")
    chosen = saved_models.chosen_checkpoint(path)
    kind = BERTJAX if chosen is not None else kind_of(path)
    if kind == BERTJAX:
        meta = checkpoint.read_meta(chosen)
        vocabulary = _recorded_tokenizer(meta, checkpoint.workdir_of(chosen), chosen, what)
        return Start(path, what, kind, BertConfig.from_dict(meta.model), vocabulary, chosen, meta)
    if kind == PARAMS_EXPORT:
        meta = saved_models.export_meta(path, what)
        return Start(path, what, kind, BertConfig.from_dict(meta.model), _recorded_tokenizer(meta, path, path, what),
                     meta=meta)
    if kind == SENTENCE_TRANSFORMERS:
        embedder = sentence_transformers.read(path)
        vocabulary = _hf_tokenizer(embedder.transformer, what, embedder.lower_case) if tokenizer else None
        return Start(path, what, kind, _hf_config(embedder.transformer), vocabulary, embedder=embedder)
    if kind == HUGGING_FACE:
        return Start(path, what, kind, _hf_config(path), _hf_tokenizer(path, what) if tokenizer else None)
    raise FileNotFoundError(f"{what}={path} is none of {KINDS_READ}")


def load(start: Start, *, model_overrides: dict | None = None, head: str | None = None,
         num_labels: int | None = None, abstract_params=None, quantized: bool = False) -> Pretrained:
    """The weights of `start`. model_overrides set the compute fields the weights do not fix (dtype,
    attention_impl, scan_layers, ...; "auto" ones resolved for this machine). head: a task kind whose head
    params to read from a Hugging Face directory (a bertjax checkpoint or params export holds what it was
    trained with). abstract_params (ShapeDtypeStructs with shardings): restore straight into that layout.
    quantized: accept an int8 params export (its params then hold int8 kernels,
    bertjax/compression/quantize.py), which is refused otherwise: it computes nothing as a float network
    and trains nothing."""
    overrides = resolve_platform(dict(model_overrides or {}))
    if start.kind == BERTJAX:
        return _from_bertjax(start, overrides, abstract_params)
    if start.kind == PARAMS_EXPORT:
        if start.meta.quantize and not quantized:
            raise ValueError(f"{start.what}={start.path} is an int8 params export ({start.meta.quantize}): start "
                             "from the float model it was exported from (bertjax.load reads it for inference)")
        config = BertConfig.from_dict({**start.meta.model, **overrides})
        params = saved_models.export_params(start.path, config, quantized=bool(start.meta.quantize))
        return Pretrained(config, _placed(params, abstract_params), start.tokenizer, start.path, start.meta, [])
    model = _from_hugging_face(start.hf_directory, overrides, head, num_labels, abstract_params)
    model = dataclasses.replace(model, tokenizer=start.tokenizer, source=start.path)
    if start.kind == HUGGING_FACE:
        return model
    embedder = start.embedder
    if embedder.pooled_width not in (0, model.config.hidden_size):
        raise ValueError(f"{start.what}={start.path}: its Pooling pools {embedder.pooled_width} features, its "
                         f"Transformer's hidden size is {model.config.hidden_size}")
    return dataclasses.replace(model, st_embedding=embedder.record, st_dense=embedder.dense)


def _placed(params, abstract_params):
    """Host params onto the devices as abstract_params shard them (None: left where they are)."""
    if abstract_params is None:
        return params
    return jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))


def _recorded_tokenizer(meta: CheckpointMeta, directory: str, path: str, what: str) -> TokenizerFiles | None:
    """The tokenizer a checkpoint's meta (or an export's config.json) records, its file relative to
    `directory` (older checkpoints: an absolute path)."""
    info = meta.tokenizer
    if info is None or not info.path:
        return None
    vocab = workdirs.resolve_vocabulary(info.path, directory)
    if not epath.Path(vocab).exists():
        raise ValueError(f"{what}={path}: its vocabulary {vocab} is gone; put it back there")
    return TokenizerFiles(info.kind, files.local_copy(vocab), bool(info.lower_case))


def _from_bertjax(start: Start, overrides: dict, abstract_params) -> Pretrained:
    path, what = start.checkpoint, start.what
    if abstract_params is not None and start.meta.electra is not None:
        raise ValueError(f"{what}={path} is an ELECTRA run: continue it with a config that has its electra section, "
                         "or fine-tune, load or export its discriminator")
    params, meta = checkpoint.restore_params(path, abstract_params)
    if meta.electra is not None:  # what every reader but ELECTRA's own pretraining wants: the discriminator
        print(f"{what}={path} is an ELECTRA run: its discriminator is read, the generator left out", flush=True)
        params = {"bert": params["bert"]}
    return Pretrained(BertConfig.from_dict({**meta.model, **overrides}), params, start.tokenizer, path, meta, [])


def _hf_config(directory: str) -> BertConfig:
    return hf.config_from_hf(json.loads((epath.Path(directory) / "config.json").read_text()))


def _hf_tokenizer(directory: str, what: str, lower_case: bool = False) -> TokenizerFiles:
    return TokenizerFiles(*hf.tokenizer_of(directory, what, lower_case))


def _from_hugging_face(directory: str, overrides: dict, head: str | None, num_labels: int | None,
                       abstract_params) -> Pretrained:
    """A directory of any family (interop/hf.py), as pretraining params or a task head's."""
    if head is None:
        config, params, missing = hf.load_hf_checkpoint(directory, model_config_overrides=overrides)
    else:
        config, params, missing = hf.load_hf_head(directory, head, num_labels, model_config_overrides=overrides)
    return Pretrained(config, _placed(params, abstract_params), None, directory, None, missing)
