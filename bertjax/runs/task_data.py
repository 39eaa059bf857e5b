"""A fine-tuning run's task and data, read from its config: the task, the record of the model it starts
from (TaskStart), its splits as features (the user's JSON-lines files or TFDS), the run's length in steps,
and how training steps are packed."""

import dataclasses
import math

import jax
import numpy as np

from bertjax import inference
from bertjax import init_from
from bertjax.models import heads
from bertjax.models.config import BertConfig
from bertjax.runs.console import say
from bertjax.runs.start import Layout
from bertjax.tasks import batches as task_batches
from bertjax.tasks import contrastive_batches, kinds, registry, rerank_batches, scoring


def task_from_config(config):
    labels = list(config.data.labels) if config.data.labels else None
    contrastive, rerank = config.get("contrastive"), config.get("rerank")
    return registry.get_task(config.task, labels=labels, num_choices=config.data.num_choices,
                             squad_version=config.data.get("squad_version"),
                             contrastive_loss=contrastive.loss if contrastive else None,
                             rerank_loss=rerank.loss if rerank else None)


@dataclasses.dataclass
class TaskStart:
    """What init_from gives a task: the encoder's config and params (or a whole head of this task's
    shape, from a fine-tuning checkpoint or the task's Hugging Face class), and the tokenizer."""

    bert_config: BertConfig
    params: dict  # {"bert": ...} at least
    tokenizer: object
    files: init_from.TokenizerFiles
    whole_head: bool  # params carry a classifier of this task (continue fine-tuning)


def feature_based_settings(config, task, num_layers: int) -> dict | None:
    """config.feature_based as heads.network takes it, checked against the model's layers; None when off."""
    settings = config.get("feature_based")
    if not settings or not settings.enabled:
        return None
    if not kinds.get(task.kind).feature_based:
        having = [name for name, kind in kinds.KINDS.items() if kind.feature_based]
        raise ValueError(f"config.feature_based is for {' and '.join(having)} tasks; task {task.name} is {task.kind}")
    out = {"layers": tuple(int(layer) for layer in settings.layers), "lstm_size": int(settings.lstm_size),
           "lstm_layers": int(settings.lstm_layers)}
    states = num_layers + 1  # the embeddings, then each layer
    if any(not -states <= layer < states for layer in out["layers"]):
        raise ValueError(f"config.feature_based.layers={out['layers']}: the model has hidden states "
                         f"0..{states - 1} (0 the embeddings), or -1..-{states} from the last")
    return out


# The kinds whose rows are cut at the length featurize is given; span QA's windows and contrastive pairs take
# their lengths from their own settings.
EVAL_LENGTH_KINDS = (registry.CLASSIFICATION, registry.REGRESSION, registry.MULTIPLE_CHOICE, registry.TAGGING)


def eval_length(config, task) -> int:
    """The length dev and test rows are cut at, and the one bertjax.load's predict uses:
    data.eval_max_seq_length (train short, evaluate long), else data.max_seq_length."""
    data = config.data
    length = data.get("eval_max_seq_length")
    if length is None:
        return data.max_seq_length
    if not isinstance(length, int) or length < 3:
        raise ValueError(f"data.eval_max_seq_length={length!r}: a whole number of tokens (at least 3), or unset to "
                         f"evaluate at data.max_seq_length")
    if task.kind not in EVAL_LENGTH_KINDS:
        raise ValueError(f"data.eval_max_seq_length is for {', '.join(EVAL_LENGTH_KINDS)} tasks; task {task.name} "
                         f"is {task.kind}, whose lengths are its own settings: unset it")
    return length


def split_features(task, tokenizer, config) -> tuple:
    """(train Split, {dev split: Split}, {test split: Split}) of the task (bertjax.tasks.scoring.Split:
    examples and features, by the task's kind), from the user's files where config.data names them, else
    from TFDS; dev and test rows at eval_length. A contrastive task may have no dev split (its last step's
    model is then the model); every other kind needs one."""
    data, kind = config.data, kinds.get(task.kind)
    dev_length = eval_length(config, task)
    settings = kind.settings_from_config(config)

    def read(split_name, file, labeled=True, length=dev_length):
        examples = kind.read(task, split_name, path=file, data_dir=data.tfds_data_dir, labeled=labeled)
        features = kind.featurize(task, examples, tokenizer, length, settings)
        return scoring.Split(examples, features, labeled)

    if not data.train and task.train_split is None:
        raise ValueError(f"task {task.name} has no training split of its own: set config.data.train to a JSON-lines "
                         "file")
    train = read("train" if data.train else task.train_split, data.train, length=data.max_seq_length)
    if data.validation:
        dev = {"validation": read("validation", data.validation)}
    elif task.tfds_name is not None:
        dev = {split: read(split, None) for split in task.eval_splits}
    elif task.kind == registry.CONTRASTIVE:  # as sentence-transformers without an evaluator: the last step's model
        dev = {}
    else:
        raise ValueError(f"task {task.name} needs a dev set to evaluate on: set config.data.validation to a "
                         "JSON-lines file")
    if data.test:
        test = {"test": read("test", data.test, labeled=False)}
    elif task.tfds_name is not None and not data.train:
        test = {split: read(split, None, labeled=False) for split in task.test_splits}
    else:
        test = {}
    if getattr(settings, "distill", False):
        add_teacher_targets(settings.teacher, [train, *dev.values()])
    return train, dev, test


def add_teacher_targets(teacher: str, splits: list) -> None:
    """contrastive distill_mse: the teacher's embeddings of each example's target text (its own pooling,
    Dense, normalisation and prompts: LoadedBert.embed), added to each split's features as target float32
    [N, Dt]; the teacher loaded once."""
    try:
        model = inference.load(teacher)
    except (ValueError, OSError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"contrastive.teacher={teacher} does not load: {first}") from None
    for split in splits:
        split.features["target"] = np.asarray(model.embed([e.positive for e in split.examples]), np.float32)
    say(f"teacher {teacher}: {sum(len(s.examples) for s in splits)} texts embedded, "
        f"{splits[0].features['target'].shape[-1]} features each")


@dataclasses.dataclass
class TaskData:
    """The task's splits as features, the kind's settings, and the run's length in steps."""

    train: object  # scoring.Split
    dev: dict  # split name -> scoring.Split
    test: dict
    settings: object  # the kind's own (span: squad.Settings), or None
    num_steps: int
    steps_per_epoch: int
    packing: "Packing | None" = None  # packed training batches, or None


@dataclasses.dataclass(frozen=True)
class Packing:
    """How training steps are packed (bertjax/tasks/batches.py): num_rows rows of up to max_sequences."""

    num_rows: int  # R: the rows of a (global) packed step
    max_sequences: int  # K


def packing_settings(config, task, feature_based: bool) -> tuple[int, int | None] | None:
    """(max_sequences_per_row, packed_rows or None) when config.data.packing is on, checked; else None."""
    data = config.data
    packing = data.get("packing", None)
    if packing is None:  # unset: wherever it applies
        packing = heads.head(task.kind).packable and not feature_based
    if not isinstance(packing, bool):
        raise ValueError(f"data.packing={packing!r}: True or False (or unset: where it applies)")
    if not packing:
        return None
    if not heads.head(task.kind).packable:
        packable = [kind for kind, h in heads.HEADS.items() if h.packable]
        raise ValueError(f"data.packing packs {', '.join(packable)} tasks; task {task.name} is {task.kind} "
                         "(see docs/data.md, Packing in fine-tuning): set data.packing=False")
    if feature_based:
        raise ValueError("data.packing and feature_based.enabled exclude each other: the BiLSTM would read "
                         "across the sequences of a row")
    k = data.max_sequences_per_row
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"data.max_sequences_per_row={k!r}: a positive integer")
    rows = data.get("packed_rows")
    if rows is not None and (not isinstance(rows, int) or rows < 1):
        raise ValueError(f"data.packed_rows={rows!r}: a positive integer, or unset to derive it")
    return k, rows


def check_lengths(config, task, model) -> None:
    """The training and evaluation rows within the model's (a BertConfig's) positions: said before the first
    step, not at the first evaluation."""
    positions = model.max_position_embeddings - model.position_offset
    for key, length in (("max_seq_length", config.data.max_seq_length),
                        ("eval_max_seq_length", eval_length(config, task))):
        if length > positions:
            raise ValueError(f"data.{key}={length} is longer than the {positions} positions of the model "
                             f"(its model.max_position_embeddings): at most {positions}")


def task_data(config, task, tokenizer, model, layout: Layout | None = None) -> TaskData:
    """Every split read and featurized; the steps of config.train.epochs over the training rows; with
    data.packing the rows of a packed step (derived: the most any step of the run needs, rounded up to
    what the data-parallel devices and processes divide). model: the BertConfig whose positions the rows
    must fit (checked after the data's own mistakes are said)."""
    packing = packing_settings(config, task, bool(config.get("feature_based") and config.feature_based.enabled))
    train_split, dev_splits, test_splits = split_features(task, tokenizer, config)
    check_lengths(config, task, model)
    batch_size = config.train.batch_size
    num_train = task_batches.num_examples(train_split.features)
    num_steps = task_batches.num_train_steps(num_train, batch_size, config.train.epochs)
    dev_sizes = "".join(f", {len(s.examples)} {split}" for split, s in dev_splits.items())
    rows = "" if num_train == len(train_split.examples) else f" in {num_train} rows"
    say(f"{len(train_split.examples)} training examples{rows}{dev_sizes}; {num_steps} steps of {batch_size} "
        f"({config.train.epochs:g} epochs)")
    if not dev_splits:
        say(f"no dev set (data.validation unset): training all {num_steps} steps, the last step's model kept as the "
            "model (best/), as sentence-transformers keeps its last without an evaluator")
    packed = None
    if packing:
        rows_of = {registry.CONTRASTIVE: packed_text_rows, registry.RERANK: packed_pair_rows}.get(task.kind,
                                                                                               packed_rows)
        packed = rows_of(config, train_split.features, num_steps, *packing, layout=layout)
    return TaskData(train_split, dev_splits, test_splits, kinds.get(task.kind).settings_from_config(config),
                    num_steps, math.ceil(num_train / batch_size), packed)


def contrastive_chunks(config) -> int:
    """The GradCache microbatches of a contrastive step (1: the batch at once)."""
    microbatch = config.train.get("contrastive_microbatch", 0) or 0
    if not isinstance(microbatch, int) or microbatch < 0 or (microbatch and config.train.batch_size % microbatch):
        raise ValueError(f"train.contrastive_microbatch={microbatch!r} must divide train.batch_size="
                         f"{config.train.batch_size} (0: the whole batch at once)")
    return config.train.batch_size // microbatch if microbatch else 1


def packed_text_rows(config, features: dict, num_steps: int, max_sequences: int, rows: int | None, *,
                     layout: Layout | None = None) -> Packing:
    """A contrastive run's Packing (its texts share rows: bertjax/tasks/contrastive_batches.py):
    data.packed_rows as set, or derived and said in one line."""
    batch_size, k = config.train.batch_size, contrastive_chunks(config)
    per_microbatch = contrastive_batches.packed_rows_needed(
        features, batch_size, config.train.seed, num_steps, max_sequences=max_sequences, num_chunks=k)
    if rows is not None and rows % k:
        raise ValueError(f"data.packed_rows={rows} is not divisible by the {k} microbatches of "
                         f"train.contrastive_microbatch={config.train.contrastive_microbatch}")
    if rows is not None and rows // k < per_microbatch:  # said now, not at the step that overflows
        raise ValueError(f"data.packed_rows={rows}: some step's texts need {per_microbatch * k} rows of "
                         f"{contrastive_batches.row_width(features)} ({k} microbatch(es) of {per_microbatch}): raise "
                         "it (or leave it unset to derive it)")
    if rows is None:
        unit = math.lcm(layout.data_parallel_size if layout is not None else 1, jax.process_count())
        rows = k * (-(-per_microbatch // unit) * unit)
        width = contrastive_batches.row_width(features)
        lengths = contrastive_batches.text_lengths(features)
        real = sum(float(np.sum(v)) for v in lengths.values()) / len(features["query_ids"]) * batch_size
        unpacked = sum(float(features[f"{role}_ids"][..., 0].size) * features[f"{role}_ids"].shape[-1]
                       for role in lengths) / len(features["query_ids"]) * batch_size
        say(f"packing: the texts of {batch_size} pairs a step in {rows} rows of {width} (about "
            f"{100 * real / (rows * width):.0f}% real tokens; unpacked {100 * real / unpacked:.0f}%)")
    if layout is not None:
        layout.check_batch(rows, k)
    return Packing(rows, max_sequences)


def packed_pair_rows(config, features: dict, num_steps: int, max_sequences: int, rows: int | None, *,
                     layout: Layout | None = None) -> Packing:
    """A rerank run's Packing (the pairs of its queries share rows: bertjax/tasks/rerank_batches.py):
    data.packed_rows as set, or derived and said in one line."""
    batch_size, width = config.train.batch_size, config.data.max_seq_length
    if config.train.grad_accum_steps != 1:
        raise ValueError("a rerank task packs the pairs of a step's queries together: set train.grad_accum_steps=1 "
                         "(or data.packing=False)")
    if rows is None:
        needed = rerank_batches.packed_rows_needed(features, batch_size, config.train.seed, num_steps,
                                                   max_sequences=max_sequences)
        unit = math.lcm(layout.data_parallel_size if layout is not None else 1, jax.process_count())
        rows = -(-needed // unit) * unit
        lengths = rerank_batches.pair_lengths(features)
        real = float(np.sum(lengths * features["label_weight"].reshape(-1))) / len(features["input_ids"]) * batch_size
        unpacked = batch_size * features["label_weight"].shape[1] * width
        say(f"packing: the pairs of {batch_size} queries a step in {rows} rows of {width} (about "
            f"{100 * real / (rows * width):.0f}% real tokens; unpacked {100 * real / unpacked:.0f}%)")
    if layout is not None:
        layout.check_batch(rows, 1)
        layout.check_batch(batch_size, 1)
    return Packing(rows, max_sequences)


def packed_rows(config, features: dict, num_steps: int, max_sequences: int, rows: int | None, *,
                layout: Layout | None = None) -> Packing:
    """The Packing of the run: data.packed_rows as set, or derived and said in one line."""
    batch_size, k = config.train.batch_size, config.train.grad_accum_steps
    lengths = task_batches.example_lengths(features)
    if rows is None:
        per_microbatch = task_batches.packed_rows_needed(
            lengths, batch_size, config.train.seed, num_steps, max_seq_length=config.data.max_seq_length,
            max_sequences=max_sequences, grad_accum_steps=k)
        unit = layout.data_parallel_size if layout is not None else 1
        unit = math.lcm(unit, jax.process_count())
        rows = k * (-(-per_microbatch // unit) * unit)
        real = float(np.sum(lengths)) / len(lengths) * batch_size
        say(f"packing: {batch_size} examples a step in {rows} rows of {config.data.max_seq_length} (about "
            f"{100 * real / (rows * config.data.max_seq_length):.0f}% real tokens; unpacked "
            f"{100 * real / (batch_size * config.data.max_seq_length):.0f}%)")
    if layout is not None:
        layout.check_batch(rows, k)
    return Packing(rows, max_sequences)

