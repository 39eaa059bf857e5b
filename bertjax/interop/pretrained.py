"""The one init-from: a bertjax workdir or checkpoint, a params export, a Hugging Face directory of
any family, or a sentence-transformers directory around one, to a model config, its parameters and its
tokenizer's files.

Pretraining (`train.init_from`), fine-tuning (`init_from`), distillation, `bertjax.load` and
`python -m bertjax.export` all read starting weights through `load`, so that every program accepts the
same paths and says the same thing when one is wrong; `tokenizer_files` reads the same tokenizer
without the weights.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import traverse_util

from bertjax.interop import hf, hf_files, hf_tokenizer, sentence_transformers
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig, resolve_platform
from bertjax.text import files
from bertjax.training import checkpoint
from bertjax.training import workdir as workdirs
from bertjax.training.checkpoint_meta import CheckpointMeta, EmbeddingRecord, TaskRecord

BERTJAX = "bertjax"
PARAMS_EXPORT = "params_export"
HUGGING_FACE = "hugging_face"
SENTENCE_TRANSFORMERS = "sentence_transformers"

PARAMS_FILE = "params.npz"  # a params export's weights (python -m bertjax.export --format=params), beside config.json
_KINDS_READ = ("a bertjax workdir/checkpoint, a params export (params.npz, config.json), a Hugging Face "
               "directory (config.json and model.safetensors or pytorch_model.bin) or a sentence-transformers "
               "directory (modules.json)")


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """What builds the tokenizer a model was trained with (the TensorFlow tokenizer is made on demand)."""

    kind: str  # "wordpiece" | "sentencepiece" | "bpe"
    vocab_path: str  # a local file (vocab.txt, a SentencePiece .model, a byte-level BPE tokenizer.json)
    lower_case: bool

    def load(self):
        from bertjax.text import tokenizers  # imports TensorFlow: the init-from is read without it (synthetic runs)

        return tokenizers.load_tokenizer(self.kind, self.vocab_path, lower_case=self.lower_case)


@dataclasses.dataclass
class Pretrained:
    config: BertConfig
    params: Any  # BertForPreTraining params, or a task head's ({"bert", "classifier"})
    tokenizer: TokenizerFiles | None  # None: a run on synthetic data (or not asked for)
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
    if model_checkpoint(path) is not None:
        return BERTJAX
    if sentence_transformers.is_directory(path):  # its Transformer may be the root's Hugging Face directory: first
        return SENTENCE_TRANSFORMERS
    # A bertjax workdir has a config.json too (the run's config): the weights tell the others apart.
    if (epath.Path(path) / "config.json").exists():
        if (epath.Path(path) / PARAMS_FILE).exists():
            return PARAMS_EXPORT
        if hf_files.find_weights(path) is not None:
            return HUGGING_FACE
    return None


def model_checkpoint(path: str) -> str | None:
    """The checkpoint a workdir stands for: a fine-tuning workdir's best dev checkpoint, else its newest."""
    best = epath.Path(path) / checkpoint.BEST_DIR
    if best.is_dir() and checkpoint.is_checkpoint(str(best)):
        return str(best)
    return path if checkpoint.is_checkpoint(path) else None


def load(path: str, *, what: str = "init_from", model_overrides: dict | None = None, head: str | None = None,
         num_labels: int | None = None, abstract_params=None, tokenizer: bool = True,
         quantized: bool = False) -> Pretrained:
    """The model at `path`. `what` names the setting in error messages. model_overrides set the compute
    fields the weights do not fix (dtype, attention_impl, scan_layers, ...). head: a task kind whose
    head params to read from a Hugging Face directory (a bertjax checkpoint or params export holds what
    it was trained with). abstract_params (ShapeDtypeStructs with shardings): restore straight into that
    layout. tokenizer: find its files too (before any weight is read). quantized: accept an int8 params
    export (its params then hold int8 kernels, bertjax/compression/quantize.py), which is refused
    otherwise: it computes nothing as a float network and trains nothing."""
    path = str(path)
    if not path:
        raise ValueError(f"{what} is empty: give {_KINDS_READ}")
    if not epath.Path(path).exists():
        raise FileNotFoundError(f"{what}={path} does not exist")
    kind = kind_of(path)
    overrides = resolve_platform(dict(model_overrides or {}))  # "auto" compute fields for this machine
    if kind == BERTJAX:
        return _from_bertjax(model_checkpoint(path), what, overrides, abstract_params)
    if kind == PARAMS_EXPORT:
        return _from_params_export(path, what, overrides, abstract_params, quantized)
    if kind == HUGGING_FACE:
        return _from_hugging_face(path, what, overrides, head, num_labels, abstract_params, tokenizer)
    if kind == SENTENCE_TRANSFORMERS:
        return _from_sentence_transformers(path, what, overrides, head, num_labels, abstract_params, tokenizer)
    raise FileNotFoundError(f"{what}={path} is none of {_KINDS_READ}")


def model_config(path: str, what: str = "init_from") -> BertConfig:
    """Only the network's config of the model at `path` (no weights read): what a run checks against its
    own before loading them."""
    kind = kind_of(path)
    if kind == BERTJAX:
        return BertConfig.from_dict(checkpoint.read_meta(model_checkpoint(path)).model)
    if kind == PARAMS_EXPORT:
        return BertConfig.from_dict(_export_meta(path, what).model)
    if kind == SENTENCE_TRANSFORMERS:
        path = sentence_transformers.read(path).transformer
    if kind in (HUGGING_FACE, SENTENCE_TRANSFORMERS):
        return hf.config_from_hf(json.loads((epath.Path(path) / "config.json").read_text()))
    raise FileNotFoundError(f"{what}={path} is none of {_KINDS_READ}")


def tokenizer_files(path: str, what: str = "init_from") -> TokenizerFiles | None:
    """Only the tokenizer of the model at `path` (no weights read), the one `load` gives; None for a run
    on synthetic data."""
    kind = kind_of(path)
    if kind == BERTJAX:
        chosen = model_checkpoint(path)
        return _recorded_tokenizer(checkpoint.read_meta(chosen), checkpoint.workdir_of(chosen), chosen, what)
    if kind == PARAMS_EXPORT:
        return _recorded_tokenizer(_export_meta(path, what), path, path, what)
    if kind == HUGGING_FACE:
        return _hf_tokenizer(path, what)
    if kind == SENTENCE_TRANSFORMERS:
        embedder = sentence_transformers.read(path)
        return _hf_tokenizer(embedder.transformer, what, embedder.lower_case)
    raise FileNotFoundError(f"{what}={path} is none of {_KINDS_READ}")


def _placed(params, abstract_params):
    """Host params onto the devices as abstract_params shard them (None: left where they are)."""
    if abstract_params is None:
        return params
    return jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))


# --------------------------------------------------------------------------------------------------
# bertjax checkpoints and params exports
# --------------------------------------------------------------------------------------------------


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


def _from_bertjax(path: str, what: str, model_overrides: dict, abstract_params) -> Pretrained:
    if abstract_params is not None and checkpoint.read_meta(path).electra is not None:
        raise ValueError(f"{what}={path} is an ELECTRA run: continue it with a config that has its electra section, "
                         "or fine-tune, load or export its discriminator")
    params, meta = checkpoint.restore_params(path, abstract_params)
    if meta.electra is not None:  # what every reader but ELECTRA's own pretraining wants: the discriminator
        print(f"{what}={path} is an ELECTRA run: its discriminator is read, the generator left out", flush=True)
        params = {"bert": params["bert"]}
    config = BertConfig.from_dict({**meta.model, **model_overrides})
    return Pretrained(config, params, _recorded_tokenizer(meta, checkpoint.workdir_of(path), path, what), path, meta,
                      [])


def _export_meta(path: str, what: str) -> CheckpointMeta:
    """A params export's config.json: model, tokenizer, task, step and (int8 exports) quantize."""
    meta = json.loads((epath.Path(path) / "config.json").read_text())
    if "model" not in meta:
        raise ValueError(f"{what}={path}: its config.json has no model section, so it is not a bertjax params "
                         "export (python -m bertjax.export --format=params)")
    return CheckpointMeta.from_json({"step": 0, **{k: v for k, v in meta.items() if v is not None}})


def _from_params_export(path: str, what: str, model_overrides: dict, abstract_params, quantized: bool) -> Pretrained:
    meta = _export_meta(path, what)
    if meta.quantize and not quantized:
        raise ValueError(f"{what}={path} is an int8 params export ({meta.quantize}): start from the float "
                         "model it was exported from (bertjax.load reads it for inference)")
    config = BertConfig.from_dict({**meta.model, **model_overrides})
    with (epath.Path(path) / PARAMS_FILE).open("rb") as f:
        params = traverse_util.unflatten_dict(dict(np.load(f)), sep="/")
    if not meta.quantize:
        params = _in_layout(params, config)
    tokenizer = _recorded_tokenizer(meta, path, path, what)
    return Pretrained(config, _placed(params, abstract_params), tokenizer, path, meta, [])


def _in_layout(params: dict, config: BertConfig) -> dict:
    """The export's params stored as the config asks (a run may store them otherwise than the exported
    one did): in its param_dtype, the layers stacked or not as config.scan_layers says."""
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, config.param_dtype), params)
    encoder = params["bert"]["encoder"]
    if config.scan_layers == ("layers" in encoder):
        return params
    change = bert_model.stack_layers if config.scan_layers else bert_model.unstack_layers
    encoder = jax.tree_util.tree_map(np.asarray, change(encoder, config))
    return {**params, "bert": {**params["bert"], "encoder": encoder}}


# --------------------------------------------------------------------------------------------------
# Hugging Face directories
# --------------------------------------------------------------------------------------------------


def _from_hugging_face(path: str, what: str, model_overrides: dict, head: str | None, num_labels: int | None,
                       abstract_params, tokenizer: bool) -> Pretrained:
    """A directory of any family (interop/hf.py), as pretraining params or a task head's."""
    vocabulary = _hf_tokenizer(path, what) if tokenizer else None  # before the weights: found at once
    if head is None:
        config, params, missing = hf.load_hf_checkpoint(path, model_config_overrides=model_overrides)
    else:
        config, params, missing = hf.load_hf_head(path, head, num_labels, model_config_overrides=model_overrides)
    return Pretrained(config, _placed(params, abstract_params), vocabulary, path, None, missing)


def _from_sentence_transformers(path: str, what: str, model_overrides: dict, head: str | None,
                                num_labels: int | None, abstract_params, tokenizer: bool) -> Pretrained:
    """A sentence-transformers directory (interop/sentence_transformers.py): its Transformer module's
    Hugging Face directory as above, with the embedder's record and Dense params beside the params."""
    embedder = sentence_transformers.read(path)
    vocabulary = _hf_tokenizer(embedder.transformer, what, embedder.lower_case) if tokenizer else None
    model = _from_hugging_face(embedder.transformer, what, model_overrides, head, num_labels, abstract_params,
                               tokenizer=False)
    if embedder.pooled_width not in (0, model.config.hidden_size):
        raise ValueError(f"{what}={path}: its Pooling pools {embedder.pooled_width} features, its Transformer's "
                         f"hidden size is {model.config.hidden_size}")
    return dataclasses.replace(model, tokenizer=vocabulary, source=path, st_embedding=embedder.record,
                               st_dense=embedder.dense)


_TOKENIZER_KINDS = {"wordpiece": "WordPiece", "sentencepiece": "SentencePiece"}


def _hf_tokenizer(path: str, what: str, lower_case: bool = False) -> TokenizerFiles:
    """The first of the family's tokenizer files (hf_family.Family.tokenizer_files) the directory has, else
    its tokenizer.json (transformers 5 saves no vocab.txt: WordPiece's vocabulary, or byte-level BPE as it
    is), else RoBERTa's vocab.json and merges.txt as a tokenizer.json; and whether it lower-cases: unless its
    tokenizer config says otherwise, WordPiece does, as the original releases (lower_case: a
    sentence-transformers module that lower-cases the text itself)."""
    directory = epath.Path(path)
    family = hf.family_of(json.loads((directory / "config.json").read_text()))
    settings = {}
    if (directory / "tokenizer_config.json").exists():
        settings = json.loads((directory / "tokenizer_config.json").read_text())
    for name, kind in family.tokenizer_files:
        if (directory / name).exists():
            return TokenizerFiles(kind, str(directory / name), lower_case or bool(settings.get("do_lower_case", True)))
    if (directory / "tokenizer.json").exists():
        found = str(directory / "tokenizer.json")
        if hf_tokenizer.model_type(found) == "BPE":
            return TokenizerFiles("bpe", found, lower_case)
        tokens, lowers = hf_tokenizer.read_wordpiece_tokenizer(found)
        lower_case = lower_case or bool(settings.get("do_lower_case", lowers))
        return TokenizerFiles("wordpiece", _cached_file("vocab.txt", "".join(token + "\n" for token in tokens)),
                              lower_case)
    if (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        text = hf_tokenizer.roberta_tokenizer_json(str(directory / "vocab.json"), str(directory / "merges.txt"),
                                                   settings)
        return TokenizerFiles("bpe", _cached_file("tokenizer.json", text), lower_case)
    looked_for = " or ".join(f"{name} ({_TOKENIZER_KINDS[kind]})" for name, kind in family.tokenizer_files)
    raise ValueError(f"{what}={path} has {family.name} weights but no {looked_for}, tokenizer.json, or vocab.json "
                     "and merges.txt (byte-level BPE), the tokenizers bertjax reads there: copy the tokenizer the "
                     "model was trained with into it")


def _cached_file(name: str, text: str) -> str:
    """`text` as the file `name` in bertjax's cache directory, keyed by its contents (the model's own
    directory is left as it is)."""
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
    path = epath.Path(files.cache_dir("vocabularies", key)) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.parent / f"{name}.tmp-{os.getpid()}"
        partial.write_text(text, encoding="utf-8")
        partial.rename(path)  # whole or not at all, whoever else writes it
    return str(path)
