"""python -m bertjax.train: BERT pretraining, from one CPU to a pod.

    python -m bertjax.train --config=configs/tiny.py --workdir=/tmp/bertjax-tiny
    python -m bertjax.train --config=configs/large.py:lamb_phase1 --workdir=gs://bucket/large-p1

Re-running the same command resumes from the workdir's latest checkpoint; SIGTERM (preemption) saves
and exits cleanly. The story below reads top to bottom: distributed init -> mesh -> data -> model and
optimizer (shapes first, then created sharded) -> restore -> jitted step -> loop.

The model, the step and the synthetic data path import no TensorFlow: only the real input pipeline does.
"""

import contextlib
import dataclasses
import functools
import sys
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import app, flags, logging
import ml_collections
from ml_collections import config_flags

from bertjax import console
from bertjax.interop import pretrained
from bertjax.models import bert
from bertjax.text import files
from bertjax.training import checkpoint, flops, loop, pretraining, sharding, writers
from bertjax.training import workdir as workdirs
from bertjax.training.preemption import Preemption
from bertjax.training.pretraining import summarize
from bertjax.training.state import TrainState, root_keys

def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
        workdir=flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events go here."),
        coordinator_address=flags.DEFINE_string("coordinator_address", None,
                                                "host:port of process 0, for several processes."),
        num_processes=flags.DEFINE_integer("num_processes", None, "How many processes take part."),
        process_id=flags.DEFINE_integer("process_id", None, "This process's index."),
    )


def host_batches(config, workdir: str, start_step: int, process_index: int, process_count: int):
    """This process's stream of numpy batches from start_step on, its fixed eval batches, and the
    tokenizer (None for synthetic data) with the path of its vocabulary."""
    local_batch = config.train.batch_size // process_count
    data = config.data
    if data.source == "synthetic":
        from bertjax.data import synthetic

        kwargs = dict(batch_size=local_batch, max_seq_length=data.max_seq_length,
                      max_predictions_per_seq=data.max_predictions_per_seq, vocab_size=config.model.vocab_size,
                      seed=data.seed, shard=process_index, packed=data.get("packing", False),
                      max_sequences_per_row=data.get("max_sequences_per_row", 8), mask_rate=data.get("mask_rate", 0.15))
        evals = [synthetic.synthetic_batch(i, split=1, **kwargs) for i in range(config.logging.eval_batches)]
        return synthetic.synthetic_batches(start_step, **kwargs), evals, None, None
    from bertjax.text import tf_cpu

    tf_cpu.import_tensorflow()  # TensorFlow only reads and masks text here: the accelerators belong to JAX
    from bertjax.data import inputs

    streams = inputs.build_inputs(data, workdir=workdir, process_index=process_index, process_count=process_count)
    evals = streams.eval_batches(local_batch, config.logging.eval_batches)
    return streams.train_batches(local_batch, start_step), evals, streams.tokenizer, streams.vocab_path


def say(message: str) -> None:
    """A line for the person running the job (process 0 only); library INFO logs stay off by default."""
    if jax.process_index() == 0:
        print(message, flush=True)


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    config, workdir = args.config, args.workdir
    if not workdir:
        console.fail("--workdir is required (checkpoints and metrics go there)")
    distributed = dict(coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                       process_id=args.process_id)
    try:
        code = run(config, workdir, **distributed)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        console.fail(str(e))
    except KeyboardInterrupt:  # outside the loop, which alone turns Ctrl-C into a save
        print("Ctrl-C outside the training steps: stopped; the last checkpoint stays the one to resume from",
              file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


def run(config, workdir: str, coordinator_address: str | None = None, num_processes: int | None = None,
        process_id: int | None = None) -> int:
    """The whole run; returns the exit code (130 when Ctrl-C stopped it, after saving)."""
    # ---------------------------------------------------------------- distributed init, the workdir's lock
    sharding.initialize_distributed(coordinator_address, num_processes, process_id)
    files.make(workdir)  # a local directory or gs://...: everything below goes through bertjax.training.workdir
    with workdirs.WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return train(config, workdir)


def train(config, workdir: str) -> int:
    process_count = jax.process_count()

    # ---------------------------------------------------------------- mesh
    mesh, rules, data_sharding = make_mesh(config)

    # ---------------------------------------------------------------- model and optimizer: shapes first
    init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
    setup = pretraining.setup(config, mesh, rules, init_key)
    bert_config, abstract_state = setup.bert_config, setup.abstract_state
    bert.check_input_shapes(bert_config, config.data.max_seq_length, config.data.max_predictions_per_seq)
    say(describe_model(bert_config, abstract_state.params))

    # ---------------------------------------------------------------- restore: workdir > init_from > scratch
    checkpointer = make_checkpointer(config, workdir, abstract_state)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = restore(config, setup, checkpointer, init_key, process_count)

    # ---------------------------------------------------------------- data
    config = with_init_from_vocabulary(config)
    stream = open_stream(config, workdir, bert_config, int(state.step), data_sharding)

    # ---------------------------------------------------------------- jitted steps
    p_train_step, p_eval_step = setup.compile_steps(data_sharding, config.train.grad_accum_steps)

    # ---------------------------------------------------------------- loop
    return run_steps(config, workdir, setup, checkpointer, state, p_train_step, p_eval_step, stream, dropout_key)


def make_mesh(config):
    """(mesh, logical rules, the batches' sharding) of config.mesh, the batch size checked against it."""
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.logical_axis_rules)
    sharding.check_batch_size(config.train.batch_size, config.train.grad_accum_steps, mesh, rules)
    say(f"{jax.process_count()} process(es), {jax.device_count()} {jax.devices()[0].device_kind} device(s), "
        f"mesh {dict(mesh.shape)}")
    return mesh, rules, sharding.batch_sharding(mesh, rules)


@dataclasses.dataclass
class Stream:
    """A run's data from its start step on: host batches, the fixed eval batches on the devices, and what
    checkpoints record of the tokenizer."""

    train_batches: object  # iterator of host numpy batches
    eval_global: list
    tokenizer_meta: dict | None
    data_sharding: object


def open_stream(config, workdir: str, bert_config: bert.BertConfig, start_step: int, data_sharding) -> Stream:
    process_index, process_count = jax.process_index(), jax.process_count()
    train_batches, eval_batches, tokenizer, vocab_path = host_batches(config, workdir, start_step, process_index,
                                                                      process_count)
    tokenizer_meta = tokenizer_metadata(tokenizer, vocab_path, bert_config, workdir, process_index == 0)
    eval_global = [sharding.global_batch(b, data_sharding) for b in eval_batches]
    baseline = pretraining.constant_guess_accuracy(eval_batches)
    if baseline is not None:
        say(f"held-out masked LM: the most frequent masked token, guessed everywhere, scores mlm_acc {baseline:.3f}")
    return Stream(train_batches, eval_global, tokenizer_meta, data_sharding)


def run_steps(config, workdir: str, setup, checkpointer: checkpoint.Checkpointer, state: TrainState,
              p_train_step, p_eval_step, stream: Stream, dropout_key, summarize_window: Callable = summarize,
              extra_meta: dict | None = None) -> int:
    """The loop over the stream with its hooks (metrics, evaluation, checkpoints, preemption), until
    train.num_steps or a stop; returns the exit code. summarize_window and extra_meta: another program's
    logged metrics and what its checkpoints record besides pretraining's (distillation's)."""
    start_step, process_count = int(state.step), jax.process_count()
    writer = writers.MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.write_config(config.to_dict())
    if start_step > 0:
        writer.resumed(start_step)  # the steps an interrupted run logged after its checkpoint go
    parts = RunHooks(config, setup, writer, checkpointer, p_eval_step, stream.eval_global, stream.tokenizer_meta,
                     process_count, summarize_window=summarize_window, extra_meta=dict(extra_meta or {}))
    preemption = Preemption()
    hooks = loop.Hooks(log=parts.log, evaluate=parts.evaluate, save=parts.save, preemption=preemption,
                       after_step=after_step_hooks(config, workdir, checkpointer))
    steps = loop.LoopSteps(start=start_step, total=config.train.num_steps, log_every=config.logging.log_every,
                           eval_every=config.logging.eval_every, save_every=config.checkpoint.every_steps)
    # Batches are made and put on the devices by a thread, ahead of the step that takes them.
    keys = pretraining.batch_keys(config.data.get("packing", False))
    device_batches = sharding.prefetch_to_devices(({k: b[k] for k in keys} for b in stream.train_batches),
                                                  stream.data_sharding, size=config.train.prefetch_batches)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules), device_batches:
        state, stopped_at = loop.run_loop(state, p_train_step, device_batches, dropout_key, steps, hooks)
    if stopped_at is not None:
        checkpointer.wait()
        say(f"{preemption.name}: saved the checkpoint of step {stopped_at}; re-run the same command to resume")
    checkpointer.wait()
    checkpointer.close()
    writer.close()
    return preemption.exit_code


def describe_model(bert_config: bert.BertConfig, abstract_params) -> str:
    """The one line that says which model (and which compute choices) this run trains."""
    return (f"model: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}, "
            f"{bert.count_params(abstract_params):,} parameters; {bert_config.dtype} compute, "
            f"{bert_config.attention_impl} attention (dropout {bert_config.attention_dropout_rate}), "
            f"{bert_config.word_embedding} word embedding, remat {bert_config.remat_policy}"
            + (", scanned layers" if bert_config.scan_layers else ""))


def make_checkpointer(config, workdir: str, abstract_state) -> checkpoint.Checkpointer:
    """The workdir's checkpoints; their size is known from the shapes, before any array exists."""
    return checkpoint.Checkpointer(
        workdir, every_steps=config.checkpoint.every_steps, keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
        bytes_per_checkpoint=sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(abstract_state)))


def restore(config, setup, checkpointer: checkpoint.Checkpointer, init_key, process_count: int) -> TrainState:
    """The one restore order: this workdir's latest checkpoint > train.init_from's parameters > scratch.
    Runs under the mesh and its logical rules, so that what it creates is sharded."""
    bert_config, abstract_state = setup.bert_config, setup.abstract_state
    restored = checkpointer.restore_latest(abstract_state.params, abstract_state.opt_state,
                                           check_meta=functools.partial(check_same_run, config=config,
                                                                        bert_config=bert_config))
    if restored is not None:
        check_same_stream(restored.meta, config, process_count)
        say(f"resumed from step {restored.step} ({checkpointer.directory})")
        return TrainState(jnp.int32(restored.step), restored.params, restored.opt_state)
    state = setup.init(init_key)
    if config.train.init_from:
        state = state.replace(params=initial_params(config.train.init_from, bert_config, abstract_state.params))
        say(f"parameters from {config.train.init_from}")
    return state


def tokenizer_metadata(tokenizer, vocab_path: str | None, bert_config: bert.BertConfig, workdir: str,
                       is_primary: bool) -> dict | None:
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
    return {"kind": kind, "path": name, "lower_case": bool(tokenizer.lower_case)}


def after_step_hooks(config, workdir: str, checkpointer: checkpoint.Checkpointer) -> list:
    """Called after every step: a failed background save stops the run now; the optional profiler."""
    after_step = [lambda step, state: checkpointer.check_for_errors()]
    if config.logging.profile_first_step:
        after_step.append(loop.Profiler(files.join(workdir, "profile"), config.logging.profile_first_step,
                                        config.logging.profile_steps))
    return after_step


@dataclasses.dataclass
class RunHooks:
    """The run's parts the loop's log/evaluate/save hooks need, and those hooks."""
    config: ml_collections.ConfigDict
    setup: pretraining.PretrainingSetup
    writer: writers.MetricWriter
    checkpointer: checkpoint.Checkpointer
    p_eval_step: Callable
    eval_global: list
    tokenizer_meta: dict | None
    process_count: int
    summarize_window: Callable = summarize  # metric sums -> the logged line
    extra_meta: dict = dataclasses.field(default_factory=dict)  # recorded in every checkpoint besides the rest
    flops_per_token: float | None = None  # known from the first logged window's share of MLM tokens
    peak: float | None = dataclasses.field(
        default_factory=lambda: flops.peak_flops_per_device(jax.devices()[0].device_kind))
    add_sums: Callable = dataclasses.field(
        default_factory=lambda: jax.jit(functools.partial(jax.tree_util.tree_map, jnp.add)))

    def log(self, step, window, speed):
        config, bert_config = self.config, self.setup.bert_config
        out = self.summarize_window(window)
        real_tokens = float(window["real_tokens"])
        out.update(learning_rate=float(self.setup.schedule(step - 1)), **speed,
                   padding_efficiency=real_tokens / (window["steps"] * config.train.batch_size
                                                     * config.data.max_seq_length))
        if self.flops_per_token is None:
            fraction = float(window["mlm_count"]) / max(real_tokens, 1.0)
            self.flops_per_token = flops.config_flops_per_token(bert_config, config.data.max_seq_length, fraction)
        if self.peak and "tokens_per_second" in speed:
            out["mfu"] = flops.mfu(speed["tokens_per_second"], self.flops_per_token, jax.device_count(), self.peak)
        self.writer.write(step, out)

    def evaluate(self, state, step):
        totals = None
        for b in self.eval_global:
            s = self.p_eval_step(state.params, b)
            totals = s if totals is None else self.add_sums(totals, s)
        if totals is not None:
            self.writer.write(step, summarize(jax.device_get(totals)), split="eval")

    def save(self, state, step, force):
        meta = {"step": step, "model": self.setup.bert_config.__dict__, "optimizer": self.config.optimizer.to_dict(),
                "data": stream_position(self.config, self.process_count), "tokenizer": self.tokenizer_meta,
                **self.extra_meta}
        self.checkpointer.save(step, state.params, state.opt_state, meta, force=force)


# What a checkpoint's arrays are: a resumed run must agree on all of it (checked before reading them).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                       "max_position_embeddings", "type_vocab_size", "pre_layer_norm", "scan_layers", "param_dtype",
                       # the family options (RoBERTa, ALBERT, ModernBERT); older checkpoints lack them
                       "position_embedding", "position_offset", "activation", "norm_placement", "use_bias", "norm",
                       "rotary_theta", "global_rotary_theta", "local_attention_window", "global_attention_every",
                       "embedding_size", "num_hidden_groups", "layer_heads", "head_size", "pooler")


def check_same_run(step: int, meta: dict, *, config, bert_config: bert.BertConfig) -> None:
    """Stop, naming what differs, when the workdir's checkpoint is not of this config's model and
    optimizer; the checkpoints stay as they are."""
    saved_model, saved_optimizer = meta.get("model", {}), meta.get("optimizer")
    def as_saved(value):  # tuples come back from the checkpoint's JSON as lists
        return list(value) if isinstance(value, tuple) else value

    differences = [f"model.{k}={saved_model[k]!r}, the config {getattr(bert_config, k)!r}" for k in ARCHITECTURE_FIELDS
                   if k in saved_model and saved_model[k] != as_saved(getattr(bert_config, k))]
    if saved_optimizer is not None and saved_optimizer.get("name") != config.optimizer.name:
        differences.append(f"optimizer.name={saved_optimizer.get('name')!r}, the config {config.optimizer.name!r}")
    if differences:
        raise ValueError(f"the checkpoint at step {step} has {'; '.join(differences)}: use a new workdir, or "
                         f"train.init_from=<this workdir> in a new one for the parameters only")


def stream_position(config, process_count: int) -> dict:
    """What decides the data stream besides the step: a resumed run must agree on all of it."""
    data = config.data
    return {"seed": data.seed, "batch_size": config.train.batch_size, "process_count": process_count,
            "max_seq_length": data.max_seq_length, "source": data.source,
            # As the config says them (data.inputs resolves them; its module imports TensorFlow).
            **{key: data.get(key) for key in ("objective", "mask_rate", "masked_lm_prob", "eval_mask_rate", "packing")},
            # Each source of a mixture and its weight (lists, as the checkpoint's JSON gives them back).
            "mixture": [dict(entry) for entry in data.get("mixture", None) or ()]}


def check_same_stream(meta: dict, config, process_count: int) -> None:
    saved, now = meta.get("data", {}), stream_position(config, process_count)
    changed = {k: (saved.get(k), v) for k, v in now.items() if k in saved and saved[k] != v}
    if changed:
        logging.warning("resuming with a different data stream than the checkpoint's (%s): "
                        "the examples after the checkpoint differ from an uninterrupted run", changed)


def initial_params(path: str, bert_config: bert.BertConfig, abstract_params):
    """Parameters only, through the one init-from, restored straight into the state's shardings; their
    architecture must be this config's."""
    compute = {k: getattr(bert_config, k) for k in ("dtype", "param_dtype", "attention_impl", "remat_policy",
                                                  "scan_layers")}
    model = pretrained.load(path, what="train.init_from", model_overrides=compute, abstract_params=abstract_params,
                            tokenizer=False)
    differ = [f"{field}={getattr(model.config, field)!r} but the config has model.{field}="
              f"{getattr(bert_config, field)!r}" for field in ARCHITECTURE_FIELDS
              if getattr(model.config, field) != getattr(bert_config, field)]
    if differ:
        raise ValueError(f"train.init_from={path} has {'; '.join(differ)}")
    if model.missing:
        logging.info("initialised fresh (not in %s): %s", path, model.missing)
    return model.params


def with_init_from_vocabulary(config):
    """Continued pretraining reads text with the starting model's own tokenizer: train.init_from's
    vocabulary stands in for data.vocab_path when that is unset (a vocabulary learned anew would give
    the pretrained embeddings other tokens' ids)."""
    return with_model_vocabulary(config, config.train.init_from, "train.init_from")


def with_model_vocabulary(config, path: str | None, what: str):
    """config with the vocabulary of the model at `path` (setting `what`) as data.vocab_path, where that is
    unset and the data is text; as it is otherwise."""
    data = config.data
    if not path or data.vocab_path or data.source in ("synthetic", "prepared"):
        return config
    tokenizer = pretrained.tokenizer_files(path, what=what)
    if tokenizer is None:
        return config
    say(f"tokenizer: the vocabulary of {path} ({tokenizer.kind})")
    config = ml_collections.ConfigDict(config.to_dict())
    config.data.update(vocab_path=tokenizer.vocab_path, tokenizer=tokenizer.kind, lower_case=tokenizer.lower_case)
    return config


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
