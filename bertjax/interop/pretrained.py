"""The one init-from: a bertjax workdir or checkpoint, or a Hugging Face directory, to a model config,
its parameters and its tokenizer's files.

Pretraining (`train.init_from`), fine-tuning (`init_from`), `bertjax.load` and `python -m bertjax.export`
all read starting weights through `load`, so that every program accepts the same paths and says the
same thing when one is wrong.
"""

import dataclasses
import json
from typing import Any

from etils import epath

from bertjax.interop import hf, hf_families, hf_files
from bertjax.models import bert as bert_model
from bertjax.training import checkpoint
from bertjax.text import files
from bertjax.training import workdir as workdirs

BERTJAX = "bertjax"
HUGGING_FACE = "hugging_face"


@dataclasses.dataclass(frozen=True)
class TokenizerFiles:
    """What builds the tokenizer a model was trained with (the TensorFlow tokenizer is made on demand)."""

    kind: str  # "wordpiece" | "sentencepiece"
    vocab_path: str  # a local file
    lower_case: bool

    def load(self):
        from bertjax.text import tokenizers

        return tokenizers.load_tokenizer(self.kind, self.vocab_path, lower_case=self.lower_case)


@dataclasses.dataclass
class Pretrained:
    config: bert_model.BertConfig
    params: Any  # BertForPreTraining params, or a task head's ({"bert", "classifier"})
    tokenizer: TokenizerFiles | None  # None: a run on synthetic data
    source: str
    meta: dict  # a bertjax checkpoint's meta (step, model, task, ...); {} for Hugging Face
    missing: list[str]  # params the source lacked, freshly initialised (Hugging Face only)

    @property
    def task(self) -> dict | None:
        return self.meta.get("task")


def kind_of(path: str) -> str | None:
    """BERTJAX, HUGGING_FACE, or None when `path` is neither."""
    if model_checkpoint(path) is not None:
        return BERTJAX
    # A bertjax workdir has a config.json too (the run's config): the weights tell a HF directory apart.
    if (epath.Path(path) / "config.json").exists() and hf_files.find_weights(path) is not None:
        return HUGGING_FACE
    return None


def model_checkpoint(path: str) -> str | None:
    """The checkpoint a workdir stands for: a fine-tuning workdir's best dev checkpoint, else its newest."""
    best = epath.Path(path) / checkpoint.BEST_DIR
    if best.is_dir() and checkpoint.is_checkpoint(str(best)):
        return str(best)
    return path if checkpoint.is_checkpoint(path) else None


def load(path: str, *, what: str = "init_from", model_overrides: dict | None = None, head: str | None = None,
         num_labels: int | None = None, abstract_params=None, tokenizer: bool = True) -> Pretrained:
    """The model at `path`. `what` names the setting in error messages. model_overrides set the compute
    fields the weights do not fix (dtype, attention_impl, scan_layers, ...). head: a task kind whose
    head params to read from a Hugging Face directory (a bertjax checkpoint holds what it was trained
    with). abstract_params (ShapeDtypeStructs with shardings): restore straight into that layout."""
    path = str(path)
    if not path:
        raise ValueError(f"{what} is empty: give a bertjax workdir or checkpoint, or a Hugging Face BERT directory")
    if not epath.Path(path).exists():
        raise FileNotFoundError(f"{what}={path} does not exist")
    kind = kind_of(path)
    overrides = bert_model.resolve_platform(dict(model_overrides or {}))  # "auto" compute fields for this machine
    if kind == BERTJAX:
        return _from_bertjax(model_checkpoint(path), what, overrides, abstract_params)
    if kind == HUGGING_FACE:
        return _from_hugging_face(path, overrides, head, num_labels, abstract_params, tokenizer)
    raise FileNotFoundError(f"{what}={path} is neither a bertjax workdir/checkpoint nor a Hugging Face BERT "
                            f"directory (config.json and model.safetensors or pytorch_model.bin)")


def tokenizer_files(path: str, what: str = "init_from") -> TokenizerFiles | None:
    """Only the tokenizer of the model at `path` (no weights read); None for a run on synthetic data."""
    kind = kind_of(path)
    if kind == BERTJAX:
        chosen = model_checkpoint(path)
        return _bertjax_tokenizer(chosen, checkpoint.read_meta(chosen), what)
    if kind == HUGGING_FACE:
        return TokenizerFiles("wordpiece", *hf_vocabulary(path))
    raise FileNotFoundError(f"{what}={path} is neither a bertjax workdir/checkpoint nor a Hugging Face BERT directory")


def _bertjax_tokenizer(path: str, meta: dict, what: str) -> TokenizerFiles | None:
    info = meta.get("tokenizer")
    if not info:
        return None
    # Recorded relative to the run's workdir (older checkpoints: an absolute path).
    vocab = workdirs.resolve_vocabulary(info["path"], checkpoint.workdir_of(path))
    if not epath.Path(vocab).exists():
        raise ValueError(f"{what}={path}: its vocabulary {vocab} is gone; put it back there")
    return TokenizerFiles(info["kind"], files.local_copy(vocab), bool(info["lower_case"]))


def _from_bertjax(path: str, what: str, model_overrides: dict, abstract_params) -> Pretrained:
    params, meta = checkpoint.restore_params(path, abstract_params)
    config = bert_model.BertConfig.from_dict({**meta["model"], **model_overrides})
    return Pretrained(config, params, _bertjax_tokenizer(path, meta, what), path, meta, [])


def _from_hugging_face(path: str, model_overrides: dict, head: str | None, num_labels: int | None,
                       abstract_params, tokenizer: bool) -> Pretrained:
    model_type = json.loads((epath.Path(path) / "config.json").read_text()).get("model_type", "bert")
    if model_type in hf_families.FAMILIES:  # RoBERTa, ALBERT, ModernBERT: options of the one encoder
        return _from_family(path, model_overrides, head, num_labels, abstract_params, tokenizer)
    # Before the weights: a missing vocabulary is found at once.
    vocabulary = TokenizerFiles("wordpiece", *hf_vocabulary(path)) if tokenizer else None
    if head is None:
        config, params, missing = hf.load_hf_checkpoint(path, model_config_overrides=model_overrides)
    else:
        config, params, missing = hf.load_hf_head(path, head, num_labels, model_config_overrides=model_overrides)
    if abstract_params is not None:
        import jax

        params = jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))
    return Pretrained(config, params, vocabulary, path, {}, missing)


def _from_family(path: str, model_overrides: dict, head: str | None, num_labels: int | None, abstract_params,
                 tokenizer: bool) -> Pretrained:
    """A RoBERTa, ALBERT or ModernBERT directory (interop/hf_families.py), as pretraining params or a task
    head's. Their BPE / SentencePiece tokenizer files are not read by bertjax: a WordPiece vocab.txt
    beside them is, else none."""
    vocabulary = None
    if tokenizer and (epath.Path(path) / "vocab.txt").exists():
        vocabulary = TokenizerFiles("wordpiece", *hf_vocabulary(path))
    if head is None:
        config, params, missing = hf_families.load_hf_checkpoint(path, model_config_overrides=model_overrides)
    else:
        config, params, missing = hf_families.load_hf_head(path, head, num_labels,
                                                           model_config_overrides=model_overrides)
    if abstract_params is not None:
        import jax

        params = jax.device_put(params, jax.tree_util.tree_map(lambda a: a.sharding, abstract_params))
    return Pretrained(config, params, vocabulary, path, {}, missing)


def hf_vocabulary(path: str) -> tuple[str, bool]:
    """A Hugging Face BERT directory's vocab.txt and whether it lower-cases: uncased unless its
    tokenizer config says otherwise, as for the original releases."""
    directory = epath.Path(path)
    if not (directory / "vocab.txt").exists():
        raise ValueError(f"{path} has BERT weights but no vocab.txt: copy the model's WordPiece vocabulary there")
    lower_case = True
    if (directory / "tokenizer_config.json").exists():
        lower_case = bool(json.loads((directory / "tokenizer_config.json").read_text()).get("do_lower_case", True))
    return str(directory / "vocab.txt"), lower_case
