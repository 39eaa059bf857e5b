"""What a checkpoint says about its run, beside its arrays: one record every writer and reader uses.

Stored as the checkpoint's `meta` item (JSON). Every section but `step` and `model` is optional, so a
checkpoint written by any kind of run (pretraining, distillation, fine-tuning, pruning) and by earlier
versions reads back; keys this version does not know are kept in `extra` and written back unchanged.
"""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer a run read its text with; `path` relative to the run's workdir (older checkpoints:
    absolute), so that a copied workdir still loads."""

    kind: str  # "wordpiece" | "sentencepiece" | "bpe"
    path: str
    lower_case: bool


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """The task a fine-tuned model was trained on: what bertjax.load, export and a resume read back."""

    name: str
    kind: str
    labels: tuple = ()
    num_choices: int | None = None
    max_seq_length: int | None = None
    squad_version: str | None = None
    feature_based: dict | None = None
    squad_settings: dict | None = None
    null_threshold: float = 0.0  # SQuAD v2.0: the no-answer threshold the dev set chose

    def __post_init__(self):
        object.__setattr__(self, "labels", tuple(self.labels or ()))


@dataclasses.dataclass(frozen=True)
class EmbeddingRecord:
    """How a model turns texts into sentence embeddings (bertjax/models/pooling.py): what embedding,
    retrieval evaluation and the sentence-transformers export read back."""

    modes: tuple = ("mean",)  # pooling modes, concatenated in this order
    normalize: bool = False  # L2-normalised embeddings
    dense: dict | None = None  # {"features", "bias", "activation"}: a projection after pooling, or None
    prompts: dict = dataclasses.field(default_factory=dict)  # name -> text, e.g. {"query": "query: "}
    default_prompt_name: str | None = None
    include_prompt: bool = True  # False: a prompt's tokens are left out of pooling
    max_seq_length: int | None = None
    # Queries' own limit (prompt_name="query"; sentence-transformers' Transformer.query_length), or None.
    max_query_length: int | None = None
    similarity: str = "cosine"  # "cosine" | "dot" | "maxsim"
    # What a text becomes: "dense" (pooled token states), "splade" (a weight per vocabulary token,
    # bertjax/models/sparse.py) or "colbert" (a vector per token, bertjax/models/multivector.py); SPLADE's
    # queries: "splade" (the encoder's) or "static" (the token table).
    representation: str = "dense"
    splade_query: str = "splade"
    # ColBERT: bertjax/tasks/multivector_texts.py's MultiVectorTexts fields (markers, lengths, expansion,
    # skiplist) and "dim", the projection's width; None for every other representation.
    multivector: dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "modes", tuple(self.modes))
        object.__setattr__(self, "prompts", dict(self.prompts or {}))


def _known(cls, fields: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in fields.items() if k in names}


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
    step: int
    model: dict  # the BertConfig's fields (models.config.BertConfig.from_dict reads them)
    optimizer: dict | None = None  # the config's optimizer section
    schedule: dict | None = None  # pretraining: the config's schedule section and train.num_steps
    data: dict | None = None  # pretraining: what decides the stream besides the step (runs.pretraining)
    tokenizer: TokenizerRecord | None = None  # None: a run on synthetic data
    task: TaskRecord | None = None  # fine-tuning
    best: dict | None = None  # fine-tuning: the best dev result so far (step, value, metrics)
    distill: dict | None = None  # distillation: the teacher and the layers the student started from
    quantize: str | None = None  # a params export whose params are int8: the mode (bertjax.compression.quantize)
    embedding: EmbeddingRecord | None = None  # a sentence-embedding model: its pooling, prompts, similarity
    # ELECTRA pretraining: the generator's BertConfig fields and the discriminator's loss weight
    # ({"model": ..., "discriminator_weight": ...}); `model` above is then the discriminator's.
    electra: dict | None = None
    # Pretraining: the run's whole config as it ran (config.to_dict()), which a new phase started from this
    # checkpoint compares its own with (runs/pretraining.py's phase line).
    config: dict | None = None
    extra: dict = dataclasses.field(default_factory=dict)  # keys of other versions, kept as they were

    def to_json(self) -> dict:
        out = {"step": int(self.step), "model": _plain(self.model)}
        for name in ("optimizer", "schedule", "data", "best", "distill", "quantize", "electra", "config"):
            if getattr(self, name) is not None:
                out[name] = _plain(getattr(self, name))
        if self.tokenizer is not None:
            out["tokenizer"] = dataclasses.asdict(self.tokenizer)
        if self.task is not None:
            out["task"] = _plain(dataclasses.asdict(self.task))
        if self.embedding is not None:
            out["embedding"] = _plain(dataclasses.asdict(self.embedding))
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, meta: dict) -> "CheckpointMeta":
        meta = dict(meta)
        tokenizer, task, embedding = meta.pop("tokenizer", None), meta.pop("task", None), meta.pop("embedding", None)
        known = _known(cls, meta)
        extra = {k: v for k, v in meta.items() if k not in known}
        return cls(**{**known, "extra": extra},
                   tokenizer=TokenizerRecord(**_known(TokenizerRecord, tokenizer)) if tokenizer else None,
                   task=TaskRecord(**_known(TaskRecord, task)) if task else None,
                   embedding=EmbeddingRecord(**_known(EmbeddingRecord, embedding)) if embedding else None)

    def replace(self, **changes) -> "CheckpointMeta":
        return dataclasses.replace(self, **changes)


def _plain(value: Any) -> Any:
    """JSON's own types: tuples as lists, dataclasses as dicts, numpy scalars as numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value
