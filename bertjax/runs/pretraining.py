"""A pretraining run, from one CPU to a pod: the story `python -m bertjax.train` tells, importable.

    pretrain(config, workdir)   # distributed init -> mesh -> model and optimizer (shapes first, created
                                # sharded) -> restore -> data -> jitted steps -> the loop

Re-running on the same workdir resumes from its latest checkpoint; SIGTERM (preemption) and Ctrl-C save
and raise runs.start.Stopped. A run given another run's workdir as train.init_from is a new phase of it
(ModernBERT's pretrain, extend, decay): its parameters, optionally its optimizer state, and one line
naming every config change from it. General distillation (runs/general_distillation.py) is this run with a
teacher inside the step, so it shares the parts below (restore, stream, checkpoints, the loop's hooks).

The model, the step and the synthetic data path import no TensorFlow: only the real input pipeline does.
"""

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from bertjax.data import synthetic
from bertjax.data.settings import DataSettings
from bertjax import init_from
from bertjax.models import bert
from bertjax.models.config import RESUME_FIELDS, BertConfig, describe_attention
from bertjax.runs import config_checks, phases, start
from bertjax.runs.console import say
from bertjax.text import files
from bertjax.training import checkpoint, flops, loop, sharding, writers
from bertjax.training import pretraining_step
from bertjax.training import workdir as workdirs
from bertjax.training.batch_warmup import BatchWarmup, warmup_batches
from bertjax.training.checkpoint_meta import CheckpointMeta, TokenizerRecord
from bertjax.training.preemption import Preemption
from bertjax.training.state import TrainState, root_keys


def pretrain(config, workdir: str, distributed: start.Distributed | None = None) -> None:
    """The whole run. Returns when train.num_steps are done; raises start.Stopped when SIGTERM or Ctrl-C
    saved and stopped it."""
    config, notes = config_checks.check_pretraining(config)  # every value, before anything is built
    with start.session(workdir, distributed):
        # ---------------------------------------------------------------- mesh
        layout = start.make_layout(config.mesh, config.logical_axis_rules, config.train.batch_size,
                                   config.train.grad_accum_steps)
        say(layout.describe())
        for note in notes:
            say(note)

        # ---------------------------------------------------------------- model and optimizer: shapes first
        init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
        setup = pretraining_step.setup(config, layout.mesh, layout.rules, init_key)
        bert.check_input_shapes(setup.bert_config, config.data.max_seq_length, config.data.max_predictions_per_seq)
        say(describe_model(setup.bert_config, setup.abstract_state.params, config.data.max_seq_length))
        if setup.generator_config is not None:
            gen = setup.generator_config
            say(f"ELECTRA: generator of {gen.num_layers} layers, hidden {gen.hidden_size}, sharing the discriminator's "
                f"embeddings; loss = generator MLM + {setup.discriminator_weight:g} x discriminator BCE")

        # ---------------------------------------------------------------- restore: workdir > init_from > scratch
        parent = phases.read_parent(config.train.init_from, config, "train.init_from")  # what it names, read once
        checkpointer = make_checkpointer(config, workdir, setup.abstract_state)
        with layout.active():
            state = restore(config, setup, checkpointer, init_key, parent)
        if finished(state, config.train.num_steps, checkpointer):
            return

        # ---------------------------------------------------------------- data
        config = phases.with_model_vocabulary(config, parent)
        stream = open_stream(config, workdir, setup.bert_config, int(state.step), layout.data_sharding)

        # ---------------------------------------------------------------- jitted steps
        p_train_step, p_eval_step = setup.compile_steps(layout.data_sharding, config.train.grad_accum_steps,
                                                        BatchWarmup.from_config(config.train))

        # ---------------------------------------------------------------- loop
        run = Run(config, workdir, setup, checkpointer, stream, p_eval_step)
        run_steps(run, state, p_train_step, dropout_key)


# ----------------------------------------------------------------------------------------------------
# The parts of the story, shared with general distillation
# ----------------------------------------------------------------------------------------------------


def describe_model(bert_config: BertConfig, abstract_params, row_length: int) -> str:
    """The one line that says which model (and which compute choices) this run trains on rows of
    row_length tokens."""
    return (f"model: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}, "
            f"{bert.count_params(abstract_params):,} parameters; {bert_config.dtype} compute, "
            f"{describe_attention(bert_config, row_length)}, "
            f"{bert_config.word_embedding} word embedding, remat {bert_config.remat_policy}"
            + (", scanned layers" if bert_config.scan_layers else "")
            + "".join(f", {name}={getattr(bert_config, name)}" for name in LEVERS
                      if getattr(bert_config, name) != BertConfig.__dataclass_fields__[name].default))


# The accelerator levers (docs/performance.md) the model line names where a run turns them on.
LEVERS = ("fused_qkv", "norm_kernel", "matmul_dtype", "mlm_loss")


def make_checkpointer(config, workdir: str, abstract_state) -> checkpoint.Checkpointer:
    """The workdir's checkpoints; their size is known from the shapes, before any array exists."""
    return checkpoint.Checkpointer(
        workdir, every_steps=config.checkpoint.every_steps, keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
        bytes_per_checkpoint=sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(abstract_state)))


def restore(config, setup, checkpointer: checkpoint.Checkpointer, init_key,
            parent: init_from.Start | None) -> TrainState:
    """The one restore order: this workdir's latest checkpoint > train.init_from (`parent`; a new phase: its
    parameters, and its optimizer state with train.init_from_optimizer) > scratch. Runs under the mesh and
    its logical rules, so that what it creates is sharded."""
    bert_config, abstract_state = setup.bert_config, setup.abstract_state
    restored = checkpointer.restore_latest(abstract_state.params, abstract_state.opt_state,
                                           check_meta=functools.partial(check_same_run, config=config,
                                                                        bert_config=bert_config),
                                           abstract_fp8=abstract_state.fp8)
    if restored is not None:
        check_same_stream(restored.meta, config, jax.process_count())
        say(f"resumed from step {restored.step} ({checkpointer.directory})")
        changed = schedule_changes(restored.meta, config)
        if changed:
            say(f"the learning-rate schedule differs from the checkpoint's ({changed}): from step {restored.step} "
                f"on it follows the config's, {float(setup.schedule(restored.step)):.2e} now")
        fp8 = restored.fp8
        if fp8 is None and abstract_state.fp8 is not None:  # model.matmul_dtype=fp8 from a checkpoint without it
            fp8 = setup.init_fp8(init_key)
        return TrainState(jnp.int32(restored.step), restored.params, restored.opt_state, fp8)
    path = config.train.init_from
    if parent is not None:  # every check of the parent before anything is created
        phases.check_parent(parent, config, bert_config, electra=setup.generator_config is not None)
        line = phases.phase_line(parent, config)
        if line:
            say(line)
    state = setup.init(init_key)
    if parent is not None and setup.generator_config is not None:
        state = state.replace(params=phases.electra_initial_params(path, parent, setup, state.params))
    elif parent is not None:
        state = state.replace(params=phases.initial_params(parent, bert_config, abstract_state.params,
                                                    config.train.get("extend_positions", "none")))
        say(f"parameters from {path}")
    if parent is not None and config.train.get("init_from_optimizer"):
        opt_state, step = checkpoint.restore_opt_state(parent.checkpoint, abstract_state.opt_state)
        state = state.replace(opt_state=phases.restarted_schedule(opt_state))
        say(f"optimizer state from {path} (step {step}): its moments and their count carried over; the step "
            "and the learning-rate schedule start again at 0")
    return state


def finished(state: TrainState, num_steps: int, checkpointer: checkpoint.Checkpointer) -> bool:
    """A workdir whose run is already done: said in one line, nothing to do."""
    if int(state.step) < num_steps:
        return False
    say(f"nothing to do: the checkpoint of step {int(state.step)} is already at train.num_steps={num_steps} "
        f"({checkpointer.directory}); raise train.num_steps to train on")
    checkpointer.close()
    return True


def electra_record(setup) -> dict | None:
    """What an ELECTRA run's checkpoints record of its generator (None for BERT's pretraining)."""
    if setup.generator_config is None:
        return None
    return {"model": dataclasses.asdict(setup.generator_config), "discriminator_weight": setup.discriminator_weight}


def check_same_run(step: int, meta: CheckpointMeta, *, config, bert_config: BertConfig) -> None:
    """Stop, naming what differs, when the workdir's checkpoint is not of this config's model and
    optimizer; the checkpoints stay as they are."""
    saved = meta.model

    def as_saved(value):  # tuples come back from the checkpoint's JSON as lists
        return list(value) if isinstance(value, tuple) else value

    differences = [f"model.{k}={saved[k]!r}, the config {getattr(bert_config, k)!r}"
                   for k in RESUME_FIELDS if k in saved and saved[k] != as_saved(getattr(bert_config, k))]
    saved_optimizer = (meta.optimizer or {}).get("name")
    if meta.optimizer is not None and saved_optimizer != config.optimizer.name:
        differences.append(f"optimizer.name={saved_optimizer!r}, the config {config.optimizer.name!r}")
    if (meta.electra is None) != (config.get("electra") is None):
        differences.append("an ELECTRA generator" if meta.electra else "no ELECTRA generator (the config has one)")
    elif meta.electra is not None:
        generator = dataclasses.asdict(pretraining_step.electra_generator(config.electra, bert_config))
        differences += [f"electra.generator_{k}={meta.electra['model'][k]!r}, the config {generator[k]!r}"
                        for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size")
                        if meta.electra["model"].get(k) != generator[k]]
    if differences:
        raise checkpoint.CheckpointMismatch(
            f"the checkpoint at step {step} has {'; '.join(differences)}: use a new workdir, or "
            f"train.init_from=<this workdir> in a new one for the parameters only")


def schedule_record(config) -> dict:
    """What decides the learning rate at every step: the schedule section, train.num_steps and the peak rate."""
    return {**config.schedule.to_dict(), "num_steps": config.train.num_steps,
            "learning_rate": config.optimizer.learning_rate}


def schedule_changes(meta: CheckpointMeta, config) -> str:
    """"train.num_steps 20 -> 30, ..." for what a resumed run's schedule changes; "" when nothing (or an
    older checkpoint, which did not record it)."""
    if meta.schedule is None:
        return ""
    now = schedule_record(config)
    names = {"num_steps": "train.num_steps", "learning_rate": "optimizer.learning_rate"}
    return ", ".join(f"{names.get(k, 'schedule.' + k)} {meta.schedule[k]} -> {v}" for k, v in now.items()
                     if k in meta.schedule and meta.schedule[k] != v)


def stream_position(config, process_count: int) -> dict:
    """What decides the data stream besides the step: a resumed run must agree on all of it."""
    data, warmup = DataSettings.from_config(config.data), BatchWarmup.from_config(config.train)
    return {"seed": data.seed, "batch_size": config.train.batch_size, "process_count": process_count,
            "batch_warmup": None if warmup is None else dataclasses.asdict(warmup),
            "max_seq_length": data.max_seq_length, "source": data.source, "objective": data.objective,
            "mask_rate": data.mask_rate, "eval_mask_rate": data.eval_mask_rate, "packing": data.packing,
            "masking": data.masking, "mask_rate_schedule": [list(phase) for phase in data.mask_rate_schedule],
            # Each source of a mixture and its weight, as the config writes them (the checkpoint's JSON).
            "mixture": [dict(entry) for entry in config.data.mixture or ()]}


def check_same_stream(meta: CheckpointMeta, config, process_count: int) -> None:
    saved, now = meta.data or {}, stream_position(config, process_count)
    changed = {k: (saved.get(k), v) for k, v in now.items() if k in saved and saved[k] != v}
    if changed:
        logging.warning("resuming with a different data stream than the checkpoint's (%s): "
                        "the examples after the checkpoint differ from an uninterrupted run", changed)


@dataclasses.dataclass
class Stream:
    """A run's data from its start step on: host batches, the fixed eval batches on the devices, and what
    checkpoints record of the tokenizer."""

    train_batches: object  # iterator of host numpy batches
    eval_global: list
    tokenizer: TokenizerRecord | None
    data_sharding: object


def host_batches(config, workdir: str, start_step: int, process_index: int, process_count: int):
    """This process's stream of numpy batches from start_step on, its fixed eval batches, and the
    tokenizer (None for synthetic data) with the path of its vocabulary. With a batch-size warmup the
    stream is read in microbatches, step N's from microbatch P(N) on (training/batch_warmup.py)."""
    local_batch = config.train.batch_size // process_count
    warmup = BatchWarmup.from_config(config.train)
    data = DataSettings.from_config(config.data)
    if data.source == "synthetic":
        streams = synthetic.from_settings(data, vocab_size=config.model.vocab_size, shard=process_index)
    else:
        from bertjax.data import inputs  # imports TensorFlow (through text/tf_cpu): only where text is read

        streams = inputs.build_inputs(data, workdir=workdir, process_index=process_index,
                                      process_count=process_count)
    evals = streams.eval_batches(local_batch, config.logging.eval_batches)
    if warmup is None:
        return streams.train_batches(local_batch, start_step), evals, streams.tokenizer, streams.vocab_path
    micro = local_batch // warmup.max_microbatches
    microbatches = iter(streams.train_batches(micro, warmup.position(start_step)))
    train = warmup_batches(microbatches, warmup, start_step)
    return train, evals, streams.tokenizer, streams.vocab_path


def open_stream(config, workdir: str, bert_config: BertConfig, start_step: int, data_sharding) -> Stream:
    process_index, process_count = jax.process_index(), jax.process_count()
    announce_reading(DataSettings.from_config(config.data), workdir)
    train_batches, eval_batches, tokenizer, vocab_path = host_batches(config, workdir, start_step, process_index,
                                                                      process_count)
    record = tokenizer_record(tokenizer, vocab_path, bert_config, workdir, process_index == 0)
    eval_global = [sharding.global_batch(b, data_sharding) for b in eval_batches]
    baseline = pretraining_step.constant_guess_accuracy(eval_batches)
    if baseline is not None:
        say(f"held-out masked LM: the most frequent masked token, guessed everywhere, scores mlm_acc {baseline:.3f}")
    return Stream(train_batches, eval_global, record, data_sharding)


def announce_reading(data: DataSettings, workdir: str) -> None:
    """A line before the quiet part of a start: reading the corpus, and learning its vocabulary when the
    workdir has none yet (once; a minute or so for the demo corpus on a CPU)."""
    if data.source == "synthetic":
        return
    say(f"reading the {data.source} corpus" + (f" ({data.input_pattern})" if data.input_pattern else ""))
    learned = files.join(workdir, files.VOCAB_FILES[data.tokenizer])
    if data.source != "prepared" and not data.vocab_path and not files.path(learned).exists():
        say(f"learning a {data.tokenizer} vocabulary of {data.vocab_size:,} from it, once: it is kept as {learned} "
            f"(data.vocab_path=FILE reads one instead)")


def tokenizer_record(tokenizer, vocab_path: str | None, bert_config: BertConfig, workdir: str,
                     is_primary: bool) -> TokenizerRecord | None:
    """What a checkpoint records of its tokenizer (None for synthetic data), after checking that the
    model's embedding table has a row for each of its tokens."""
    if tokenizer is None:
        return None
    if tokenizer.vocab_size > bert_config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size="
                         f"{bert_config.vocab_size}: set model.vocab_size to at least {tokenizer.vocab_size}")
    kind = tokenizer.kind  # prepared shards name their own tokenizer, whatever data.tokenizer says
    # Kept in the workdir and recorded relative to it, so that a copied workdir still loads.
    name = workdirs.keep_vocabulary(workdir, vocab_path, kind) if is_primary else files.VOCAB_FILES[kind]
    return TokenizerRecord(kind, name, bool(tokenizer.lower_case))


# ----------------------------------------------------------------------------------------------------
# The loop and its hooks
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What the loop's hooks of a pretraining (or general distillation) run share."""

    config: ml_collections.ConfigDict
    workdir: str
    setup: pretraining_step.PretrainingSetup
    checkpointer: checkpoint.Checkpointer
    stream: Stream
    p_eval_step: Callable | None
    summarize_window: Callable = pretraining_step.summarize  # metric sums -> the logged line
    distill: dict | None = None  # what a distillation's checkpoints record of its teacher

    def meta(self, step: int) -> CheckpointMeta:
        return CheckpointMeta(step, dataclasses.asdict(self.setup.bert_config), self.config.optimizer.to_dict(),
                              schedule_record(self.config), stream_position(self.config, jax.process_count()),
                              self.stream.tokenizer, distill=self.distill, electra=electra_record(self.setup),
                              config=self.config.to_dict())

    def save(self, state, step: int, force: bool) -> None:
        self.checkpointer.save(step, state.params, state.opt_state, self.meta(step), force=force, fp8=state.fp8)


def hooks(run: Run, writer: writers.MetricWriter, preemption: Preemption) -> loop.Hooks:
    """log (training lines with throughput and MFU), evaluate (held-out lines), save, and the after-step
    checks: a failed background save stops the run now; the optional profiler."""
    config, setup = run.config, run.setup
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
    add_sums = jax.jit(functools.partial(jax.tree_util.tree_map, jnp.add))
    flops_per_token = []  # known from the first logged window's share of MLM tokens
    warmup = BatchWarmup.from_config(config.train)

    def log(step, window, speed):
        out = run.summarize_window(window)
        real_tokens = float(window["real_tokens"])
        sequences = window["steps"] * config.train.batch_size
        if warmup is not None:  # the batch in force at the logged step; the window's sequences, counted
            out["batch"] = warmup.batch_size(step - 1)
            sequences = warmup.microbatch * (warmup.position(step) - warmup.position(step - int(window["steps"])))
        out.update(learning_rate=float(setup.schedule(step - 1)), **speed,
                   padding_efficiency=real_tokens / (sequences * config.data.max_seq_length))
        if not flops_per_token:
            fraction = float(window["mlm_count"]) / max(real_tokens, 1.0)
            flops_per_token.append(run_flops_per_token(setup, config.data.max_seq_length, fraction))
        if peak and "tokens_per_second" in speed:
            out["mfu"] = flops.mfu(speed["tokens_per_second"], flops_per_token[0], jax.device_count(), peak)
        writer.write(step, out)

    def evaluate(state, step):
        totals = None
        for b in run.stream.eval_global:
            s = run.p_eval_step(state.params, b)
            totals = s if totals is None else add_sums(totals, s)
        if totals is not None:
            writer.write(step, pretraining_step.summarize(jax.device_get(totals)), split="eval")

    after_step = [lambda step, state: run.checkpointer.check_for_errors()]
    if config.logging.profile_first_step:
        after_step.append(loop.Profiler(files.join(run.workdir, "profile"), config.logging.profile_first_step,
                                        config.logging.profile_steps))
    return loop.Hooks(log=log, evaluate=evaluate, save=run.save, preemption=preemption, after_step=after_step)


def run_flops_per_token(setup, seq_len: int, predicted_fraction: float) -> float:
    """The training FLOPs of a token (flops.py): BERT's pretraining, or ELECTRA's two networks."""
    if setup.generator_config is not None:
        return flops.electra_flops_per_token(setup.bert_config, setup.generator_config, seq_len, predicted_fraction)
    return flops.config_flops_per_token(setup.bert_config, seq_len, predicted_fraction)


def run_steps(run: Run, state: TrainState, p_train_step, dropout_key) -> None:
    """The loop over the stream with its hooks, until train.num_steps (said where the model is) or a stop
    (start.Stopped, after saving)."""
    config = run.config
    start_step = int(state.step)
    writer = writers.MetricWriter(run.workdir, enabled=jax.process_index() == 0)
    writer.write_config(config.to_dict())
    if start_step > 0:
        writer.resumed(start_step)  # the steps an interrupted run logged after its checkpoint go
    preemption = Preemption()
    steps = loop.LoopSteps(start=start_step, total=config.train.num_steps, log_every=config.logging.log_every,
                           eval_every=config.logging.eval_every, save_every=config.checkpoint.every_steps)
    # Batches are made and put on the devices by a thread, ahead of the step that takes them.
    keys = pretraining_step.batch_keys(DataSettings.from_config(config.data).packing)
    device_batches = sharding.prefetch_to_devices(({k: b[k] for k in keys} for b in run.stream.train_batches),
                                                  run.stream.data_sharding, size=config.train.prefetch_batches)
    with jax.set_mesh(run.setup.mesh), nn.logical_axis_rules(run.setup.rules), device_batches:
        state, stopped_at = loop.run_loop(state, p_train_step, device_batches, dropout_key, steps,
                                          hooks(run, writer, preemption))
    run.checkpointer.wait()
    run.checkpointer.close()
    writer.close()
    if stopped_at is not None:
        say(f"{preemption.name}: saved the checkpoint of step {stopped_at}; re-run the same command to resume")
        raise start.Stopped(stopped_at, preemption.exit_code)
    say(f"done: step {config.train.num_steps}, checkpoints in {run.checkpointer.directory}; load the model with "
        f"bertjax.load({str(run.workdir)!r}), or fine-tune it with --config.train.init_from={run.workdir}")
