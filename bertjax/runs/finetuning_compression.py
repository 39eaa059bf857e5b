"""The compression variants of a fine-tuning run (bertjax/runs/finetuning.py): the model each compresses
loaded and checked against the task, the start and the train step each gives the run.

    theseus_start, theseus_step   module replacing (theseus.predecessor; bertjax/compression/theseus.py): the
                                  model trained, evaluated and saved is the successor, the predecessor's
                                  layers an argument of the step
    task_teacher, distillation_step, with_projections
                                  task distillation (distill.teacher; bertjax/compression/distillation.py):
                                  the teacher inside the jitted step; a narrower student's projections to
                                  the teacher's width trained with it and saved beside the optimizer state
"""

import dataclasses

from bertjax.compression import distillation, projections, theseus
from bertjax import init_from
from bertjax.models import heads
from bertjax.runs.console import say
from bertjax.runs.task_data import TaskStart
from bertjax.training.state import Setup


def replaces_modules(config) -> bool:
    """Whether the run is module replacing's (theseus.predecessor set)."""
    return bool(config.get("theseus") and config.theseus.predecessor)


def check_fine_tuned(model: init_from.Pretrained, task, what: str) -> None:
    """The model a run compresses (`what`: the setting naming it) is an encoder fine-tuned on this task, with
    its classifier and its tokenizer; or one line why not."""
    saved = model.task
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
                                               teacher.layer_map)


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
