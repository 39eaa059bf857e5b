"""Hugging Face checkpoints <-> bertjax, for every family, in both directions, without torch or transformers.

    cfg, params, missing = hf.load_hf_checkpoint("path/to/bert-base-uncased")   # or any family of FAMILIES
    hf.save_hf_checkpoint("exported/", cfg, params, vocab_path="vocab.txt")      # the family's own class

One API over the family records of `FAMILIES` (BERT, RoBERTa, ALBERT, ModernBERT, ELECTRA, MobileBERT;
hf_<model_type>.py, keyed by config.json's model_type): configs, state dicts, task heads and directories. A
directory's family is its config.json's model_type (`family_of`); a model's is the one whose class computes
its network (`family_of_config`). The conversion itself is hf_convert.py's, driven by the family's table;
the files are read and written by hf_files.py.

Task heads (bertjax/models/heads.py) map to each family's task classes (BertForSequenceClassification,
RobertaForQuestionAnswering, ModernBertForTokenClassification, ...): the encoder's rows of the table plus
the head's own, labels and problem_type in config.json as transformers' save_pretrained writes them.
"""

import hashlib
import json
import logging
import os
from pathlib import Path

import flax.linen as nn
import numpy as np
from etils import epath
from flax import traverse_util

from bertjax.interop import (hf_albert, hf_bert, hf_convert, hf_electra, hf_files, hf_mobilebert, hf_modernbert,
                             hf_roberta, hf_tokenizer)
from bertjax.interop.hf_family import HF_HEADS, Family, HFHead, TaskClass, changed_options  # noqa: F401
from bertjax.models.config import BertConfig, ARCHITECTURE_FIELDS
from bertjax.models import heads
from bertjax.text import files

log = logging.getLogger(__name__)

FAMILIES = {family.model_type: family for family in (hf_bert.BERT, hf_roberta.ROBERTA, hf_albert.ALBERT,
                                                     hf_modernbert.MODERNBERT, hf_electra.ELECTRA,
                                                     hf_mobilebert.MOBILEBERT)}


def family_of(hf_config: dict) -> Family:
    """The family of a config.json (its model_type; BERT where it has none, as the first releases)."""
    model_type = hf_config.get("model_type", "bert")
    if model_type not in FAMILIES:
        raise ValueError(f"config.json has model_type={model_type!r}: bertjax reads {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def family_of_config(cfg: BertConfig) -> Family:
    """The family whose transformers class computes this config's network: the one whose own options it
    sets (BERT: none). A mix of options no Hugging Face class has is a ValueError naming them."""
    changed = changed_options(cfg)
    claimed = [family for family in FAMILIES.values() if family.claims(cfg)]
    if len(claimed) != 1:
        raise ValueError(f"model options {changed} make a network no Hugging Face class has "
                         f"({', '.join(f.name for f in FAMILIES.values())}): export it with --format=params")
    family = claimed[0]
    if cfg.head_dim * cfg.num_heads != cfg.true_hidden_size:
        width = "intra_bottleneck_size" if cfg.intra_bottleneck_size else "hidden_size"
        raise ValueError(f"model.head_size={cfg.head_dim} x model.num_heads={cfg.num_heads} is not model.{width}="
                         f"{cfg.true_hidden_size}: Hugging Face classes have head size {width} / num_attention_heads")
    family.config_to_hf(cfg)  # raises, naming what the family cannot have
    others = [k for k in changed if k not in family.options]
    if others:
        raise ValueError(f"model options {others} are not {family.name}'s: no Hugging Face class has that "
                         "network; export it with --format=params")
    return family


# --------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------


def config_from_hf(hf_config: dict, **overrides) -> BertConfig:
    """A config.json (as a dict) of any family -> BertConfig; `overrides` set the fields the weights do
    not fix (dtype, scan_layers, remat_policy, dropout, ...). Rejects what the bertjax network cannot
    reproduce rather than loading it into a subtly different model."""
    known = {name for name in BertConfig.__dataclass_fields__}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown BertConfig field(s) {unknown} in the overrides: choose from {sorted(known)}")
    fields = family_of(hf_config).config_from_hf(hf_config)
    network = BertConfig(**fields)
    # What the network is comes from the checkpoint; how it is stored, computed and trained (dropout) may
    # be the run's own.
    clash = sorted(k for k, v in overrides.items() if k in ARCHITECTURE_FIELDS and v != getattr(network, k))
    if clash:
        raise ValueError(f"the overrides {clash} contradict the checkpoint's config.json")
    return BertConfig(**{**fields, **overrides})


def config_to_hf(cfg: BertConfig, kind: str | None = None, num_labels: int | None = None,
                 label_names: list[str] | None = None) -> dict:
    """BertConfig -> the config.json its family's pretraining class reads, or with a task `kind` (a key of
    heads.HEADS) the family's class for that task: its architecture, labels (id2label / label2id from
    label_names, default LABEL_i) and problem_type, as transformers' own save_pretrained writes them."""
    return _config_to_hf(family_of_config(cfg), cfg, kind, num_labels, label_names)


def _config_to_hf(family: Family, cfg: BertConfig, kind: str | None, num_labels: int | None,
                  label_names: list[str] | None) -> dict:
    # The dtype the weights are written in (the params' own): transformers 5 reads "dtype", 4.x "torch_dtype".
    hf_config = {**family.config_to_hf(cfg), "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype}
    if kind is not None:
        hf_config.update({**family.task_config(cfg), **_labels(kind, num_labels, label_names),
                          "architectures": [family.task_class(kind, cfg).architecture]})
    return hf_config


def _labels(kind: str, num_labels: int | None, label_names: list[str] | None) -> dict:
    spec = HF_HEADS[kind]
    out = {}
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


# --------------------------------------------------------------------------------------------------
# State dicts
# --------------------------------------------------------------------------------------------------


def hf_to_params(state: dict, cfg: BertConfig, seed: int = 0):
    """A state dict (name -> numpy array) of the config's family -> (bertjax params, missing).

    params: the plain BertForPreTraining params in cfg.param_dtype, in the layout cfg.scan_layers asks
    for. missing: the param paths the state dict lacks (the pooler and heads of a bare encoder, the
    pooler and NSP head of a masked-LM class), freshly initialised from `seed`. Every tensor's shape is
    checked against the config; a mismatch is a ValueError naming it.
    """
    return hf_convert.to_params(family_of_config(cfg), state, cfg, seed)


def params_to_hf(params: dict, cfg: BertConfig) -> dict:
    """bertjax BertForPreTraining params (boxed or plain, unrolled or scanned) -> the state dict of the
    family's pretraining class; params it has no name for (RoBERTa's pooler and NSP head) are left out,
    tied copies (the decoder) are not written, as transformers' own save_pretrained does."""
    return hf_convert.to_state(family_of_config(cfg), params, cfg)


def hf_to_head_params(state: dict, cfg: BertConfig, kind: str, num_labels: int | None = None,
                      seed: int = 0):
    """A state dict of the config's family -> (params of the `kind` head, missing), as hf_to_params.

    From the task's own class (RobertaForSequenceClassification for "classification", ...) everything
    loads; from a pretraining or bare encoder state dict the encoder loads and the classifier is fresh
    (in missing), its pretraining heads are left. num_labels: the classifier width where the kind does
    not fix it; None takes it from the state dict's classifier."""
    family = family_of_config(cfg)
    return _head_params(family, state, cfg, kind, num_labels, seed)


def _head_params(family: Family, state: dict, cfg: BertConfig, kind: str, num_labels: int | None,
                 seed: int = 0):
    weights = state.get(family.task_class(kind, cfg).classifier_bias)
    if num_labels is None and heads.head(kind).num_labels is None and weights is not None:
        num_labels = int(weights.shape[0])
    return hf_convert.to_params(family, state, cfg, seed, kind, heads.resolve_num_labels(kind, num_labels))


def head_params_to_hf(params: dict, cfg: BertConfig, kind: str) -> dict:
    """bertjax params of the `kind` head (boxed or plain, unrolled or scanned) -> the state dict of the
    family's class for it. The classes without a pooler (BERT's span and tagging) get none: ours goes
    unused."""
    return hf_convert.to_state(family_of_config(cfg), params, cfg, kind)


# --------------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------------


def _read_config(path: str | os.PathLike) -> dict:
    """A Hugging Face model directory's config.json."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory: it has no config.json")
    return json.loads((path / "config.json").read_text())


def load_hf_checkpoint(path: str | os.PathLike, model_config_overrides: dict | None = None):
    """A Hugging Face directory of any family -> (BertConfig, params, missing), as hf_to_params:
    model_config_overrides set the BertConfig fields the checkpoint does not fix (dtype, dropout,
    scan_layers, remat_policy, ...)."""
    hf_config = _read_config(path)
    cfg = config_from_hf(hf_config, **(model_config_overrides or {}))
    params, missing = hf_convert.to_params(family_of(hf_config), hf_files.read_hf_weights(path), cfg)
    return cfg, params, missing


def load_hf_head(path: str | os.PathLike, kind: str, num_labels: int | None = None,
                 model_config_overrides: dict | None = None):
    """A Hugging Face directory of any family -> (BertConfig, params of the `kind` head, missing).

    The directory of the task's own class loads whole; any other of the family (a pretraining class,
    another task's) gives the encoder, with a fresh classifier (in missing). ModernBERT's prediction head
    `head.` is its masked-LM class's too, and becomes the pooler, as transformers loads it."""
    hf_config = _read_config(path)
    family = family_of(hf_config)
    cfg = config_from_hf(hf_config, **(model_config_overrides or {}))
    task = family.task_class(kind, cfg)
    dropout = hf_config.get("classifier_dropout")
    if dropout not in (None, cfg.hidden_dropout_rate):
        # bertjax's heads drop out at the hidden rate, where HF's classifier_dropout falls back to.
        log.warning("%s sets classifier_dropout=%s: bertjax heads use hidden_dropout_rate=%s", path, dropout,
                    cfg.hidden_dropout_rate)
    pooling = hf_config.get("classifier_pooling", "cls")  # ModernBERT's: what its pooled classes pool
    if pooling != "cls" and HF_HEADS[kind].pooler:  # a kind that reads the pooled [CLS]
        if task.architecture in (hf_config.get("architectures") or []):
            raise ValueError(f"{path} was trained with classifier_pooling={pooling!r}: bertjax's heads pool "
                             "[CLS] only (classifier_pooling='cls'); fine-tune from its encoder's checkpoint")
        log.warning("%s says classifier_pooling=%r: the %r head pools [CLS] (its export says 'cls')",
                    path, pooling, kind)
    state = _task_state(path, hf_config, hf_files.read_hf_weights(path), kind, task, family.task_prefixes)
    params, missing = _head_params(family, state, cfg, kind, num_labels)
    return cfg, params, missing


def _task_state(path, hf_config: dict, state: dict, kind: str, task: TaskClass, head_prefixes: tuple) -> dict:
    """What a `kind` head reads of a directory's tensors: all of them when it is the kind's own class
    (its problem_type checked), else all but the tensors under `head_prefixes`, the task heads of the
    class it is (another task's classifier means nothing to this one)."""
    spec = HF_HEADS[kind]
    if task.architecture in (hf_config.get("architectures") or []):
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


def save_hf_checkpoint(path: str | os.PathLike, cfg: BertConfig, params: dict,
                       vocab_path: str | os.PathLike | None = None, lower_case: bool = True,
                       masked_lm_only: bool = False):
    """Write a directory that the family's pretraining class (BertForPreTraining, RobertaForMaskedLM,
    AlbertForPreTraining, ModernBertForMaskedLM) loads with nothing missing or unexpected.

    config.json, model.safetensors (the params' own dtype, tied decoder left out as transformers does
    itself) and, given a WordPiece vocabulary, vocab.txt plus a tokenizer_config.json (and for the
    families whose AutoTokenizer needs it, tokenizer.json) so that AutoTokenizer.from_pretrained(path)
    works too. masked_lm_only: the weights of the family's masked-LM class alone (BertForMaskedLM: no
    pooler, no NSP head), which AutoModelForMaskedLM and the fill-mask pipeline load without reporting
    unused weights (transformers 5 reports every one).
    """
    family = family_of_config(cfg)
    _check_vocabulary(cfg, vocab_path)
    state, hf_config = hf_convert.to_state(family, params, cfg), _config_to_hf(family, cfg, None, None, None)
    if masked_lm_only:
        state = {k: v for k, v in state.items() if not k.startswith(family.not_in_masked_lm)}
        hf_config["architectures"] = [family.masked_lm]
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case, family.tokenizer_json)


def save_hf_encoder(path: str | os.PathLike, cfg: BertConfig, params: dict,
                    vocab_path: str | os.PathLike | None = None, lower_case: bool = True):
    """Write the family's bare encoder class (BertModel, RobertaModel, AlbertModel, ModernBertModel), as
    AutoModel loads it for feature extraction (a sentence-transformers Transformer module): the encoder's
    tensors of the pretraining class, without its prefix; the pretraining heads are left out."""
    family = family_of_config(cfg)
    _check_vocabulary(cfg, vocab_path)
    state = hf_convert.to_state(family, params, cfg, encoder_only=True)
    # The encoder class's pooler where the pretraining class has none (RoBERTa's): its multiple-choice
    # class has it under the encoder's name.
    flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
    for name, param, transform in family.task_classes["multiple_choice"].rows:
        if name.startswith(family.base) and param.startswith("bert/pooler") and name not in state and param in flat:
            state[name] = np.ascontiguousarray(transform.to_hf(np.asarray(flat[param])))
    state = {name[len(family.base):]: x for name, x in state.items() if name.startswith(family.base)}
    hf_config = _config_to_hf(family, cfg, None, None, None)
    # transformers names every family's classes alike: <Model>For<Task>, and the encoder <Model>Model.
    hf_config["architectures"] = [family.task_classes["classification"].architecture.split("For")[0] + "Model"]
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case, family.tokenizer_json)


def save_hf_head(path: str | os.PathLike, cfg: BertConfig, params: dict, kind: str,
                 label_names: list[str] | None = None, vocab_path: str | os.PathLike | None = None,
                 lower_case: bool = True):
    """Write a directory that the family's class for `kind` (and AutoModelFor... of that task) loads
    with no missing or unexpected weight: as save_hf_checkpoint, for a task head's params; its
    config.json carries the labels and problem_type."""
    family = family_of_config(cfg)
    family.task_class(kind, cfg)  # first: a kind without a transformers class (contrastive) is one line
    _check_vocabulary(cfg, vocab_path)
    state = hf_convert.to_state(family, params, cfg, kind)
    num_labels = int(state[family.task_class(kind, cfg).classifier_bias].shape[0])
    hf_config = _config_to_hf(family, cfg, kind, num_labels if heads.head(kind).num_labels is None else None,
                              label_names)
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case, family.tokenizer_json)


def _check_vocabulary(cfg: BertConfig, vocab_path) -> None:
    """Positions numbered after the pad token (RoBERTa's position_offset = pad_token_id + 1) need the
    vocabulary's pad there."""
    pad = cfg.position_offset - 1
    if pad >= 0 and vocab_path is not None:
        tokens = Path(vocab_path).read_text(encoding="utf-8").split("\n")
        if pad < len(tokens) and tokens[pad] not in ("[PAD]", "<pad>"):
            # HF numbers positions from its pad_token_id (offset - 1): that token would be taken for padding.
            log.warning("model.position_offset=%d makes pad_token_id %d, which is %r in %s: transformers will "
                        "number positions wrongly after it; train with position_offset = [PAD]'s id + 1",
                        cfg.position_offset, pad, tokens[pad], vocab_path)


# --------------------------------------------------------------------------------------------------
# The tokenizer of a Hugging Face directory
# --------------------------------------------------------------------------------------------------

_TOKENIZER_KINDS = {"wordpiece": "WordPiece", "sentencepiece": "SentencePiece"}


def tokenizer_of(path: str, what: str, lower_case: bool = False) -> tuple[str, str, bool]:
    """(kind, local file, lower-cases) of a directory's tokenizer: the first of the family's tokenizer files
    (hf_family.Family.tokenizer_files) it has, else its tokenizer.json (transformers 5 saves no vocab.txt:
    WordPiece's vocabulary, or byte-level BPE as it is), else RoBERTa's vocab.json and merges.txt as a
    tokenizer.json. Unless its tokenizer config says otherwise WordPiece lower-cases, as the original
    releases; lower_case: a sentence-transformers module that lower-cases the text itself."""
    directory = epath.Path(path)
    family = family_of(json.loads((directory / "config.json").read_text()))
    settings = {}
    if (directory / "tokenizer_config.json").exists():
        settings = json.loads((directory / "tokenizer_config.json").read_text())
    for name, kind in family.tokenizer_files:
        if (directory / name).exists():
            return kind, str(directory / name), lower_case or bool(settings.get("do_lower_case", True))
    if (directory / "tokenizer.json").exists():
        found = str(directory / "tokenizer.json")
        if hf_tokenizer.model_type(found) == "BPE":
            return "bpe", found, lower_case
        tokens, lowers = hf_tokenizer.read_wordpiece_tokenizer(found)
        return ("wordpiece", _cached_file("vocab.txt", "".join(token + "\n" for token in tokens)),
                lower_case or bool(settings.get("do_lower_case", lowers)))
    if (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        text = hf_tokenizer.roberta_tokenizer_json(str(directory / "vocab.json"), str(directory / "merges.txt"),
                                                   settings)
        return "bpe", _cached_file("tokenizer.json", text), lower_case
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
