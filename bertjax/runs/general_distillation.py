"""A general distillation run: a smaller encoder taught by a pretrained one on the pretraining stream
(DistilBERT's recipe, configs/distill/), the story `python -m bertjax.distill` tells.

    distill(config, workdir)   # mesh -> the teacher -> the student (its layers, init_from or fresh) ->
                               # restore -> the teacher's vocabulary -> the step with the teacher inside -> loop

Everything but the teacher is pretraining's (runs/pretraining.py): the stream, the loop and its hooks,
checkpoints, SIGTERM/Ctrl-C and resume. The teacher runs inside the jitted step as an argument in the
student's shardings; it is not trained and not saved. The workdir reads as any pretraining workdir: a
narrower student's learned projections (TinyBERT's) are saved beside the optimizer state, not with the
student's params (projections.ProjectionCheckpointer). With distill.progressive=True the run is MobileBERT's
progressive knowledge transfer (compression/progressive.py): a fresh student, the teacher's embedding and heads
copied into it, one stage per layer and a pre-training distillation stage, each said as it starts.
Task distillation is part of fine-tuning (runs/finetuning.py; its start and step in runs/finetuning_compression.py).
"""

import dataclasses
import functools

import ml_collections

from bertjax import init_from
from bertjax.compression import distillation, progressive, projections
from bertjax.models import bert
from bertjax.models.config import resolve_platform, BertConfig, field_names
from bertjax.runs import config_checks, phases, pretraining, start
from bertjax.runs.console import say
from bertjax.training import optim, pretraining_step
from bertjax.training.state import root_keys


def distill(config, workdir: str, distributed: start.Distributed | None = None) -> None:
    """The whole run; raises start.Stopped when SIGTERM or Ctrl-C saved and stopped it."""
    weights, layers, extract_only = distill_settings(config)
    plan = progressive_plan(config)  # None unless distill.progressive
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
        teacher = load_teacher(config, teacher_start, weights, extract_only, progressive=plan is not None)
        config = student_model(config, teacher.config, layers, plan)

        # ---------------------------------------------------------------- the student: shapes first
        init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
        layer_map, names = check_layer_losses(config, teacher.config, weights)
        setup = student_setup(config, layout, teacher.config, names, init_key, extract_only, plan)
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
            state = student_start(state, setup, teacher, teacher_params, layers, plan)
        if not extract_only and pretraining.finished(state, config.train.num_steps, checkpointer):
            return

        # ---------------------------------------------------------------- data: the teacher's vocabulary
        check_student_vocabulary(parent, teacher_start)
        config = phases.with_model_vocabulary(config, teacher_start)
        stream = pretraining.open_stream(config, workdir, student, int(state.step), layout.data_sharding)

        # ---------------------------------------------------------------- jitted steps, the teacher an argument
        p_train_step = compile_step(config, setup, teacher_net, teacher_params, weights, layout.data_sharding,
                                    layer_map, plan, int(state.step))
        _, p_eval_step = setup.compile_steps(layout.data_sharding, config.train.grad_accum_steps)  # the student's MLM

        # ---------------------------------------------------------------- loop
        run = pretraining.Run(config, workdir, setup, checkpointer, stream, p_eval_step,
                              summarize_window=progressive.summarize_progressive if plan else distillation.summarize,
                              distill=distill_record(config, layers, plan))
        if extract_only:
            save_extracted(run, state)
        else:
            pretraining.run_steps(run, state, p_train_step, dropout_key)


def student_model(config, teacher: BertConfig, layers: tuple, plan: progressive.Progressive | None):
    """config with the student's model section: the teacher's architecture with `layers` (DistilBERT's), or the
    section as written, which progressive transfer checks against the teacher (layer l learns its layer l)."""
    if layers:
        own = resolve_platform({k: config.model[k] for k in field_names("layout", "compute", "training")})
        return with_model(config, distillation.student_config_from_teacher(teacher, layers, own))
    if plan is not None:
        progressive.check_pair(teacher, BertConfig.from_dict(config.model))
    return config


def distill_settings(config) -> tuple[distillation.LossWeights, tuple[int, ...], bool]:
    """The distill section read and checked: the loss weights, the teacher's layers the student starts from
    (distill.student_layers; () for none), and whether the run only saves the student so made. Progressive
    transfer: its pre-training distillation stage's weights, (), False."""
    plan = progressive_plan(config)
    if plan is not None:
        return plan.pd_weights(), (), False
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
    progressive_plan(config)  # distill.progressive's settings, where it is on
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
                 extract_only: bool = False, progressive: bool = False) -> init_from.Pretrained:
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
    if untrained and progressive:
        raise ValueError(f"distill.progressive copies the teacher's masked-LM head into the student and distils its "
                         f"distribution, and distill.teacher={path} has none ({untrained[0]}, ...): give a checkpoint "
                         "with its pretraining heads (a bertjax pretraining workdir, MobileBertForPreTraining)")
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
                 layer_map: tuple = (), plan: progressive.Progressive | None = None, start_step: int = 0):
    """The jitted train step of the student, the teacher's params an argument of it (not trained, not saved);
    progressive transfer's (plan) saying each stage as it starts, the first at start_step."""
    if plan is not None:
        step = progressive.compile_step(setup, teacher_net, teacher_params, plan, data_sharding,
                                        config.train.grad_accum_steps)
        return StageAnnouncer(step, plan, start_step)
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
                  extract_only: bool, plan: progressive.Progressive | None = None):
    """The student's network, optimizer and state layout (pretraining's), with fresh projections to the
    teacher's width where it is narrower (projections.PROJECTIONS in its params). Progressive transfer: the
    optimizer at a constant peak, which the stages' schedule scales (what the run logs)."""
    prepare = projections.adding_projections(names, int(config.model.hidden_size), teacher.hidden_size,
                                              float(config.model.initializer_range), init_key)
    if plan is not None:
        setup = pretraining_step.setup(constant_learning_rate(config), layout.mesh, layout.rules, init_key)
        return dataclasses.replace(setup, schedule=plan.learning_rate)
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


def constant_learning_rate(config):
    """config with the optimizer's schedule at its peak throughout: progressive transfer's stages scale it."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.schedule.update(decay="wsd", warmup_steps=0, decay_steps=0)
    return config


# ----------------------------------------------------------------------------------------------------
# Progressive knowledge transfer (MobileBERT's): its settings, its start, its console
# ----------------------------------------------------------------------------------------------------


def progressive_plan(config) -> progressive.Progressive | None:
    """distill.progressive's stages, read and checked against the rest of the config; None where it is off."""
    section = config.distill
    if not section.get("progressive", False):
        return None
    others = [f"distill.{k}={section[k]}" for k in progressive.OTHER_LOSSES if float(section.get(k, 0.0))]
    if others:
        raise ValueError(f"distill.progressive=True has losses of its own (distill.alpha_fmt, alpha_at, pd_alpha): "
                         f"set {', '.join(others)} to 0")
    if tuple(section.student_layers or ()) or config.train.init_from:
        raise ValueError("distill.progressive=True trains a fresh student that starts with the teacher's embedding "
                         "and heads: set distill.student_layers=() and unset train.init_from")
    if config.model.get("matmul_dtype", "default") != "default":
        raise ValueError("distill.progressive=True freezes parameters by name, which fp8's scaling state is not "
                         "among: set model.matmul_dtype=default")
    pd_steps, warmup = int(section.pd_steps), config.schedule.warmup_steps
    if pd_steps and not 0 <= warmup <= pd_steps:
        raise ValueError(f"schedule.warmup_steps={warmup} warms up the pre-training distillation stage: it must lie "
                         f"in [0, distill.pd_steps={pd_steps}] (distill.stage_warmup_steps warms up each layer's)")
    pd_schedule = optim.optimizer_from_config(config.optimizer, config.schedule, pd_steps)[1] if pd_steps else None
    plan = progressive.Progressive.from_section(
        section, num_layers=int(config.model.num_layers), objective=config.data.objective,
        peak_learning_rate=float(config.optimizer.learning_rate), pd_schedule=pd_schedule)
    if plan.total_steps != config.train.num_steps:
        raise ValueError(f"train.num_steps={config.train.num_steps}, but distill.progressive's stages take "
                         f"{plan.num_layers} layers x distill.stage_steps={plan.stage_steps} + distill.pd_steps="
                         f"{plan.pd_steps} = {plan.total_steps} steps: set train.num_steps={plan.total_steps}")
    return plan


def student_start(state, setup, teacher: init_from.Pretrained, teacher_params, layers: tuple,
                  plan: progressive.Progressive | None):
    """The state the loop starts from, where it is step 0 (neither resumed nor from train.init_from): student
    layer i = the teacher's layers[i] with its embeddings and heads; or, in progressive transfer, the
    teacher's embedding and heads in a fresh student."""
    if int(state.step) != 0:
        return state
    if layers:
        state = state.replace(params=distillation.student_params(teacher.params, teacher.config, setup.bert_config,
                                                                 layers, setup.abstract_state.params))
        say(f"student layers: the teacher's {list(layers)}, with its embeddings and heads")
    elif plan is not None:
        params, copied = progressive.teacher_parts(state.params, teacher_params, setup.bert_config, teacher.config)
        state = state.replace(params=params)
        say(f"student: a fresh encoder, with the teacher's {', '.join(copied)} (untrained until stage "
            f"{plan.pd_stage}, pre-training distillation)")
    return state


def distill_record(config, layers: tuple, plan: progressive.Progressive | None) -> dict:
    """What the checkpoints record of the distillation: the teacher, the layers, progressive transfer's stages."""
    record = {"teacher": str(config.distill.teacher), "student_layers": list(layers)}
    if plan is not None:
        record["progressive"] = {"stage_steps": plan.stage_steps, "pd_steps": plan.pd_steps}
    return record


class StageAnnouncer:
    """A train step that says each stage of progressive transfer as it starts (and, first, the stage a resumed
    run goes on in). It counts the steps on the host, as the loop calls it once a step: reading state.step would
    wait for the device."""

    def __init__(self, step_fn, plan: progressive.Progressive, start_step: int):
        self.step_fn, self.plan, self.start_step, self.done = step_fn, plan, start_step, start_step

    def __call__(self, state, batch, dropout_key):
        stage = self.plan.stage_of(self.done)
        first = self.plan.first_step(stage)
        if self.done == first or self.done == self.start_step:
            say(self.plan.describe(stage, at_step=self.done if self.done != first else None))
        self.done += 1
        return self.step_fn(state, batch, dropout_key)
