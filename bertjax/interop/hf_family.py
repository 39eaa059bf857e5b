"""What a Hugging Face model family is to bertjax: the `Family` record, and the pieces its tables are
written with.

A family (BERT, RoBERTa, ALBERT, ModernBERT, ELECTRA, MobileBERT: one module each, hf_<model_type>.py) is
the one encoder with options (models/bert.py BertConfig) plus a record: its config.json translation, its
name table, the tensors tied to others, its task classes and the tokenizer files bertjax reads from its
directories. The conversion itself (hf_convert.py) and the public functions (hf.py) are the same for
every family.

A table row is (HF tensor name, bertjax param path, transform). Rows with {i} repeat for every
parameter group of the stack (a layer, or ALBERT's shared group); rows with {j} for each of a MobileBERT
layer's feed-forward networks before its last (model.num_feedforward_networks - 1).

Layouts differ in two ways only, both exact, so HF -> bertjax -> HF is bit-exact:
  * torch.nn.Linear stores weight [out, in] and computes x @ W.T; flax Dense stores kernel [in, out].
  * bertjax keeps the attention heads as their own axes ([H, N, D] and [N, D, H] kernels), so that the
    "heads" axis can be sharded; Hugging Face concatenates them head-major into one H-wide axis (its
    view(B, S, N, D) after the projection), which is a plain reshape of ours.

Shape legend: H hidden, N heads, D head size H/N, F feed-forward, V vocabulary, E embedding, K outputs.
"""

import dataclasses
from typing import Callable

import numpy as np


from bertjax.models.config import BertConfig, FAMILY_OPTIONS
from bertjax.models import heads
from bertjax.tasks import kinds

# --------------------------------------------------------------------------------------------------
# Transforms between the two layouts
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Transform:
    """How one tensor changes layout; the three functions must agree (each other's inverse / shape)."""

    name: str
    to_bertjax: Callable[[np.ndarray, tuple], np.ndarray]  # HF array, bertjax shape -> bertjax array
    to_hf: Callable[[np.ndarray], np.ndarray]  # bertjax array -> HF array
    hf_shape: Callable[[tuple], tuple]  # bertjax shape -> the HF shape (the shape checks, both directions)


COPY = Transform("copy", lambda x, shape: x, lambda p: p, lambda shape: tuple(shape))
# torch Linear weight [out, in] <-> flax Dense kernel [in, out].
LINEAR = Transform("linear", lambda x, shape: x.T, lambda p: p.T, lambda shape: tuple(shape[::-1]))
# q/k/v projection: Linear weight [N*D, H] <-> kernel [H, N, D]; HF's heads are head-major (C order).
QKV_KERNEL = Transform(
    "qkv_kernel",
    lambda x, shape: x.T.reshape(shape),  # [N*D, H] -> [H, N*D] -> [H, N, D]
    lambda p: p.reshape(p.shape[0], -1).T,  # [H, N, D] -> [H, N*D] -> [N*D, H]
    lambda shape: (shape[1] * shape[2], shape[0]),
)
# q/k/v bias [N*D] <-> [N, D].
QKV_BIAS = Transform("qkv_bias", lambda x, shape: x.reshape(shape), lambda p: p.reshape(-1),
                     lambda shape: (shape[0] * shape[1],))
# Attention output: Linear weight [H, N*D] <-> kernel [N, D, H] (contracting heads and D).
ATTENTION_OUT_KERNEL = Transform(
    "attention_out_kernel",
    lambda x, shape: x.T.reshape(shape),  # [H, N*D] -> [N*D, H] -> [N, D, H]
    lambda p: p.reshape(-1, p.shape[-1]).T,  # [N, D, H] -> [N*D, H] -> [H, N*D]
    lambda shape: (shape[2], shape[0] * shape[1]),
)

# --------------------------------------------------------------------------------------------------
# Task kinds and their classes
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HFHead:
    """What a task kind is in transformers, whatever the family: BERT's class for it (the other
    families' are named alike), and how its config.json describes it."""

    architecture: str  # BERT's class, written to config.json's "architectures"
    prefix: str  # BERT's head dense layer: <prefix>.weight [K, H], <prefix>.bias [K]
    pooler: bool  # whether the class reads the pooled [CLS] (the per-token classes are built without a pooler)
    labels: bool  # whether id2label / label2id describe the K outputs (the class reads num_labels)
    problem_type: str | None  # what transformers' loss should be for this kind, where it asks
    auto_class: str  # the AutoModelFor... class that loads it (the model card's example)


# One per task kind that has a transformers class, read from the kind's own record (bertjax/tasks/kinds/);
# keyed like heads.HEADS (contrastive has none: its export is the encoder and its pooling).
HF_HEADS = {name: HFHead(**kind.hf_class) for name, kind in kinds.KINDS.items() if kind.hf_class is not None}


@dataclasses.dataclass(frozen=True)
class TaskClass:
    """A task kind's transformers class in one family and the rows of its head: the pooler's where the
    class has one, then the classifier's (bertjax's `classifier`), as Family.table's rows."""

    architecture: str  # e.g. "RobertaForSequenceClassification"
    rows: tuple  # (HF name, bertjax path, transform)

    @property
    def pooler(self) -> bool:
        """Whether the class has bertjax's pooler; where not, bertjax computes it unused (nor written)."""
        return any(path.startswith("bert/pooler") for _, path, _ in self.rows)

    @property
    def classifier_bias(self) -> str:
        """The HF name of the classifier's bias [K], whose length is the head's width."""
        return next(hf_name for hf_name, path, _ in self.rows if path == "classifier/bias")


def _same(state: dict, cfg: BertConfig) -> dict:
    return state


@dataclasses.dataclass(frozen=True)
class Family:
    """What differs between the families' HF checkpoints; the conversion is the same for all."""

    model_type: str  # config.json's model_type
    name: str  # as people write it, for messages ("RoBERTa")
    architecture: str  # the pretraining class written (and read whole)
    base: str  # the encoder's prefix in that class ("roberta."): a bare encoder checkpoint lacks it
    heads: tuple  # prefixes of the pretraining heads' tensors (not under `base`)
    table: tuple  # (HF name, bertjax path, transform); {i}: each parameter group; {j}: each extra FFN
    tied: dict  # HF name -> the HF name it is a copy of (accepted if equal, never written)
    config_from_hf: Callable[[dict], dict]  # config.json -> BertConfig fields
    config_to_hf: Callable[[BertConfig], dict]  # BertConfig -> config.json; raises on what it cannot have
    task_classes: dict  # task kind (HF_HEADS) -> TaskClass
    claims: Callable[[BertConfig], bool]  # whether a config has this family's own options
    options: tuple = ()  # the FAMILY_OPTIONS it may set; the others keep BERT's values
    # The tokenizer files bertjax reads from a directory of this family, (file name, tokenizer kind), in
    # the order they are looked for.
    tokenizer_files: tuple = (("vocab.txt", "wordpiece"),)
    masked_lm: str = ""  # the masked-LM class (save_hf_checkpoint's masked_lm_only)
    not_in_masked_lm: tuple = ()  # prefixes of the pretraining class's tensors the masked-LM class lacks
    to_table: Callable[[dict, BertConfig], dict] = _same  # HF tensors -> the table's names
    from_table: Callable[[dict, BertConfig], dict] = _same  # the table's names -> HF tensors
    poolers: tuple = ("tanh",)  # the model.pooler values its task classes compute (POOLERS)
    task_config: Callable[[BertConfig], dict] = lambda cfg: {}  # a task class's config.json fields
    # Whether an export writes the WordPiece vocabulary as a tokenizer.json too (AutoTokenizer reads only
    # that for ModernBERT's model_type; BERT's builds its tokenizer from vocab.txt).
    tokenizer_json: bool = True

    def task_class(self, kind: str, cfg: BertConfig) -> TaskClass:
        """The class for a task kind, whose head the config must compute."""
        heads.head(kind)  # an unknown kind: one line listing the known ones
        if kind not in self.task_classes:
            raise ValueError(f"a {kind!r} model has no transformers task class: export its encoder and pooling as "
                             "a sentence-transformers directory, or its params (--format=params)")
        task = self.task_classes[kind]
        if cfg.pooler not in self.poolers:
            needed = " or ".join(repr(pooler) for pooler in self.poolers)
            raise ValueError(f"a {self.model_type} {kind!r} head needs model.pooler={needed} (what "
                             f"{task.architecture} computes), not {cfg.pooler!r}")
        return task

    @property
    def task_prefixes(self) -> tuple:
        """The prefixes of the task classes' head tensors outside the encoder that no pretraining class has
        ("classifier.", "qa_outputs."; not ModernBERT's "head.", its masked-LM class's head too)."""
        prefixes = {name.split(".")[0] + "." for task in self.task_classes.values() for name, _, _ in task.rows
                    if not name.startswith(self.base)}
        return tuple(sorted(prefixes - set(self.heads)))


# --------------------------------------------------------------------------------------------------
# Rows the families' tables share
# --------------------------------------------------------------------------------------------------


def linear(hf_prefix: str, path: str) -> tuple:
    """The rows of a torch Linear (<hf_prefix>.weight [out, in], .bias) <-> a flax Dense (<path>/kernel, /bias)."""
    return ((f"{hf_prefix}.weight", f"{path}/kernel", LINEAR), (f"{hf_prefix}.bias", f"{path}/bias", COPY))


def embeddings(prefix: str, word: str = "word_embeddings", norm: str = "LayerNorm") -> tuple:
    """The word, position and segment tables [V, H], [P, H], [T, H] and their norm."""
    bj = "bert/embeddings/"
    return (
        (f"{prefix}{word}.weight", bj + "word_embeddings/embedding", COPY),
        (f"{prefix}position_embeddings.weight", bj + "position_embeddings/embedding", COPY),
        (f"{prefix}token_type_embeddings.weight", bj + "token_type_embeddings/embedding", COPY),
        (f"{prefix}{norm}.weight", bj + "layer_norm/scale", COPY),
        (f"{prefix}{norm}.bias", bj + "layer_norm/bias", COPY),
    )


def post_norm_block(hf_layer: str, attention: str, names: dict) -> tuple:
    """The rows of a BERT-style post-LN block (self-attention, then feed-forward H -> F -> H, each followed
    by its LayerNorm) under a family's names for its parts."""
    bj = "bert/encoder/layers_{i}/"
    rows = []
    for part in ("query", "key", "value"):
        rows += [(f"{hf_layer}{attention}{names[part]}.weight", f"{bj}attention/{part}/kernel", QKV_KERNEL),
                 (f"{hf_layer}{attention}{names[part]}.bias", f"{bj}attention/{part}/bias", QKV_BIAS)]
    return tuple(rows) + (
        (f"{hf_layer}{names['output']}.weight", f"{bj}attention/output/kernel", ATTENTION_OUT_KERNEL),
        (f"{hf_layer}{names['output']}.bias", f"{bj}attention/output/bias", COPY),
        (f"{hf_layer}{names['attention_norm']}.weight", f"{bj}attention_layer_norm/scale", COPY),
        (f"{hf_layer}{names['attention_norm']}.bias", f"{bj}attention_layer_norm/bias", COPY),
        (f"{hf_layer}{names['intermediate']}.weight", f"{bj}mlp/intermediate/kernel", LINEAR),
        (f"{hf_layer}{names['intermediate']}.bias", f"{bj}mlp/intermediate/bias", COPY),
        (f"{hf_layer}{names['mlp_output']}.weight", f"{bj}mlp/output/kernel", LINEAR),
        (f"{hf_layer}{names['mlp_output']}.bias", f"{bj}mlp/output/bias", COPY),
        (f"{hf_layer}{names['mlp_norm']}.weight", f"{bj}mlp_layer_norm/scale", COPY),
        (f"{hf_layer}{names['mlp_norm']}.bias", f"{bj}mlp_layer_norm/bias", COPY),
    )


def mlm_head(dense: str, norm: str, bias: str) -> tuple:
    """The masked-LM head: transform dense H -> H, activation, norm; the output bias [V] (its decoder is tied
    to the word embeddings on both sides)."""
    return linear(dense, "mlm_head/transform") + (
        (f"{norm}.weight", "mlm_head/layer_norm/scale", COPY),
        (f"{norm}.bias", "mlm_head/layer_norm/bias", COPY),
        (bias, "mlm_head/output_bias", COPY),
    )


def task_classes(model: str, *, sequence: tuple, multiple_choice: tuple, span: tuple, tagging: tuple) -> dict:
    """kind -> TaskClass, given each class's head rows; transformers names a family's task classes as
    BERT's, <Model>For<Task>."""
    return {"classification": TaskClass(f"{model}ForSequenceClassification", sequence),
            "regression": TaskClass(f"{model}ForSequenceClassification", sequence),
            "multiple_choice": TaskClass(f"{model}ForMultipleChoice", multiple_choice),
            "span": TaskClass(f"{model}ForQuestionAnswering", span),
            "tagging": TaskClass(f"{model}ForTokenClassification", tagging),
            "rerank": TaskClass(f"{model}ForSequenceClassification", sequence)}  # one score a pair


def changed_options(cfg: BertConfig) -> list[str]:
    """The family options (FAMILY_OPTIONS) the config sets to other than BERT's values."""
    defaults = BertConfig()
    return sorted(k for k in FAMILY_OPTIONS if getattr(cfg, k) != getattr(defaults, k))
