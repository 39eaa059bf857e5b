"""The compression variants of a fine-tuning run (bertjax/runs/finetuning.py): the model each compresses
loaded and checked against the task, the start and the train step each gives the run.

    theseus_start, theseus_step   module replacing (theseus.predecessor; bertjax/compression/theseus.py): the
                                  model trained, evaluated and saved is the successor, the predecessor's
                                  layers an argument of the step
    task_teacher, distillation_step, with_projections
                                  task distillation (distill.teacher; bertjax/compression/distillation.py):
                                  the teacher inside the jitted step; a narrower student's projections to
                                  the teacher's width trained with it and saved beside the optimizer state
    student_config, bilstm_start, bilstm_student, augmented_data
                                  a BiLSTM student (distill.student=bilstm; bertjax/models/bilstm.py) in place
                                  of the fine-tuned encoder, and the paper's augmented training data
                                  (distill.augment_copies; bertjax/tasks/augmentation.py)
"""

import dataclasses
import math

import ml_collections

from bertjax.compression import distillation, projections, theseus
from bertjax import init_from
from bertjax.models import bilstm, heads
from bertjax.runs import config_checks
from bertjax.runs.console import say
from bertjax.runs.task_data import TaskData, TaskStart, task_from_config
from bertjax.tasks import augmentation
from bertjax.tasks import batches as task_batches
from bertjax.training.state import Setup


def replaces_modules(config) -> bool:
    """Whether the run is module replacing's (theseus.predecessor set)."""
    return bool(config.get("theseus") and config.theseus.predecessor)


def check_fine_tuned(model: init_from.Pretrained, task, what: str) -> None:
    """The model a run compresses (`what`: the setting naming it) is an encoder fine-tuned on this task, with
    its classifier and its tokenizer; or one line why not."""
    saved = model.task
    if model.meta is not None and bilstm.from_record(model.meta.distill) is not None:
        raise ValueError(f"{what} is a BiLSTM student (task distillation), not a fine-tuned encoder: give the workdir "
                         "of a BERT fine-tuned on the task")
    if (model.meta is not None and (saved is None or (saved.kind, list(saved.labels)) != (
            task.kind, list(task.labels)))) or any(m.startswith("classifier") for m in model.missing):
        raise ValueError(f"{what} is not a model fine-tuned on {task.name} ({task.kind}, labels {list(task.labels)}): "
                         "give the workdir of that fine-tuning")
    if (saved is not None and saved.feature_based) or model.tokenizer is None:
        raise ValueError(f"{what}: a fine-tuned encoder with its tokenizer is needed (not a feature-based tagger)")


# --------------------------------------------------------------------------------------------------
# Module replacing (BERT-of-Theseus)
# --------------------------------------------------------------------------------------------------


def theseus_start(config, task, num_labels: int) -> tuple[TaskStart, init_from.Pretrained]:
    """Module replacing's start: theseus.predecessor (fine-tuned on this task) checked and loaded, and the
    successor made of its embeddings, first M layers, pooler and head (the model this run trains and saves)."""
    settings = config.theseus
    theseus.replace_rate(settings.replace_rate, settings.replace_rate_start, settings.replace_rate_slope)
    if config.get("distill") and config.distill.teacher:
        raise ValueError("theseus.predecessor and distill.teacher are two ways to compress: set one of them")
    if task.kind not in theseus.TASK_KINDS or config.get("feature_based", {}).get("enabled"):
        raise ValueError(f"theseus.predecessor: module replacing fine-tunes {', '.join(theseus.TASK_KINDS)} tasks, "
                         f"not {task.kind}{' (feature-based)' if task.kind in theseus.TASK_KINDS else ''}")
    what = f"theseus.predecessor={settings.predecessor}"
    start = init_from.resolve(settings.predecessor, "theseus.predecessor")
    theseus.check_predecessor(start.config, settings.successor_layers, what)  # before any weight is read
    predecessor = init_from.load(start, model_overrides=config.model.to_dict(), head=task.kind, num_labels=num_labels)
    check_fine_tuned(predecessor, task, what)
    tokenizer = predecessor.tokenizer.load()
    if tokenizer.vocab_size > predecessor.config.vocab_size:
        raise ValueError(f"the vocabulary of {settings.predecessor} has {tokenizer.vocab_size} tokens but its model "
                         f"only {predecessor.config.vocab_size}: a checkpoint of another vocabulary size")
    successor = theseus.successor_config(predecessor.config, settings.successor_layers)
    params = theseus.successor_params(predecessor.params, predecessor.config, successor)
    say(f"task {task.name} ({task.kind}); module replacing: {predecessor.config.num_layers} layers of "
        f"{settings.predecessor} -> {successor.num_layers} (hidden {successor.hidden_size}), each module of "
        f"{predecessor.config.num_layers // successor.num_layers} replaced with p = " + (
            f"{settings.replace_rate:g}" if settings.replace_rate_slope is None else
            f"min(1, {settings.replace_rate_start:g} + {settings.replace_rate_slope:g} x step)"))
    return TaskStart(successor, params, tokenizer, predecessor.tokenizer, whole_head=True), predecessor


def theseus_step(config, task, num_labels: int, predecessor: init_from.Pretrained, setup: Setup,
                 data_sharding):
    """Module replacing's train step (theseus.task_step), its rate, draws and accumulation from the config."""
    settings = config.theseus
    rate = theseus.replace_rate(settings.replace_rate, settings.replace_rate_start, settings.replace_rate_slope)
    example = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    return theseus.task_step(setup, predecessor.params, predecessor.config, task.kind, num_labels, example, rate,
                             config.train.seed, data_sharding, config.train.grad_accum_steps)


# --------------------------------------------------------------------------------------------------
# Task distillation
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TaskTeacher:
    """Task distillation's teacher (distill.teacher, fine-tuned on this task) and the losses it teaches with."""

    model: init_from.Pretrained
    layer_losses: distillation.LayerLosses
    layer_map: tuple  # the teacher layer of each student layer (distillation.teacher_layer_map's g)
    projections: tuple  # what a narrower student learns to the teacher's width (distillation.projection_names')


def task_teacher(config, task, num_labels: int, start_from: TaskStart) -> TaskTeacher | None:
    """distill.teacher loaded and checked against the task and the student (start_from); None without one."""
    settings = config.get("distill")
    if not settings or not settings.teacher:
        return None
    distillation.check_task_distillation(task.kind, settings.temperature, settings.alpha)
    teacher = init_from.load(init_from.resolve(settings.teacher, "distill.teacher"),
                             model_overrides=config.model.to_dict(), head=task.kind, num_labels=num_labels)
    check_fine_tuned(teacher, task, f"distill.teacher={settings.teacher}")
    distillation.check_same_vocabulary(start_from.files.vocab_path, teacher.tokenizer.vocab_path, "distill.teacher")
    layer_losses = distillation.LayerLosses.from_config(settings)
    student = start_from.bert_config
    layer_map = distillation.check_layer_losses(layer_losses, student, teacher.config)
    names = distillation.projection_names(layer_losses, student, teacher.config)
    weighed = "".join(f", {k} {getattr(layer_losses, k):g}" for k in layer_losses.alphas()
                      if getattr(layer_losses, k) > 0)
    say(f"distilling from {settings.teacher} ({teacher.config.num_layers} layers, hidden "
        f"{teacher.config.hidden_size}): alpha {settings.alpha:g}, temperature {settings.temperature:g}{weighed}")
    return TaskTeacher(teacher, layer_losses, layer_map, names)


def distillation_step(config, task, num_labels: int, teacher: TaskTeacher, setup: Setup, data_sharding):
    """Task distillation's train step (distillation.task_distillation_step): the teacher's logits (and recorded
    layers) on each batch inside the jitted step, its params placed as the student's are and an argument of
    the step (never trained or saved); a narrower student's projections, in the state's params, trained with it."""
    teacher_net = heads.network(task.kind, teacher.model.config, num_labels)
    example = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    teacher_params = distillation.place_params(teacher_net, example, teacher.model.params, setup.mesh, setup.rules)
    return distillation.task_distillation_step(setup, teacher_net, teacher_params, task.kind,
                                               float(config.distill.temperature), float(config.distill.alpha),
                                               data_sharding, config.train.grad_accum_steps, teacher.layer_losses,
                                               teacher.layer_map,
                                               soft_loss="mse" if student_of(config) == bilstm.STUDENT else "kl")


def with_projections(prepare_params, config, start_from: TaskStart, teacher: TaskTeacher, init_key):
    """prepare_params, then the projections a student narrower than its teacher trains (none at the same
    width): those init_from's distillation learned (TinyBERT's task stage after its general one), else fresh."""
    student, width = start_from.bert_config, teacher.model.config.hidden_size
    source = config.train.init_from or config.get("init_from")  # init_from_path(config), said once already
    saved = teacher.projections and projections.saved_projections(source, teacher.projections,
                                                                   student.hidden_size, width)
    if saved:
        say(f"the projections ({', '.join(saved)}) start from those {source} learned")
    return projections.adding_projections(teacher.projections, student.hidden_size, width,
                                           student.initializer_range, init_key, prepare_params, start=saved or None)


# --------------------------------------------------------------------------------------------------
# The BiLSTM student (Tang et al. 2019) and augmented data
# --------------------------------------------------------------------------------------------------

STUDENTS = ("bert", bilstm.STUDENT)


def student_of(config) -> str:
    """distill.student: "bert" (the model train.init_from names, fine-tuned) or "bilstm"."""
    settings = config.get("distill")
    student = settings.get("student", "bert") if settings else "bert"
    if student not in STUDENTS:
        raise ValueError(f"distill.student={student!r}: choose one of {', '.join(STUDENTS)}")
    return student


def augmentation_settings(config) -> augmentation.Settings | None:
    """distill.augment_* as augmentation.Settings (checked), or None where distill.augment_copies is 0."""
    settings = config.get("distill")
    if not settings or not settings.get("augment_copies", 0):
        return None
    return augmentation.Settings(
        copies=settings.augment_copies, p_mask=settings.augment_p_mask, p_pos=settings.augment_p_pos,
        p_ng=settings.augment_p_ng, max_ngram=settings.augment_max_ngram, band=settings.augment_band)


def student_config(config):
    """The config a task distillation with a BiLSTM student or augmented data runs with, checked before anything
    is read or written (one line per thing to change): data.packing off (the BiLSTM reads a row as one sentence
    or a pair, and the copies' gold weights ride on unpacked rows); a BiLSTM's train.init_from the teacher, whose
    vocabulary and tokenizer it reads (its weights start fresh). Any other config as it is."""
    student, augmented = student_of(config), augmentation_settings(config)
    if student == "bert" and augmented is None:
        return config
    settings = config.distill
    what = "distill.student=bilstm" if student == bilstm.STUDENT else f"distill.augment_copies={augmented.copies}"
    if not settings.teacher:
        raise ValueError(f"{what} learns from a teacher's logits: set distill.teacher to a workdir fine-tuned on the "
                         "task")
    config_checks.check_path(settings.teacher, "distill.teacher")  # said as itself, not as the init_from set below
    kind = task_from_config(config).kind
    if student == bilstm.STUDENT:
        if kind not in bilstm.TASK_KINDS:
            raise ValueError(f"distill.student=bilstm: the BiLSTM student makes {' and '.join(bilstm.TASK_KINDS)} "
                             f"logits, not those of task {config.task} ({kind}): distil a BERT student "
                             "(distill.student=bert) for it")
        if distillation.LayerLosses.from_config(settings).on:
            raise ValueError("distill.student=bilstm has no transformer layers to compare with the teacher's: set "
                             "distill.alpha_embedding, alpha_hidden, alpha_attention and alpha_pkd to 0")
        if (config.train.init_from or config.get("init_from")) not in (None, "", settings.teacher):
            raise ValueError("distill.student=bilstm starts from fresh weights over distill.teacher's vocabulary: "
                             "unset train.init_from")
        if config.get("sweep"):
            raise ValueError("config.sweep tries optimizer.learning_rate values, which a BiLSTM student does not read "
                             "(distill.bilstm_learning_rate): set config.sweep=False")
        bilstm.BiLSTMConfig(vocab_size=1, num_labels=1, embedding_size=settings.bilstm_embedding_size,
                            hidden_size=settings.bilstm_hidden_size, mlp_size=settings.bilstm_mlp_size,
                            dropout_rate=settings.bilstm_dropout_rate)  # its settings checked now
        if not settings.bilstm_learning_rate > 0:
            raise ValueError(f"distill.bilstm_learning_rate={settings.bilstm_learning_rate!r} must be positive")
    if augmented is not None and kind not in augmentation.TASK_KINDS:
        raise ValueError(f"distill.augment_copies augments sentences and pairs ({', '.join(augmentation.TASK_KINDS)} "
                         f"tasks), not task {config.task} ({kind}): set distill.augment_copies=0")
    if config.data.get("packing"):
        raise ValueError(f"{what} reads unpacked rows: set data.packing=False (or leave it unset)")
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.packing = False
    if student == bilstm.STUDENT:
        config.train.init_from = settings.teacher
    return config


def bilstm_start(config, task, num_labels: int) -> tuple[TaskStart, TaskTeacher]:
    """A BiLSTM student's start: distill.teacher (fine-tuned on this task) checked and loaded, and the student's
    record of the model it starts from: the teacher's tokenizer and config (its vocabulary and positions, which
    the student's rows share), and no weights."""
    settings = config.distill
    distillation.check_task_distillation(task.kind, settings.temperature, settings.alpha)
    teacher = init_from.load(init_from.resolve(settings.teacher, "distill.teacher"),
                             model_overrides=config.model.to_dict(), head=task.kind, num_labels=num_labels)
    check_fine_tuned(teacher, task, f"distill.teacher={settings.teacher}")
    say(f"task {task.name} ({task.kind}{', labels ' + ', '.join(task.labels) if task.labels else ''}); distilling "
        f"from {settings.teacher} ({teacher.config.num_layers} layers, hidden {teacher.config.hidden_size}) into a "
        f"BiLSTM (embeddings {settings.bilstm_embedding_size}, {settings.bilstm_hidden_size} units each way, MLP "
        f"{settings.bilstm_mlp_size}): alpha {settings.alpha:g}, the logits' squared distance")
    start = TaskStart(teacher.config, {}, teacher.tokenizer.load(), teacher.tokenizer, whole_head=False)
    return start, TaskTeacher(teacher, distillation.LayerLosses(), (), ())


def bilstm_student(config, start_from: TaskStart, num_labels: int, train) -> bilstm.BiLSTMConfig:
    """The BiLSTM's shape: the distill section's widths, the teacher's vocabulary, and the siamese form where the
    training split (a scoring.Split) has sentence pairs."""
    pairs = any(e.text_pair is not None for e in train.examples)
    if pairs and start_from.tokenizer.template.second_segment == 0:
        raise ValueError("distill.student=bilstm reads a pair's sentences apart by their segment ids, which the "
                         "teacher's tokenizer leaves 0 for both (RoBERTa's template): distil a BERT student for pairs")
    settings = config.distill
    return bilstm.BiLSTMConfig(vocab_size=start_from.bert_config.vocab_size, num_labels=num_labels,
                               embedding_size=settings.bilstm_embedding_size, hidden_size=settings.bilstm_hidden_size,
                               mlp_size=settings.bilstm_mlp_size, pairs=pairs,
                               dropout_rate=settings.bilstm_dropout_rate)


def augmented_data(config, tokenizer, data: TaskData) -> TaskData:
    """The run's data with the training split augmented (augmentation.augmented_features; deterministic from
    train.seed) and its steps counted anew over the copies too: config.train.epochs over every row."""
    settings = augmentation_settings(config)
    train = data.train
    features, stats = augmentation.augmented_features(train.features, train.examples, tokenizer,
                                                      config.data.max_seq_length, settings, config.train.seed)
    rows, batch_size = task_batches.num_examples(features), config.train.batch_size
    num_steps = task_batches.num_train_steps(rows, batch_size, config.train.epochs)
    words = max(stats["words"], 1)
    say(f"augmented: {stats['kept']} copies of {stats['examples']} examples kept of {stats['copies']} drawn "
        f"({100 * stats['masked'] / words:.1f}% of their words masked, {100 * stats['swapped'] / words:.1f}% swapped, "
        f"{stats['ngrams']} cut to n-grams); {num_steps} steps of {batch_size} over {rows} rows "
        f"({config.train.epochs:g} epochs)")
    return dataclasses.replace(data, train=dataclasses.replace(train, features=features), num_steps=num_steps,
                               steps_per_epoch=math.ceil(rows / batch_size))
