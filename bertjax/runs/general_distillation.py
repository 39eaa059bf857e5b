"""A general distillation run: a smaller encoder taught by a pretrained one on the pretraining stream
(DistilBERT's recipe, configs/distill/), the story `python -m bertjax.distill` tells.

    distill(config, workdir)   # mesh -> the teacher -> the student (its layers, init_from or fresh) ->
                               # restore -> the teacher's vocabulary -> the step with the teacher inside -> loop

Everything but the teacher is pretraining's (runs/pretraining.py): the stream, the loop and its hooks,
checkpoints, SIGTERM/Ctrl-C and resume. The teacher runs inside the jitted step as an argument in the
student's shardings; it is not trained and not saved. The workdir reads as any pretraining workdir: a
narrower student's learned projections (TinyBERT's) are saved beside the optimizer state, not with the
student's params (projections.ProjectionCheckpointer).
Task distillation is part of fine-tuning (runs/finetuning.py; its start and step in runs/finetuning_compression.py).
"""

import functools

import ml_collections

from bertjax import init_from
from bertjax.compression import distillation, projections
from bertjax.models import bert
from bertjax.models.config import resolve_platform, BertConfig, field_names
from bertjax.runs import config_checks, phases, pretraining, start
from bertjax.runs.console import say
from bertjax.training import pretraining_step
from bertjax.training.state import root_keys


def distill(config, workdir: str, distributed: start.Distributed | None = None) -> None:
    """The whole run; raises start.Stopped when SIGTERM or Ctrl-C saved and stopped it."""
    weights, layers, extract_only = distill_settings(config)
    config, notes = check(config)  # every value, before anything is built
    with start.session(workdir, distributed):
        # ---------------------------------------------------------------- mesh
        layout = start.make_layout(config.mesh, config.logical_axis_rules, config.train.batch_size,
                                   config.train.grad_accum_steps)
        say(layout.describe())
        for note in notes:
            say(note)

        # ---------------------------------------------------------------- the teacher
        teacher_start, parent = read_starts(config)  # distill.teacher and train.init_from, each read once
        teacher = load_teacher(config, teacher_start, weights, extract_only)
        if layers:  # the student is the teacher's architecture with fewer layers
            own = resolve_platform({k: config.model[k] for k in field_names("layout", "compute", "training")})
            config = with_model(config, distillation.student_config_from_teacher(teacher.config, layers, own))

        # ---------------------------------------------------------------- the student: shapes first
        init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
        layer_map, names = check_layer_losses(config, teacher.config, weights)
        setup = student_setup(config, layout, teacher.config, names, init_key, extract_only)
        student = setup.bert_config
        bert.check_input_shapes(student, config.data.max_seq_length, config.data.max_predictions_per_seq)
        distillation.check_student(teacher.config, student, weights)
        teacher_net, teacher_params = place_teacher(config, teacher, layout)
        described = pretraining.describe_model(student, setup.abstract_state.params, config.data.max_seq_length)
        say("student " + described.removeprefix("model: "))

        # -------------------------------------------------------------- restore: workdir > init_from > layers > scratch
        checkpointer = projections.ProjectionCheckpointer.wrap(
            pretraining.make_checkpointer(config, workdir, setup.abstract_state), names)
        with layout.active():
            state = pretraining.restore(config, setup, checkpointer, init_key, parent)
            if layers and int(state.step) == 0:  # neither resumed nor from train.init_from
                state = state.replace(params=distillation.student_params(teacher.params, teacher.config, student,
                                                                         layers, setup.abstract_state.params))
                say(f"student layers: the teacher's {list(layers)}, with its embeddings and heads")
        if not extract_only and pretraining.finished(state, config.train.num_steps, checkpointer):
            return

        # ---------------------------------------------------------------- data: the teacher's vocabulary
        check_student_vocabulary(parent, teacher_start)
        config = phases.with_model_vocabulary(config, teacher_start)
        stream = pretraining.open_stream(config, workdir, student, int(state.step), layout.data_sharding)

        # ---------------------------------------------------------------- jitted steps, the teacher an argument
        p_train_step = compile_step(config, setup, teacher_net, teacher_params, weights, layout.data_sharding,
                                    layer_map)
        _, p_eval_step = setup.compile_steps(layout.data_sharding, config.train.grad_accum_steps)  # the student's MLM

        # ---------------------------------------------------------------- loop
        run = pretraining.Run(config, workdir, setup, checkpointer, stream, p_eval_step,
                              summarize_window=distillation.summarize,
                              distill={"teacher": str(config.distill.teacher), "student_layers": list(layers)})
        if extract_only:
            save_extracted(run, state)
        else:
            pretraining.run_steps(run, state, p_train_step, dropout_key)


def distill_settings(config) -> tuple[distillation.LossWeights, tuple[int, ...], bool]:
    """The distill section read and checked: the loss weights, the teacher's layers the student starts from
    (distill.student_layers; () for none), and whether the run only saves the student so made."""
    weights = distillation.LossWeights(**{k: float(config.distill[k]) for k in (
        "temperature", "alpha_ce", "alpha_mlm", "alpha_cos", "alpha_nsp")},
        layers=distillation.LayerLosses.from_config(config.distill))
    distillation.check_objective(weights, config.data.objective)
    layers = tuple(int(j) for j in config.distill.student_layers or ())
    if layers and config.train.init_from:
        raise ValueError("distill.student_layers and train.init_from both give the student's starting weights: "
                         "set distill.student_layers=() to start from train.init_from")
    extract_only = config.train.num_steps == 0  # the student as made from the teacher's layers, saved as is
    if extract_only and not layers:
        raise ValueError("train.num_steps=0 saves the student made from the teacher's layers: set "
                         "distill.student_layers, or train.num_steps > 0")
    return weights, layers, extract_only


def check(config):
    """check_pretraining's, a teacher that is there included (train.num_steps=0: the student as extracted)."""
    if not config.distill.teacher:
        raise ValueError("config.distill.teacher is required: a bertjax pretraining workdir or a Hugging Face "
                         "directory (with its masked-LM head where distill.alpha_ce > 0)")
    config_checks.check_path(config.distill.teacher, "distill.teacher")
    if config.model.get("mlm_loss") == "chunked":
        raise ValueError("model.mlm_loss='chunked' does not apply to general distillation, whose soft targets read "
                         "the student's and the teacher's whole logits: set model.mlm_loss=logits")
    if config.train.get("batch_warmup_start", 0):
        raise ValueError(f"train.batch_warmup_start={config.train.batch_warmup_start}: general distillation takes the "
                         "whole batch from its first step; set train.batch_warmup_start=0")
    return config_checks.check_pretraining(config, steps_may_be_zero=True)


def read_starts(config) -> tuple[init_from.Start, init_from.Start | None]:
    """distill.teacher's Start (required) and train.init_from's (None without one), tokenizers included:
    the student must read the teacher's token ids."""
    if not config.distill.teacher:
        raise ValueError("config.distill.teacher is required: a bertjax pretraining workdir or a Hugging Face "
                         "directory (with its masked-LM head where distill.alpha_ce > 0)")
    teacher = phases.read_parent(config.distill.teacher, config, "distill.teacher", tokenizer=True)
    return teacher, phases.read_parent(config.train.init_from, config, "train.init_from", tokenizer=True)


def load_teacher(config, start: init_from.Start, weights: distillation.LossWeights,
                 extract_only: bool = False) -> init_from.Pretrained:
    """distill.teacher through the one init-from, computing as the student does. Any encoder serves (a
    sentence-transformers BERT, a Hugging Face BertModel): its masked-LM head must be trained only where a
    loss reads it, the soft-target loss (distill.alpha_ce > 0, and not train.num_steps=0, which only copies
    layers); the masked-LM labels and the hidden-state cosine need none. A head it lacks is freshly
    initialised, and a student made from its layers starts with that head."""
    path = start.path
    compute = {k: config.model[k] for k in field_names("compute")}
    teacher = init_from.load(start, model_overrides=compute)
    if teacher.task:
        raise ValueError(f"distill.teacher={path} is a fine-tuned {teacher.task.kind} model: general "
                         "distillation needs a pretrained one (task distillation is python -m bertjax.finetune's "
                         "distill section)")
    if teacher.meta is not None and teacher.meta.electra is not None:
        raise ValueError(f"distill.teacher={path} is an ELECTRA run, whose discriminator has no masked-LM head to "
                         "distil from: fine-tune its discriminator, or distil from a masked-LM teacher")
    untrained = [m for m in teacher.missing if "mlm" in m or "predictions" in m]
    if untrained and weights.alpha_ce > 0 and not extract_only:
        raise ValueError(f"distill.alpha_ce={weights.alpha_ce} (the soft-target masked-LM loss) reads the teacher's "
                         f"masked-LM head, and distill.teacher={path} has none ({untrained[0]}, ...): set "
                         "distill.alpha_ce=0 (the masked-LM labels and the hidden-state cosine need no head), or "
                         "give a checkpoint with its pretraining heads (BertForPreTraining / BertForMaskedLM)")
    return teacher


def place_teacher(config, teacher: init_from.Pretrained, layout: start.Layout):
    """The teacher's network, and its params placed on the mesh as the student's rules shard them."""
    teacher_net = bert.BertForPreTraining(teacher.config)
    example = bert.dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)
    teacher_params = distillation.place_params(teacher_net, example, teacher.params, layout.mesh, layout.rules)
    say(f"teacher: {config.distill.teacher}, {teacher.config.num_layers} layers, hidden "
        f"{teacher.config.hidden_size}, {bert.count_params(teacher_params):,} parameters")
    return teacher_net, teacher_params


def compile_step(config, setup, teacher_net, teacher_params, weights: distillation.LossWeights, data_sharding,
                 layer_map: tuple = ()):
    """The jitted train step of the student, the teacher's params an argument of it (not trained, not saved)."""
    loss_fn = functools.partial(distillation.pretraining_distillation_loss, net=setup.net,
                                teacher_net=teacher_net, weights=weights, objective=config.data.objective,
                                layer_map=layer_map)
    return distillation.compile_step_with_teacher(
        setup, loss_fn, teacher_params, data_sharding, config.train.grad_accum_steps,
        weights.mean_metrics(config.data.objective))


def check_layer_losses(config, teacher: BertConfig, weights: distillation.LossWeights) -> tuple[tuple, tuple]:
    """The intermediate-layer losses against the student (the model section as resolved) and the teacher:
    (g, the teacher layer of each student layer; the projections a narrower student learns)."""
    if not weights.layers.on:
        return (), ()
    student = BertConfig.from_dict(config.model)
    layer_map = distillation.check_layer_losses(weights.layers, student, teacher)
    names = distillation.projection_names(weights.layers, student, teacher)
    if names and config.train.init_from:
        raise ValueError(f"train.init_from with a student narrower than the teacher ({student.hidden_size} < "
                         f"{teacher.hidden_size}) and distill.alpha_embedding/alpha_hidden: the learned projections "
                         "start fresh only with the student; unset train.init_from, or set both alphas to 0")
    if names:
        say(projections.ProjectionCheckpointer.describe(names))
    return layer_map, names


def student_setup(config, layout: start.Layout, teacher: BertConfig, names: tuple, init_key,
                  extract_only: bool):
    """The student's network, optimizer and state layout (pretraining's), with fresh projections to the
    teacher's width where it is narrower (projections.PROJECTIONS in its params)."""
    prepare = projections.adding_projections(names, int(config.model.hidden_size), teacher.hidden_size,
                                              float(config.model.initializer_range), init_key)
    return pretraining_step.setup(one_step(config) if extract_only else config, layout.mesh, layout.rules, init_key,
                                  prepare_params=prepare)


def check_student_vocabulary(parent: init_from.Start | None, teacher: init_from.Start) -> None:
    """A student pretrained on its own (train.init_from, `parent`) must read the teacher's token ids."""
    if parent is None:
        return
    own, theirs = parent.tokenizer, teacher.tokenizer
    if own is not None and theirs is not None:
        distillation.check_same_vocabulary(own.vocab_path, theirs.vocab_path, "train.init_from")


def with_model(config, student: BertConfig):
    """config with the model section the student's: what config.json records and a resume checks."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.model = ml_collections.ConfigDict({k: list(v) if isinstance(v, tuple) else v
                                              for k, v in student.__dict__.items()})
    return config


def one_step(config):
    """config with a schedule of one step: an optimizer (whose state the checkpoint holds) needs one."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.num_steps = 1
    config.schedule.update(warmup_steps=0, decay_steps=0)
    return config


def save_extracted(run: pretraining.Run, state) -> None:
    """train.num_steps=0: the student as made from the teacher's layers, saved as step 0 (DistilBERT's
    initialisation alone, e.g. the baseline a distilled student is compared with)."""
    run.save(state, 0, True)
    run.checkpointer.wait()
    run.checkpointer.close()
    say(f"train.num_steps=0: saved the student as made from the teacher's layers in {run.workdir}")
