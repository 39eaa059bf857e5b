"""A fine-tuning run: a pretrained encoder and one extra output layer trained on a task, the story
`python -m bertjax.finetune` tells.

    finetune(config, workdir)   # mesh -> the pretrained encoder and its tokenizer -> the task's splits as
                                # features -> head, optimizer, state -> restore -> the loop, evaluating the
                                # dev set(s) every epoch -> the best dev checkpoint's predictions, a summary
    sweep(config, workdir)      # the paper's model selection: one run per learning rate

train.init_from is a bertjax pretraining (or fine-tuning) workdir or checkpoint, a params export, or a Hugging
Face directory of any family. WORKDIR gets metrics.jsonl (dev lines with split=<dev split> and the task's
metrics), TensorBoard events, config.json, checkpoints/ (to resume), best/ (the best dev checkpoint, what
bertjax.load reads), predictions/ (every dev and test split, in each benchmark's own form) and
summary.json. SIGTERM and Ctrl-C save and raise runs.start.Stopped; re-running resumes. With a
theseus.predecessor (module replacing) or a distill.teacher (task distillation) the run compresses: its
start and step come from bertjax/runs/finetuning_compression.py; with distill.student=bilstm the model trained is
a BiLSTM (Tang et al. 2019; bertjax/models/bilstm.py) over the teacher's vocabulary, and distill.augment_copies adds
the paper's augmented copies of the training examples. A contrastive task trains a sentence
embedder on its loss over the global batch's embeddings (bertjax/tasks/contrastive_steps.py; in cached
microbatches with train.contrastive_microbatch), and its checkpoints record how it embeds.
"""

import dataclasses
import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from ml_collections import config_dict

from bertjax.compression import projections, pruning, theseus
from bertjax import init_from
from bertjax.models import bilstm, heads, multivector, sparse
from bertjax.runs import config_checks, start
from bertjax.runs.console import say
from bertjax.runs.finetuning_compression import (TaskTeacher, augmentation_settings, augmented_data, bilstm_start,
                                                 bilstm_student, distillation_step, replaces_modules, student_config,
                                                 student_of, task_teacher, theseus_start, theseus_step,
                                                 with_projections)
from bertjax.runs.task_data import (TaskData, TaskStart, contrastive_chunks, eval_length, feature_based_settings,
                                    task_data, task_from_config)
from bertjax.tasks import batches as task_batches
from bertjax.tasks import contrastive_batches, contrastive_steps, kinds, registry, rerank_batches, scoring
from bertjax.tasks.steps import (INPUT_KEYS, PACKED_INPUT_KEYS, TRAIN_KEYS, Scorer, head_loss, task_logits, task_loss,
                                 summarize_train)
from bertjax.text import files
from bertjax.training import checkpoint, loop, optim, sharding, writers
from bertjax.training import workdir as workdirs
from bertjax.training.checkpoint_meta import CheckpointMeta, TaskRecord, TokenizerRecord
from bertjax.training.preemption import Preemption
from bertjax.training.state import Setup, TrainState, root_keys

NO_BEST = {"step": 0, "value": -math.inf, "metrics": {}}


def finetune_or_sweep(config, workdir: str, distributed: start.Distributed | None = None) -> dict:
    """What config.sweep asks for: one run, or one per learning rate (config.sweep_learning_rates)."""
    return (sweep if config.sweep else finetune)(config, workdir, distributed)


def finetune(config, workdir: str, distributed: start.Distributed | None = None) -> dict:
    """One fine-tuning run; returns its summary (also written to WORKDIR/summary.json)."""
    config = student_config(config)  # a BiLSTM student or augmented data: checked before anything is written
    config, _ = config_checks.check_finetuning(config)  # a missing file is one line now, not after the model loads
    with start.session(workdir, distributed):
        return finetune_in_session(config, workdir)


def finetune_in_session(config, workdir: str) -> dict:
    """finetune's story, in a session already holding the workdir (pruning's recovery runs it in its own)."""
    # ---------------------------------------------------------------- mesh
    layout = start.make_layout(config.mesh, config.logical_axis_rules, config.train.batch_size,
                               config.train.grad_accum_steps)

    # ---------------------------------------------------------------- task and pretrained model
    task = task_from_config(config)
    num_labels = heads.resolve_num_labels(task.kind, kinds.get(task.kind).num_labels(task.labels))
    start_from, predecessor, teacher = starting_models(config, task, num_labels)

    # ---------------------------------------------------------------- data
    data, student = training_data(config, task, start_from, teacher, num_labels, layout)

    # ---------------------------------------------------------------- head, optimizer, state: shapes first
    feature_based = feature_based_settings(config, task, start_from.bert_config.num_layers)
    embedding = (contrastive_steps.embedder(data.settings, data.train.features, start_from.bert_config.hidden_size)
                 if task.kind == registry.CONTRASTIVE else None)  # contrastive: the embedder's pooling
    init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
    setup = task_setup(config, task, start_from, num_labels, feature_based, data.num_steps, layout, init_key,
                       embedding, teacher, student)

    # ---------------------------------------------------------------- restore: this workdir > init_from
    checkpointer = task_checkpointer(config, workdir, data.steps_per_epoch, teacher)
    state, best = restore(checkpointer, setup, task, init_key, student)

    # ---------------------------------------------------------------- jitted steps
    if predecessor is not None:  # module replacing: the predecessor's layers inside the step
        p_train_step = theseus_step(config, task, num_labels, predecessor, setup, layout.data_sharding)
    elif teacher is not None:  # task distillation: the teacher inside the step
        p_train_step = distillation_step(config, task, num_labels, teacher, setup, layout.data_sharding)
    elif embedding is not None:  # contrastive: the loss of the global batch's embeddings
        p_train_step = contrastive_train_step(config, setup, data.settings, layout.data_sharding, data.num_steps)
    else:
        loss = functools.partial(task_loss, net=setup.net, loss=head_loss(task, data.settings))
        p_train_step = setup.compile_train_step(loss, layout.data_sharding, config.train.grad_accum_steps)
    outputs = contrastive_steps.pair_embeddings if embedding is not None else task_logits
    model_sharding = projections.without_projections(setup.state_sharding.params)  # not a student's projections
    p_logits = setup.compile_eval_step(functools.partial(outputs, net=setup.net), layout.data_sharding, model_sharding)
    scorer = Scorer(task, data.settings, p_logits, layout.data_sharding, config.logging.eval_batch_size,
                    kinds.get(task.kind).eval_keys or INPUT_KEYS)

    # ---------------------------------------------------------------- the loop, evaluating every epoch
    writer = writers.MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.write_config(config.to_dict())
    if int(state.step) > 0:
        writer.resumed(int(state.step))
    meta = run_meta(config, workdir, task, start_from, feature_based, data.settings, student)
    run = Run(config, workdir, task, data, scorer, checkpointer, writer, meta, best, setup.schedule)
    with layout.active():
        state = train_loop(run, state, p_train_step, dropout_key, layout.data_sharding)

        # ------------------------------------------------------------ predictions of the best checkpoint
        written = predict_splits(run, state, projections.without_projections(setup.abstract_state.params))
    return summarize(run, written)


def starting_models(config, task, num_labels: int) -> tuple[TaskStart, init_from.Pretrained | None,
                                                             TaskTeacher | None]:
    """(the model the run starts from, module replacing's predecessor, task distillation's teacher), as
    theseus.predecessor, distill.student and distill.teacher ask; None for those the run has not."""
    if replaces_modules(config):
        return *theseus_start(config, task, num_labels), None
    if student_of(config) == bilstm.STUDENT:  # the teacher's tokenizer; the student's weights start fresh
        start_from, teacher = bilstm_start(config, task, num_labels)
        return start_from, None, teacher
    start_from = starting_model(config, task, num_labels)
    return start_from, None, task_teacher(config, task, num_labels, start_from)  # None without distill.teacher


def training_data(config, task, start_from: TaskStart, teacher: TaskTeacher | None, num_labels: int,
                  layout: start.Layout) -> tuple[TaskData, bilstm.BiLSTMConfig | None]:
    """The task's splits as features, the training split with the paper's augmented copies where
    distill.augment_copies asks (the teacher labels them in the step); and a BiLSTM student's shape, which its
    training split decides (sentence pairs or not), else None."""
    data = task_data(config, task, start_from.tokenizer, start_from.bert_config, layout)
    if teacher is not None and augmentation_settings(config) is not None:
        data = augmented_data(config, start_from.tokenizer, data)
    if student_of(config) != bilstm.STUDENT:
        return data, None
    return data, bilstm_student(config, start_from, num_labels, data.train)


def init_from_path(config) -> str:
    """train.init_from; the older top-level init_from is still read, with a line saying so."""
    if config.get("init_from"):
        say("config.init_from is the older name of config.train.init_from: read as train.init_from")
        if config.train.init_from and config.train.init_from != config.init_from:
            raise ValueError(f"config.init_from={config.init_from} and config.train.init_from="
                             f"{config.train.init_from} differ: set train.init_from only")
        return config.init_from
    if not config.train.init_from:
        raise ValueError("config.train.init_from is required: a bertjax pretraining workdir or checkpoint, or a "
                         "Hugging Face BERT directory")
    return config.train.init_from


def load_pretrained(path: str, kind: str, num_labels: int, model_overrides: dict) -> TaskStart:
    """The encoder (and tokenizer) of a task, through the one init-from."""
    has_class = kinds.get(kind).hf_class is not None  # contrastive: a Hugging Face directory's encoder alone
    model = init_from.load(init_from.resolve(path, "train.init_from"), model_overrides=model_overrides,
                           head=kind if has_class else None, num_labels=num_labels)
    if model.tokenizer is None:
        raise ValueError(f"train.init_from={path} was pretrained on synthetic data and has no tokenizer: "
                         "fine-tune a checkpoint trained on text")
    if model.meta is not None:  # a bertjax checkpoint or export: a fine-tuning one of this task has its classifier
        whole_head = model.task is not None and model.task.kind == kind and (not has_class or (
            "classifier" in model.params and model.params["classifier"]["bias"].shape[-1] == num_labels))
    else:  # Hugging Face: the task's own class has its classifier
        whole_head = has_class and not any(m.startswith("classifier") for m in model.missing)
    return TaskStart(model.config, model.params, model.tokenizer.load(), model.tokenizer, whole_head)


def starting_model(config, task, num_labels: int) -> TaskStart:
    """init_from loaded for the task's head, said in one line, its vocabulary checked against the model."""
    source = init_from_path(config)
    start_from = load_pretrained(source, task.kind, num_labels, config.model.to_dict())
    bert_config = start_from.bert_config
    say(f"task {task.name} ({task.kind}{', labels ' + ', '.join(task.labels) if task.labels else ''}); "
        f"from {source}: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}")
    if start_from.tokenizer.kind == "bpe" and task.kind in (registry.SPAN, registry.TAGGING):
        raise ValueError(f"task {task.name} ({task.kind}) tokenizes its text word by word, which byte-level BPE "
                         f"reads otherwise (a word's leading space is part of its token): fine-tune it from a "
                         f"WordPiece or SentencePiece model")
    if start_from.tokenizer.vocab_size > bert_config.vocab_size:
        raise ValueError(f"the vocabulary of {source} has {start_from.tokenizer.vocab_size} tokens but "
                         f"its model only {bert_config.vocab_size}: a checkpoint of another vocabulary size")
    return start_from


def task_setup(config, task, start_from: TaskStart, num_labels: int, feature_based: dict | None,
               num_steps: int, layout: start.Layout, init_key, embedding: dict | None = None,
               teacher: TaskTeacher | None = None, student: bilstm.BiLSTMConfig | None = None) -> Setup:
    """The task's network, optimizer and state layout (shapes first, created sharded), its fresh
    parameters holding the pretrained encoder (and the whole head, continuing this task's fine-tuning);
    a task distillation student narrower than its teacher also trains projections to its width (under
    projections.PROJECTIONS, beside the model's params): those init_from's distillation learned, else fresh.
    A BiLSTM student (student) is its own network, all fresh, at distill.bilstm_learning_rate."""
    net = (bilstm.BiLSTMClassifier(student) if student is not None else
           heads.network(task.kind, start_from.bert_config, num_labels, feature_based=feature_based,
                         embedding=embedding))
    schedule_config = config_dict.ConfigDict(dict(
        warmup_steps=int(round(config.schedule.warmup_fraction * num_steps)), decay=config.schedule.decay,
        power=config.schedule.power))
    optimizer_config = config.optimizer
    if feature_based:
        optimizer_config = config_dict.ConfigDict(dict(config.optimizer.to_dict(),
                                                       learning_rate=config.feature_based.learning_rate))
    if student is not None:  # trained from scratch: a rate of its own
        optimizer_config = config_dict.ConfigDict(dict(config.optimizer.to_dict(),
                                                       learning_rate=config.distill.bilstm_learning_rate))
    tx, schedule = optim.optimizer_from_config(optimizer_config, schedule_config, num_steps)
    if feature_based:  # the encoder stays as pretrained: only the tagger on its features learns
        tx = optax.chain(tx, optax.masked(optax.set_to_zero(), heads.encoder_mask))
    if config.get("prune") and config.prune.sparsity:  # a magnitude-pruned model (bertjax.prune): zeros stay zero
        tx = optax.chain(tx, pruning.keep_pruned_zeros())
    if replaces_modules(config):  # module replacing: the successor's layers alone learn
        tx = theseus.successor_layers_only(tx)
    task_inputs = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    prepare_params = functools.partial(with_pretrained, start_from=start_from) if student is None else None
    if teacher is not None and student is None:
        prepare_params = with_projections(prepare_params, config, start_from, teacher, init_key)
    return Setup.create(net, task_inputs, tx, schedule, layout.mesh, layout.rules, init_key,
                        prepare_params=prepare_params)


def with_pretrained(params: dict, *, start_from: TaskStart) -> dict:
    """Fresh (boxed) task params with the pretrained encoder in; the classifier too when init_from was
    a fine-tuning checkpoint of this task."""
    params = heads.with_pretrained_encoder(params, start_from.params)
    if "mlm_head" in params:  # SPLADE reads the pretrained masked-LM head too
        params = sparse.with_pretrained_mlm_head(params, start_from.params)
    if multivector.PROJECTION in params:  # ColBERT: a trained projection where the start has one
        params = multivector.with_trained_projection(params, start_from.params)
    if start_from.whole_head and set(start_from.params) == set(params):  # this task's head: classifier too
        is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
        params = {name: tree if name == "bert" else jax.tree_util.tree_map(
            lambda box, value: box.replace_boxed(value) if is_box(box) else value, tree,
            start_from.params[name], is_leaf=is_box) for name, tree in params.items()}
    return params


def task_checkpointer(config, workdir: str, steps_per_epoch: int, teacher: TaskTeacher | None):
    """checkpoints/, saved every epoch; a narrower student's projections (task distillation's) saved beside the
    optimizer state, never with the model."""
    checkpointer = checkpoint.Checkpointer(workdir, every_steps=steps_per_epoch, keep=config.checkpoint.keep,
                                           async_save=config.checkpoint.async_save)
    names = teacher.projections if teacher is not None else ()
    if names:
        say(projections.ProjectionCheckpointer.describe(names))
    return projections.ProjectionCheckpointer.wrap(checkpointer, names)


def restore(checkpointer, setup: Setup, task, init_key, student: bilstm.BiLSTMConfig | None = None
            ) -> tuple[TrainState, dict]:
    """The state to start from (this workdir's latest checkpoint, else fresh with the pretrained encoder)
    and the best dev result so far."""
    abstract_state = setup.abstract_state
    restored = checkpointer.restore_latest(abstract_state.params, abstract_state.opt_state,
                                           check_meta=functools.partial(check_same_task, task=task,
                                                                        params=abstract_state.params, student=student))
    if restored is None:
        return setup.init(init_key), dict(NO_BEST)
    say(f"resumed from step {restored.step}")
    state = TrainState(jnp.int32(restored.step), restored.params, restored.opt_state)
    return state, dict(restored.meta.best or NO_BEST)


def check_same_task(step: int, meta: CheckpointMeta, *, task, params=None, student=None) -> None:
    saved = meta.task
    if saved and (saved.name, saved.kind, list(saved.labels)) != (task.name, task.kind, list(task.labels)):
        raise checkpoint.CheckpointMismatch(
            f"the workdir's checkpoint at step {step} fine-tunes task {saved.name} ({saved.kind}, labels "
            f"{list(saved.labels)}), not {task.name}: use a new workdir")
    if bilstm.from_record(meta.distill) != student:  # a BiLSTM student (of this shape) or not
        raise checkpoint.CheckpointMismatch(
            f"the workdir's checkpoint at step {step} is {bilstm.describe(bilstm.from_record(meta.distill))}, this "
            f"run trains {bilstm.describe(student)}: use a new workdir")
    trained = meta.embedding.multivector if meta.embedding is not None else None
    if trained and params is not None and multivector.PROJECTION in params:  # ColBERT: the projection's width
        multivector.check_projection(params, (meta.model["hidden_size"], trained["dim"]))


def contrastive_train_step(config, setup: Setup, settings, data_sharding, num_steps: int):
    """A contrastive task's train step (contrastive_steps.compile_train_step), the whole batch's loss in
    train.contrastive_microbatch pairs at a time where that is set (num_steps: the run's, for SPLADE's warmup)."""
    if config.train.grad_accum_steps != 1:
        raise ValueError(f"train.grad_accum_steps={config.train.grad_accum_steps} would split the in-batch negatives"
                         ": set train.contrastive_microbatch instead (the whole batch's loss, in less memory)")
    chunks = contrastive_chunks(config)  # train.contrastive_microbatch checked
    return contrastive_steps.compile_train_step(setup, settings, data_sharding,
                                                config.train.batch_size // chunks if chunks > 1 else 0, num_steps)


def run_meta(config, workdir: str, task, start_from: TaskStart, feature_based, settings,
             student: bilstm.BiLSTMConfig | None = None) -> CheckpointMeta:
    """What every checkpoint of the run carries: the model, optimizer, tokenizer and task (bertjax.load
    reads the task's kind, labels and settings back); a BiLSTM student's record (what tells bertjax.load, export
    and a resume that the model is no BERT; `model` is then its teacher's, whose vocabulary it reads)."""
    kind = start_from.files.kind
    name = (workdirs.keep_vocabulary(workdir, start_from.files.vocab_path, kind) if jax.process_index() == 0
            else files.VOCAB_FILES[kind])
    return CheckpointMeta(
        step=0, model=dataclasses.asdict(start_from.bert_config), optimizer=config.optimizer.to_dict(),
        tokenizer=TokenizerRecord(kind, name, bool(start_from.files.lower_case)),
        task=TaskRecord(task.name, task.kind, tuple(task.labels), task.num_choices,
                        eval_length(config, task),
                        task.squad_version, feature_based, dataclasses.asdict(settings) if settings else None),
        embedding=settings.embedding_record() if task.kind == registry.CONTRASTIVE else None,
        distill=bilstm.record(student, config.distill.teacher) if student is not None else None)


@dataclasses.dataclass
class Run:
    """What the loop's hooks and the final predictions share."""

    config: object
    workdir: str
    task: object
    data: TaskData
    scorer: Scorer
    checkpointer: checkpoint.Checkpointer
    writer: writers.MetricWriter
    meta: CheckpointMeta
    best: dict  # the best dev result so far: step, value, metrics (and null_threshold), updated in place
    schedule: object


def hooks(run: Run, preemption: Preemption) -> loop.Hooks:
    """log (training lines), evaluate (dev lines; the best checkpoint kept), save, and the after-step checks."""
    config, writer, best = run.config, run.writer, run.best

    def log(step, window, speed):
        writer.write(step, dict(summarize_train(window), learning_rate=float(run.schedule(step - 1)), **speed))

    def evaluate(state, step):
        model = projections.without_projections(state.params)
        scores = {split: run.scorer(model, split, s).metrics for split, s in run.data.dev.items()}
        for split, values in scores.items():
            writer.write(step, values, split=split)
        # The main metric of the first dev split chooses the best checkpoint (MNLI: matched).
        first = scores[next(iter(run.data.dev))]
        value = first[run.task.main_metric]
        if value > best["value"]:
            best.update(step=step, value=float(value), metrics=scores)
            # SQuAD v2.0: the no-answer threshold this dev set chose is kept with the model.
            best["null_threshold"] = float(first.get("best_f1_threshold", 0.0))
            task = dataclasses.replace(run.meta.task, null_threshold=best["null_threshold"])
            checkpoint.save_params(run.workdir, checkpoint.BEST_DIR, step, model,
                                   run.meta.replace(task=task, best=dict(best)))

    def keep_last(state, step):
        # No dev set (a contrastive task): the last step's model is the model, as sentence-transformers keeps
        # its last without an evaluator.
        if step == run.data.num_steps:
            best.update(step=step, value=None, metrics={})
            model = projections.without_projections(state.params)
            checkpoint.save_params(run.workdir, checkpoint.BEST_DIR, step, model, run.meta.replace(best=dict(best)))

    def save(state, step, force):
        run.checkpointer.save(step, state.params, state.opt_state, run.meta.replace(best=dict(best)), force=force)

    after_step = [lambda step, state: run.checkpointer.check_for_errors()]
    if config.logging.profile_first_step:
        after_step.append(loop.Profiler(files.join(run.workdir, "profile"), config.logging.profile_first_step,
                                        config.logging.profile_steps))
    return loop.Hooks(log=log, evaluate=evaluate if run.data.dev else keep_last, save=save, preemption=preemption,
                      after_step=after_step)


def train_loop(run: Run, state: TrainState, p_train_step, dropout_key, data_sharding) -> TrainState:
    """The loop of bertjax.training.loop over the training batches; Stopped where SIGTERM or Ctrl-C saved."""
    config, data = run.config, run.data
    preemption = Preemption()
    steps = loop.LoopSteps(start=int(state.step), total=data.num_steps, log_every=config.logging.log_every,
                           eval_every=config.logging.eval_every or data.steps_per_epoch,
                           save_every=data.steps_per_epoch)
    train_features = data.train.features
    batch_keys = kinds.get(run.task.kind).batch_keys
    train_keys = batch_keys(train_features) if batch_keys else (
        TRAIN_KEYS + tuple(k for k in ("label_weight", "gold_weight") if k in train_features))
    if data.packing is None:
        batches = task_batches.train_batches(train_features, config.train.batch_size, config.train.seed,
                                             int(state.step), process_index=jax.process_index(),
                                             process_count=jax.process_count())
    elif run.task.kind == registry.CONTRASTIVE:  # the texts of its pairs share rows
        batches = contrastive_batches.packed_train_batches(
            train_features, config.train.batch_size, config.train.seed, int(state.step),
            num_rows=data.packing.num_rows, max_sequences=data.packing.max_sequences,
            num_chunks=contrastive_chunks(config), process_index=jax.process_index(),
            process_count=jax.process_count())
        train_keys = contrastive_batches.batch_keys(train_features)
    elif run.task.kind == registry.RERANK:  # the pairs of its queries share rows
        batches = rerank_batches.packed_train_batches(
            train_features, config.train.batch_size, config.train.seed, int(state.step),
            num_rows=data.packing.num_rows, max_sequences=data.packing.max_sequences,
            process_index=jax.process_index(), process_count=jax.process_count())
        train_keys = rerank_batches.BATCH_KEYS
    else:
        batches = task_batches.packed_train_batches(
            train_features, config.train.batch_size, config.train.seed, int(state.step), keys=train_keys,
            num_rows=data.packing.num_rows, max_sequences=data.packing.max_sequences,
            grad_accum_steps=config.train.grad_accum_steps, process_index=jax.process_index(),
            process_count=jax.process_count())
        train_keys += PACKED_INPUT_KEYS
    device_batches = sharding.prefetch_to_devices(({k: b[k] for k in train_keys} for b in batches), data_sharding,
                                                  size=config.train.prefetch_batches)
    with device_batches:
        state, stopped_at = loop.run_loop(state, p_train_step, device_batches, dropout_key, steps,
                                          hooks(run, preemption))
    run.checkpointer.wait()
    run.checkpointer.close()
    if stopped_at is not None:
        run.writer.close()
        say(f"{preemption.name}: saved the checkpoint of step {stopped_at}; re-run the same command to resume")
        raise start.Stopped(stopped_at, preemption.exit_code)
    return state


def predict_splits(run: Run, state: TrainState, abstract_params) -> list[str]:
    """Every dev and test split predicted by the best checkpoint; the prediction files written."""
    if run.best["step"] != run.data.num_steps:
        best_params, _ = checkpoint.restore_params(files.join(run.workdir, checkpoint.BEST_DIR), abstract_params)
    else:
        best_params = projections.without_projections(state.params)
    written = []
    for split, s in {**run.data.dev, **run.data.test}.items():
        result = run.scorer(best_params, split, s, null_threshold=run.best.get("null_threshold", 0.0))
        if jax.process_index() == 0:
            written += scoring.write_predictions(files.join(run.workdir, "predictions"), result)
    return written


def summarize(run: Run, written: list[str]) -> dict:
    """summary.json and the run's last line: the best dev result and where the predictions are."""
    task, best, num_steps = run.task, run.best, run.data.num_steps
    summary = {"task": task.name, "main_metric": task.main_metric, "steps": num_steps,
               "learning_rate": run.config.optimizer.learning_rate, "best": best, "predictions": written}
    run.writer.close()
    if jax.process_index() == 0:
        files.write_bytes(files.join(run.workdir, "summary.json"), json.dumps(summary, indent=1).encode())
    if not run.data.dev:
        say(f"{task.name}: no dev set; the model is step {best['step']}'s, in "
            f"{files.join(run.workdir, checkpoint.BEST_DIR)}")
        return summary
    shown = "; ".join(f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items() if not k.startswith("f1_"))
                      for split, m in best["metrics"].items())
    say(f"{task.name}: best dev {task.main_metric} {best['value']:.4f} at step {best['step']} of {num_steps} "
        f"({shown}); predictions in {files.join(run.workdir, 'predictions')}")
    return summary


def sweep(config, workdir: str, distributed: start.Distributed | None = None) -> dict:
    """The paper's model selection: one run per learning rate, the best on the dev set's main metric."""
    student_config(config)  # a BiLSTM student reads no optimizer.learning_rate: one line now
    if not config.data.validation and task_from_config(config).kind == registry.CONTRASTIVE:
        raise ValueError("config.sweep chooses the learning rate on the dev set: set config.data.validation to a "
                         "JSON-lines file")
    results = {}
    for rate in config.sweep_learning_rates:
        run_config = config_dict.ConfigDict(config.to_dict())
        run_config.optimizer.learning_rate = float(rate)
        run_config.sweep = False
        say(f"--- learning rate {rate:g}")
        results[float(rate)] = finetune(run_config, files.join(workdir, f"lr-{rate:g}"), distributed)
    best_rate = max(results, key=lambda r: results[r]["best"]["value"])
    best = results[best_rate]
    main_metric = best["main_metric"]
    for rate, summary in results.items():
        say(f"learning rate {rate:g}: best dev {main_metric} {summary['best']['value']:.4f} "
            f"(step {summary['best']['step']}){'  <- best' if rate == best_rate else ''}")
    out = {"task": config.task, "main_metric": main_metric, "best_learning_rate": best_rate,
           "best": best["best"], "runs": {f"{r:g}": s for r, s in results.items()}}
    if jax.process_index() == 0:
        files.write_bytes(files.join(workdir, "sweep.json"), json.dumps(out, indent=1).encode())
    return out
