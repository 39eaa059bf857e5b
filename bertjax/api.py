"""`bertjax.load(path)`: a trained BERT in a notebook, in one line.

    bert = bertjax.load("path/to/bert-base-uncased")   # a Hugging Face BERT directory
    out = bert.encode(["The cat sat.", "A longer second sentence."])
    out["sequence_output"]  # [B, S, H] numpy, one row per text, right-padded

`load` tries each known kind of model directory in turn (see `_SOURCES`); a new kind (the bertjax
checkpoint/workdir written by `python -m bertjax.train`) is one more entry there, with a function that
returns a `LoadedBert`.

Shape legend (as in bertjax/model.py): B batch, S sequence length, H hidden size, L layers.
"""

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from etils import epath

from bertjax import hf
from bertjax import workdir as workdirs
from bertjax import model as bert_model


def _make_tokenizer(vocab_path: Path, lower_case: bool, kind: str = "wordpiece"):
    """The project's tokenizer (WordPiece or SentencePiece), with TensorFlow kept off the accelerators.

    The tokenizer runs TF ops eagerly; left alone, TF would claim every visible GPU's memory on its
    first op, which the JAX model next to it in the same notebook needs.
    """
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        pass  # TF was initialised already (by the caller): its device choice stands.
    from bertjax.text.tokenizers import load_tokenizer

    return load_tokenizer(kind, str(vocab_path), lower_case=lower_case)


@dataclasses.dataclass
class LoadedBert:
    """A BERT model ready for inference: config, BertForPreTraining params and tokenizer."""

    config: bert_model.BertConfig
    params: dict  # plain BertForPreTraining params ("bert", "mlm_head", "nsp_head")
    tokenizer: Any  # bertjax.text.tokenizers.WordPieceTokenizer
    source: str = ""  # where it was loaded from, for repr and error messages
    missing: list[str] = dataclasses.field(default_factory=list)  # params the checkpoint lacked
    _forward: Callable = dataclasses.field(init=False, repr=False)

    def __repr__(self) -> str:
        c = self.config
        return (f"LoadedBert({self.source or 'in memory'}: {c.num_layers} layers, hidden {c.hidden_size}, "
                f"{c.num_heads} heads, vocabulary {c.vocab_size}, {bert_model.count_params(self.params):,} "
                f"parameters, {c.dtype})")

    def __post_init__(self):
        # On the default device once, rather than copied from the host at every call.
        self.params = jax.device_put(self.params)
        module = bert_model.BertModel(self.config)

        def forward(bert_params, input_ids, segment_ids, input_mask):
            return module.apply(
                {"params": bert_params}, input_ids, segment_ids, input_mask,
                deterministic=True, output_hidden_states=True,
            )

        # Compiled once per padded length S; a notebook typically sees few distinct lengths.
        self._forward = jax.jit(forward)

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict[str, np.ndarray]:
        """[CLS] text [SEP] per text, truncated to max_length (default max_position_embeddings) and
        right-padded to the longest in the batch -> input_ids, segment_ids, input_mask, each [B, S]."""
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise ValueError("encode needs at least one text")
        limit = self.config.max_position_embeddings if max_length is None else max_length
        if not 2 <= limit <= self.config.max_position_embeddings:
            raise ValueError(
                f"max_length={limit} must be between 2 (room for [CLS] and [SEP]) and the model's "
                f"max_position_embeddings={self.config.max_position_embeddings}"
            )
        tok = self.tokenizer
        rows = [[tok.cls_id, *ids[: limit - 2], tok.sep_id] for ids in tok.encode(list(texts))]
        seq_len = max(len(row) for row in rows)
        input_ids = np.full((len(rows), seq_len), tok.pad_id, np.int32)  # [B, S]
        input_mask = np.zeros((len(rows), seq_len), np.int32)  # [B, S], 1 at real tokens
        for b, row in enumerate(rows):
            input_ids[b, : len(row)] = row
            input_mask[b, : len(row)] = 1
        # One segment: BERT's segment 0 is the first (here the only) sentence.
        return {"input_ids": input_ids, "segment_ids": np.zeros_like(input_ids), "input_mask": input_mask}

    def encode(self, texts: list[str], max_length: int | None = None) -> dict:
        """Encoder outputs for a batch of texts, as float32 numpy arrays.

        Returns sequence_output [B, S, H], pooled_output [B, H], hidden_states (L+1 arrays [B, S, H],
        the embedding output first), and the input_ids and input_mask [B, S] that were fed in.
        Positions where input_mask is 0 are padding: their outputs carry no meaning.
        """
        batch = self.tokenize(texts, max_length)
        out = self._forward(self.params["bert"], batch["input_ids"], batch["segment_ids"], batch["input_mask"])
        out = jax.device_get(out)
        as_np = lambda x: np.asarray(x, np.float32)  # noqa: E731  (bfloat16 compute -> float32 for numpy users)
        return {
            "sequence_output": as_np(out["sequence_output"]),
            "pooled_output": as_np(out["pooled_output"]),
            "hidden_states": [as_np(h) for h in out["hidden_states"]],
            "input_ids": batch["input_ids"],
            "input_mask": batch["input_mask"],
        }


# --------------------------------------------------------------------------------------------------
# Sources: each knows one kind of model directory
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Source:
    description: str  # what such a directory contains, for the error when nothing matches
    matches: Callable[[Path], bool]
    load: Callable[[Path, str], LoadedBert]


def _is_hf_directory(path: Path) -> bool:
    return (path / "config.json").is_file() and hf.find_weights(path) is not None


def _load_hf_directory(path: Path, dtype: str) -> LoadedBert:
    vocab_path = path / "vocab.txt"
    if not vocab_path.is_file():
        raise ValueError(f"{path} has BERT weights but no vocab.txt: copy the model's WordPiece vocabulary there")
    # Uncased unless the tokenizer config says otherwise, as for the original BERT releases.
    lower_case = True
    tokenizer_config = path / "tokenizer_config.json"
    if tokenizer_config.is_file():
        lower_case = bool(json.loads(tokenizer_config.read_text()).get("do_lower_case", True))
    cfg, params, missing = hf.load_hf_checkpoint(path, {"dtype": dtype})
    return LoadedBert(cfg, params, _make_tokenizer(vocab_path, lower_case), source=str(path), missing=missing)


def _is_bertjax_checkpoint(path: Path) -> bool:
    from bertjax import checkpoint

    return checkpoint.is_checkpoint(str(path))


def _load_bertjax_checkpoint(path: Path, dtype: str) -> LoadedBert:
    """The newest checkpoint of a training workdir (or a checkpoints/ or step directory): its params,
    the model config and the tokenizer recorded with it."""
    from bertjax import checkpoint

    params, meta = checkpoint.restore_params(str(path))
    # The run's workdir: the parent of its checkpoints/ directory, wherever the workdir is now.
    workdir = str(epath.Path(checkpoint.find_checkpoint(str(path))[0]).parent)
    # How it was computed in training (cuDNN attention on a GPU, say) is chosen anew for this machine.
    cfg = bert_model.BertConfig.from_dict(dict(meta["model"], dtype=dtype, attention_impl="auto",
                                               word_embedding="auto", remat_policy="none"))
    info = meta.get("tokenizer")
    if not info:
        raise ValueError(f"{path} was trained on synthetic data and has no tokenizer: load it with "
                         f"bertjax.checkpoint.restore_params instead")
    # Recorded relative to the workdir (older checkpoints: an absolute path).
    vocab_path = workdirs.resolve_vocabulary(info["path"], workdir)
    if not epath.Path(vocab_path).exists():
        raise ValueError(f"{path}: its vocabulary {vocab_path} is gone; put it back there to load the model")
    tokenizer = _make_tokenizer(workdirs.local_copy(vocab_path), info["lower_case"], kind=info["kind"])
    return LoadedBert(cfg, params, tokenizer, source=str(path))


# The order is the order of trial.
_SOURCES = (
    _Source(
        "a bertjax training workdir, its checkpoints/ directory or one step's directory",
        _is_bertjax_checkpoint,
        _load_bertjax_checkpoint,
    ),
    _Source(
        "a Hugging Face BERT directory (config.json, model.safetensors / model.safetensors.index.json / "
        "pytorch_model.bin, vocab.txt)",
        _is_hf_directory,
        _load_hf_directory,
    ),
)


def load(path: str | os.PathLike, dtype: str = "float32") -> LoadedBert:
    """Loads a BERT for inference. `dtype` is the compute dtype ("bfloat16" on accelerators);
    the params stay in float32."""
    # A URL (gs://bucket/run) stays one: pathlib would turn it into a local path "gs:/bucket/run".
    path = epath.Path(path) if workdirs.is_remote(str(path)) else Path(path).expanduser()
    if not path.exists():
        raise ValueError(f"bertjax.load: {path} does not exist")
    for source in _SOURCES:
        if source.matches(path):
            return source.load(path, dtype)
    expected = "; or ".join(source.description for source in _SOURCES)
    raise ValueError(f"bertjax.load: {path} is not a model directory it can read: expected {expected}")
