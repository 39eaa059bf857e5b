"""python -m bertjax.finetune: a pretrained BERT fine-tuned on one task with one extra output layer.

    python -m bertjax.finetune --config=configs/finetune/sst2.py --config.train.init_from=/tmp/bertjax-tiny \
        --workdir=/tmp/ft-sst2
    python -m bertjax.finetune --config=configs/finetune/mrpc.py --config.train.init_from=/models/bert-base-uncased \
        --config.sweep=True --workdir=/tmp/ft-mrpc

init_from is a bertjax pretraining (or fine-tuning) workdir or checkpoint, or a Hugging Face BERT
directory. The story: mesh -> the pretrained encoder and its tokenizer -> the task's examples as
features -> head, optimizer and state -> restore (a stopped run resumes) -> the loop of bertjax.training.loop,
evaluating on the dev set(s) every epoch -> the best dev checkpoint's predictions and a summary line.

WORKDIR gets metrics.jsonl (training lines; dev lines with split=<dev split> and the task's metrics),
TensorBoard events, config.json, checkpoints/ (to resume), best/ (the best dev checkpoint, what
bertjax.load reads), predictions/ (every dev and test split predicted by the best checkpoint, in each
benchmark's own form: GLUE submission TSVs, the official SQuAD scripts' JSON files, conlleval's columns;
see bertjax/tasks/kinds/) and summary.json.

The setup, the step (gradient accumulation included), the loop and the preemption handling are
pretraining's (bertjax.training): SIGTERM saves and exits 0, Ctrl-C saves and exits 130, and re-running
the same command resumes.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from ml_collections import config_dict, config_flags

from bertjax import console
from bertjax.compression import pruning
from bertjax.interop import pretrained as pretrained_models
from bertjax.models import bert, heads
from bertjax.text import files
from bertjax.training import checkpoint, loop, optim, sharding, writers
from bertjax.training import workdir as workdirs
from bertjax.training.preemption import Preemption
from bertjax.training.state import Setup, TrainState, root_keys


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it (evaluate, the tests, a notebook)
    defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/finetune/<task>.py file.", lock_config=True),
        workdir=flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl, predictions and the summary go here."),
    )


INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")
TRAIN_KEYS = INPUT_KEYS + ("label", "example_weight")
PACKED_INPUT_KEYS = ("sequence_ids", "position_ids", "cls_positions")  # = batches.PACKED_INPUT_KEYS


# ----------------------------------------------------------------------------------------------------
# The pretrained model
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Pretrained:
    """What init_from gives a task: the encoder's config and params (or a whole head of this task's
    shape, from a fine-tuning checkpoint or the task's Hugging Face class), and the tokenizer."""

    bert_config: bert.BertConfig
    params: dict  # {"bert": ...} at least
    tokenizer: object
    files: pretrained_models.TokenizerFiles
    whole_head: bool  # params carry a classifier of this task (continue fine-tuning)


def init_from(config) -> str:
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


def load_pretrained(path: str, kind: str, num_labels: int, model_overrides: dict) -> Pretrained:
    """The encoder (and tokenizer) of a task, through the one init-from."""
    model = pretrained_models.load(path, what="train.init_from", model_overrides=model_overrides, head=kind,
                                   num_labels=num_labels)
    if model.tokenizer is None:
        raise ValueError(f"train.init_from={path} was pretrained on synthetic data and has no tokenizer: "
                         "fine-tune a checkpoint trained on text")
    if model.meta:  # a bertjax checkpoint: a fine-tuning one of this task carries its classifier
        task = model.task or {}
        whole_head = task.get("kind") == kind and "classifier" in model.params and (
            model.params["classifier"]["bias"].shape[-1] == num_labels)
    else:  # Hugging Face: the task's own class has its classifier
        whole_head = not any(m.startswith("classifier") for m in model.missing)
    return Pretrained(model.config, model.params, model.tokenizer.load(), model.tokenizer, whole_head)


# ----------------------------------------------------------------------------------------------------
# Pure step functions
# ----------------------------------------------------------------------------------------------------


def task_loss(params, batch: dict, dropout_rng, *, net, loss, teacher=None):
    """The head's loss on a batch of task examples: (loss, metric sums), as step.train_step takes it.
    A packed batch (bertjax/tasks/batches.py) carries sequence_ids, position_ids and cls_positions too.
    teacher (task distillation): inputs -> a teacher's logits, which loss then takes as a fourth argument."""
    weights = batch["example_weight"]  # [B] ([B, Q] packed)
    packed = {k: batch[k] for k in PACKED_INPUT_KEYS if k in batch}
    if "label_weight" in batch:  # tagging: the tokens that carry a tag, [B, S]
        # Packed rows hold their examples' weights in label_weight already.
        weights = batch["label_weight"] if packed else batch["label_weight"] * weights[:, None]
    logits = net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=False,
                       rngs={"dropout": dropout_rng}, **packed)
    if teacher is not None:
        return loss(logits, batch["label"], weights, teacher(*(batch[k] for k in INPUT_KEYS), **packed))
    return loss(logits, batch["label"], weights)


def task_logits(params, batch: dict, *, net):
    return net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=True)


def summarize_train(window: dict) -> dict:
    steps = max(float(window["steps"]), 1.0)
    out = {"loss": float(window["loss_sum"]) / steps, "grad_norm": float(window["grad_norm_sum"]) / steps}
    if "correct" in window:
        out["accuracy"] = float(window["correct"]) / max(float(window["count"]), 1.0)
    if "soft_loss_sum" in window:  # task distillation's loss toward the teacher
        out["soft_loss"] = float(window["soft_loss_sum"]) / max(float(window["count"]), 1.0)
    return out


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------


def task_from_config(config):
    from bertjax.tasks import registry

    labels = list(config.data.labels) if config.data.labels else None
    return registry.get_task(config.task, labels=labels, num_choices=config.data.num_choices,
                             squad_version=config.data.get("squad_version"))


def feature_based_settings(config, task, num_layers: int) -> dict | None:
    """config.feature_based as heads.network takes it, checked against the model's layers; None when off."""
    from bertjax.tasks import kinds

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


def check_inputs(config) -> None:
    """The files config.data names exist: said in one line (the readers' own) before any model is loaded."""
    for name in ("train", "validation", "test"):
        path = config.data.get(name)
        if path and not os.path.exists(path):
            raise ValueError(f"{path}: no such file")


def split_features(task, tokenizer, config) -> tuple:
    """(train Split, {dev split: Split}, {test split: Split}) of the task (bertjax.tasks.scoring.Split:
    examples and features, by the task's kind), from the user's files where config.data names them, else
    from TFDS."""
    from bertjax.tasks import kinds, scoring

    data, kind = config.data, kinds.get(task.kind)
    settings = kind.settings_from_config(config)

    def read(split_name, file, labeled=True):
        examples = kind.read(task, split_name, path=file, data_dir=data.tfds_data_dir, labeled=labeled)
        features = kind.featurize(task, examples, tokenizer, data.max_seq_length, settings)
        return scoring.Split(examples, features, labeled)

    if not data.train and task.train_split is None:
        raise ValueError(f"task {task.name} has no training split of its own: set config.data.train to a JSON-lines "
                         "file")
    train = read("train" if data.train else task.train_split, data.train)
    if data.validation:
        dev = {"validation": read("validation", data.validation)}
    elif task.tfds_name is not None:
        dev = {split: read(split, None) for split in task.eval_splits}
    else:
        raise ValueError(f"task {task.name} needs a dev set to evaluate on: set config.data.validation to a "
                         "JSON-lines file")
    if data.test:
        test = {"test": read("test", data.test, labeled=False)}
    elif task.tfds_name is not None and not data.train:
        test = {split: read(split, None, labeled=False) for split in task.test_splits}
    else:
        test = {}
    return train, dev, test


# ----------------------------------------------------------------------------------------------------
# The program
# ----------------------------------------------------------------------------------------------------


def say(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    config, workdir = args.config, args.workdir
    if not workdir:
        console.fail("--workdir is required (checkpoints, metrics and predictions go there)")
    try:
        sharding.initialize_distributed()  # the coordinator from the launcher's variables or the cluster
        if config.sweep:
            sweep(config, workdir)
        else:
            finetune(config, workdir)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        console.fail(str(e))
    except Stopped as e:  # saved: SIGTERM exits 0 (asked to stop and did), Ctrl-C 130
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # outside the loop, which alone turns Ctrl-C into a save
        print("Ctrl-C: stopped; re-run the same command to resume from the last checkpoint", file=sys.stderr)
        sys.exit(130)


class Stopped(Exception):
    """SIGTERM or Ctrl-C stopped a run after its checkpoint was saved: the program exits (a sweep too)."""

    def __init__(self, step: int, exit_code: int):
        super().__init__(f"stopped at step {step}")
        self.step, self.exit_code = step, exit_code


def sweep(config, workdir: str) -> dict:
    """The paper's model selection: one run per learning rate, the best on the dev set's main metric."""
    files.make(workdir)
    results = {}
    for rate in config.sweep_learning_rates:
        run_config = config_dict.ConfigDict(config.to_dict())
        run_config.optimizer.learning_rate = float(rate)
        run_config.sweep = False
        say(f"--- learning rate {rate:g}")
        results[float(rate)] = finetune(run_config, files.join(workdir, f"lr-{rate:g}"))
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


def finetune(config, workdir: str) -> dict:
    """One fine-tuning run; returns its summary (also written to WORKDIR/summary.json)."""
    files.make(workdir)
    with workdirs.WorkdirLock(workdir) if jax.process_index() == 0 else contextlib.nullcontext():
        return _finetune(config, workdir)


def _finetune(config, workdir: str) -> dict:
    check_inputs(config)  # a missing file is one line now, not after the model has loaded
    from bertjax.text import tf_cpu

    tf_cpu.import_tensorflow()  # TensorFlow only tokenizes here: the accelerators belong to JAX
    from bertjax.tasks import kinds

    # ---------------------------------------------------------------- mesh
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.logical_axis_rules)
    sharding.check_batch_size(config.train.batch_size, config.train.grad_accum_steps, mesh, rules)
    data_sharding = sharding.batch_sharding(mesh, rules)

    # ---------------------------------------------------------------- task and pretrained model
    task = task_from_config(config)
    num_labels = heads.resolve_num_labels(task.kind, kinds.get(task.kind).num_labels(task.labels))
    pretrained = pretrained_for(config, task, num_labels)

    # ---------------------------------------------------------------- data
    data = task_data(config, task, pretrained.tokenizer, mesh, rules)

    # ---------------------------------------------------------------- head, optimizer, state: shapes first
    feature_based = feature_based_settings(config, task, pretrained.bert_config.num_layers)
    init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
    setup = task_setup(config, task, pretrained, num_labels, feature_based, data.num_steps, mesh, rules, init_key)

    # ---------------------------------------------------------------- restore: this workdir > init_from
    checkpointer = checkpoint.Checkpointer(workdir, every_steps=data.steps_per_epoch, keep=config.checkpoint.keep,
                                           async_save=config.checkpoint.async_save)
    state, best = restore(checkpointer, setup, task, init_key)

    # ---------------------------------------------------------------- jitted steps
    loss = functools.partial(task_loss, net=setup.net, loss=heads.head(task.kind).loss)
    if config.get("distill") and config.distill.teacher:  # task distillation: the teacher inside the step
        p_train_step = distillation_step(config, task, num_labels, pretrained, setup, data_sharding)
    else:
        p_train_step = setup.compile_train_step(loss, data_sharding, config.train.grad_accum_steps)
    p_logits = setup.compile_eval_step(functools.partial(task_logits, net=setup.net), data_sharding)
    scorer = Scorer(task, data.settings, p_logits, data_sharding, config.logging.eval_batch_size)

    # ---------------------------------------------------------------- the loop, evaluating every epoch
    writer = writers.MetricWriter(workdir, enabled=jax.process_index() == 0)
    writer.write_config(config.to_dict())
    if int(state.step) > 0:
        writer.resumed(int(state.step))
    meta = run_meta(config, workdir, task, pretrained, feature_based, data.settings)
    run = Run(config, workdir, task, data, scorer, checkpointer, writer, meta, best, setup.schedule)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = train(run, state, p_train_step, dropout_key, data_sharding)

    # ---------------------------------------------------------------- predictions of the best checkpoint
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        written = predict_splits(run, state, setup.abstract_state.params)
    return summarize(run, written)


# ----------------------------------------------------------------------------------------------------
# The stages of a run
# ----------------------------------------------------------------------------------------------------


def pretrained_for(config, task, num_labels: int) -> Pretrained:
    """init_from loaded for the task's head, said in one line, its vocabulary checked against the model."""
    source = init_from(config)
    pretrained = load_pretrained(source, task.kind, num_labels, config.model.to_dict())
    bert_config = pretrained.bert_config
    say(f"task {task.name} ({task.kind}{', labels ' + ', '.join(task.labels) if task.labels else ''}); "
        f"from {source}: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}")
    if pretrained.tokenizer.vocab_size > bert_config.vocab_size:
        raise ValueError(f"the vocabulary of {source} has {pretrained.tokenizer.vocab_size} tokens but "
                         f"its model only {bert_config.vocab_size}: a checkpoint of another vocabulary size")
    return pretrained


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


def task_data(config, task, tokenizer, mesh=None, rules=None) -> TaskData:
    """Every split read and featurized; the steps of config.train.epochs over the training rows; with
    data.packing the rows of a packed step (derived: the most any step of the run needs, rounded up to
    what the data-parallel devices and processes divide)."""
    from bertjax.tasks import batches as task_batches
    from bertjax.tasks import kinds

    packing = packing_settings(config, task, bool(config.get("feature_based") and config.feature_based.enabled))
    train_split, dev_splits, test_splits = split_features(task, tokenizer, config)
    batch_size = config.train.batch_size
    num_train = task_batches.num_examples(train_split.features)
    num_steps = task_batches.num_train_steps(num_train, batch_size, config.train.epochs)
    dev_sizes = ", ".join(f"{len(s.examples)} {split}" for split, s in dev_splits.items())
    rows = "" if num_train == len(train_split.examples) else f" in {num_train} rows"
    say(f"{len(train_split.examples)} training examples{rows}, {dev_sizes}; {num_steps} steps of {batch_size} "
        f"({config.train.epochs:g} epochs)")
    packed = None
    if packing:
        packed = packed_rows(config, train_split.features, num_steps, *packing, mesh=mesh, rules=rules)
    return TaskData(train_split, dev_splits, test_splits, kinds.get(task.kind).settings_from_config(config),
                    num_steps, math.ceil(num_train / batch_size), packed)


def packed_rows(config, features: dict, num_steps: int, max_sequences: int, rows: int | None, *, mesh=None,
                rules=None) -> Packing:
    """The Packing of the run: data.packed_rows as set, or derived and said in one line."""
    from bertjax.tasks import batches as task_batches

    batch_size, k = config.train.batch_size, config.train.grad_accum_steps
    lengths = task_batches.example_lengths(features)
    if rows is None:
        per_microbatch = task_batches.packed_rows_needed(
            lengths, batch_size, config.train.seed, num_steps, max_seq_length=config.data.max_seq_length,
            max_sequences=max_sequences, grad_accum_steps=k)
        unit = sharding.data_parallel_size(mesh, rules) if mesh is not None else 1
        unit = math.lcm(unit, jax.process_count())
        rows = k * (-(-per_microbatch // unit) * unit)
        real = float(np.sum(lengths)) / len(lengths) * batch_size
        say(f"packing: {batch_size} examples a step in {rows} rows of {config.data.max_seq_length} (about "
            f"{100 * real / (rows * config.data.max_seq_length):.0f}% real tokens; unpacked "
            f"{100 * real / (batch_size * config.data.max_seq_length):.0f}%)")
    if mesh is not None:
        sharding.check_batch_size(rows, k, mesh, rules)
    return Packing(rows, max_sequences)


def restore(checkpointer, setup: Setup, task, init_key) -> tuple[TrainState, dict]:
    """The state to start from (this workdir's latest checkpoint, else fresh with the pretrained encoder)
    and the best dev result so far."""
    abstract_state = setup.abstract_state
    restored = checkpointer.restore_latest(abstract_state.params, abstract_state.opt_state,
                                           check_meta=functools.partial(_check_same_task, task=task))
    if restored is None:
        return setup.init(init_key), {"step": 0, "value": -math.inf, "metrics": {}}
    say(f"resumed from step {restored.step}")
    state = TrainState(jnp.int32(restored.step), restored.params, restored.opt_state)
    return state, restored.meta.get("best", {"step": 0, "value": -math.inf, "metrics": {}})


def _gather(x) -> np.ndarray:
    """The rows of every process, in global order (one process: as it is)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


@dataclasses.dataclass
class Scorer:
    """A split's logits from the jitted eval step, scored by the task's kind."""

    task: object
    settings: object  # the kind's own
    p_logits: object  # jitted (params, batch) -> logits
    data_sharding: object
    batch_size: int

    def logits_of(self, params, feats) -> np.ndarray:
        """The logits of every row of a split's features, in order (float32 [N, ...])."""
        from bertjax.tasks import batches as task_batches

        outs = []
        for b in task_batches.eval_batches(feats, self.batch_size, process_index=jax.process_index(),
                                           process_count=jax.process_count()):
            batch = sharding.global_batch({k: b[k] for k in INPUT_KEYS}, self.data_sharding)
            logits = _gather(self.p_logits(params, batch))
            outs.append(np.asarray(logits, np.float32)[_gather(b["example_weight"]) > 0])
        return np.concatenate(outs)

    def __call__(self, params, split_name: str, split, null_threshold: float = 0.0):
        from bertjax.tasks import scoring

        return scoring.score(self.task, split_name, split, self.logits_of(params, split.features),
                             settings=self.settings, null_threshold=null_threshold)


def run_meta(config, workdir: str, task, pretrained: Pretrained, feature_based, settings) -> dict:
    """What every checkpoint of the run carries: the model, optimizer, tokenizer and task (bertjax.load
    reads the task's kind, labels and settings back)."""
    keep = jax.process_index() == 0
    return {"model": pretrained.bert_config.__dict__, "optimizer": config.optimizer.to_dict(),
            "tokenizer": {"kind": pretrained.files.kind, "lower_case": pretrained.files.lower_case,
                          "path": workdirs.keep_vocabulary(workdir, pretrained.files.vocab_path, pretrained.files.kind)
                          if keep else files.VOCAB_FILES[pretrained.files.kind]},
            "task": {"name": task.name, "kind": task.kind, "labels": list(task.labels),
                     "num_choices": task.num_choices, "max_seq_length": config.data.max_seq_length,
                     "squad_version": task.squad_version, "feature_based": feature_based,
                     "squad_settings": dataclasses.asdict(settings) if settings else None}}


@dataclasses.dataclass
class Run:
    """What the loop's hooks and the final predictions share."""

    config: object
    workdir: str
    task: object
    data: TaskData
    scorer: Scorer
    checkpointer: object
    writer: object
    meta: dict
    best: dict  # the best dev result so far: step, value, metrics (and null_threshold), updated in place
    schedule: object


def hooks(run: Run, preemption: Preemption) -> loop.Hooks:
    """log (training lines), evaluate (dev lines; the best checkpoint kept), save, and the after-step checks."""
    config, writer, best = run.config, run.writer, run.best

    def log(step, window, speed):
        writer.write(step, dict(summarize_train(window), learning_rate=float(run.schedule(step - 1)), **speed))

    def evaluate(state, step):
        scores = {split: run.scorer(state.params, split, s).metrics for split, s in run.data.dev.items()}
        for split, values in scores.items():
            writer.write(step, values, split=split)
        # The main metric of the first dev split chooses the best checkpoint (MNLI: matched).
        first = scores[next(iter(run.data.dev))]
        value = first[run.task.main_metric]
        if value > best["value"]:
            best.update(step=step, value=float(value), metrics=scores)
            # SQuAD v2.0: the no-answer threshold this dev set chose is kept with the model.
            best["null_threshold"] = float(first.get("best_f1_threshold", 0.0))
            meta_task = dict(run.meta["task"], null_threshold=best["null_threshold"])
            checkpoint.save_params(run.workdir, checkpoint.BEST_DIR, step, state.params,
                                   dict(run.meta, task=meta_task, step=step, best=dict(best)))

    def save(state, step, force):
        run.checkpointer.save(step, state.params, state.opt_state, dict(run.meta, step=step, best=dict(best)),
                              force=force)

    after_step = [lambda step, state: run.checkpointer.check_for_errors()]
    if config.logging.profile_first_step:
        after_step.append(loop.Profiler(files.join(run.workdir, "profile"), config.logging.profile_first_step,
                                        config.logging.profile_steps))
    return loop.Hooks(log=log, evaluate=evaluate, save=save, preemption=preemption, after_step=after_step)


def train(run: Run, state: TrainState, p_train_step, dropout_key, data_sharding) -> TrainState:
    """The loop of bertjax.training.loop over the training batches; Stopped where SIGTERM or Ctrl-C saved."""
    from bertjax.tasks import batches as task_batches

    config, data = run.config, run.data
    preemption = Preemption()
    steps = loop.LoopSteps(start=int(state.step), total=data.num_steps, log_every=config.logging.log_every,
                           eval_every=config.logging.eval_every or data.steps_per_epoch,
                           save_every=data.steps_per_epoch)
    train_features = data.train.features
    train_keys = TRAIN_KEYS + tuple(k for k in ("label_weight",) if k in train_features)
    if data.packing is None:
        batches = task_batches.train_batches(train_features, config.train.batch_size, config.train.seed,
                                             int(state.step), process_index=jax.process_index(),
                                             process_count=jax.process_count())
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
        raise Stopped(stopped_at, preemption.exit_code)
    return state


def predict_splits(run: Run, state: TrainState, abstract_params) -> list[str]:
    """Every dev and test split predicted by the best checkpoint; the prediction files written."""
    from bertjax.tasks import scoring

    if run.best["step"] != run.data.num_steps:
        best_params, _ = checkpoint.restore_params(files.join(run.workdir, checkpoint.BEST_DIR), abstract_params)
    else:
        best_params = state.params
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
    shown = "; ".join(f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items() if not k.startswith("f1_"))
                      for split, m in best["metrics"].items())
    say(f"{task.name}: best dev {task.main_metric} {best['value']:.4f} at step {best['step']} of {num_steps} "
        f"({shown}); predictions in {files.join(run.workdir, 'predictions')}")
    return summary


def task_setup(config, task, pretrained: Pretrained, num_labels: int, feature_based: dict | None,
               num_steps: int, mesh, rules, init_key) -> Setup:
    """The task's network, optimizer and state layout (shapes first, created sharded), its fresh
    parameters holding the pretrained encoder (and the whole head, continuing this task's fine-tuning)."""
    net = heads.network(task.kind, pretrained.bert_config, num_labels, feature_based=feature_based)
    schedule_config = config_dict.ConfigDict(dict(
        warmup_steps=int(round(config.schedule.warmup_fraction * num_steps)), decay=config.schedule.decay,
        power=config.schedule.power))
    optimizer_config = config.optimizer
    if feature_based:
        optimizer_config = config_dict.ConfigDict(dict(config.optimizer.to_dict(),
                                                       learning_rate=config.feature_based.learning_rate))
    tx, schedule = optim.optimizer_from_config(optimizer_config, schedule_config, num_steps)
    if feature_based:  # the encoder stays as pretrained: only the tagger on its features learns
        tx = optax.chain(tx, optax.masked(optax.set_to_zero(), heads.encoder_mask))
    if config.get("prune") and config.prune.sparsity:  # a magnitude-pruned model (bertjax.prune): zeros stay zero
        tx = optax.chain(tx, pruning.keep_pruned_zeros())
    task_inputs = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    return Setup.create(net, task_inputs, tx, schedule, mesh, rules, init_key,
                        prepare_params=functools.partial(with_pretrained, pretrained=pretrained))


def distillation_step(config, task, num_labels: int, pretrained: Pretrained, setup: Setup, data_sharding):
    """The train step of task distillation: distill.teacher (fine-tuned on this task, of the same
    tokenizer) gives its logits on each batch inside the jitted step (an argument, never trained or saved)."""
    from bertjax.compression import distillation

    settings = config.distill
    distillation.check_task_distillation(task.kind, settings.temperature, settings.alpha)
    teacher = pretrained_models.load(settings.teacher, what="distill.teacher", model_overrides=config.model.to_dict(),
                                     head=task.kind, num_labels=num_labels)
    teacher_task = teacher.task or {}
    if (teacher.meta and (teacher_task.get("kind"), list(teacher_task.get("labels") or [])) != (
            task.kind, list(task.labels))) or any(m.startswith("classifier") for m in teacher.missing):
        raise ValueError(f"distill.teacher={settings.teacher} is not a model fine-tuned on {task.name} ({task.kind}, "
                         f"labels {list(task.labels)}): give the workdir of that fine-tuning")
    if teacher_task.get("feature_based") or teacher.tokenizer is None:
        raise ValueError(f"distill.teacher={settings.teacher}: a fine-tuned encoder with its tokenizer is needed "
                         "(not a feature-based tagger)")
    distillation.check_same_vocabulary(pretrained.files.vocab_path, teacher.tokenizer.vocab_path, "distill.teacher")
    say(f"distilling from {settings.teacher} ({teacher.config.num_layers} layers, hidden {teacher.config.hidden_size}): "
        f"alpha {settings.alpha:g}, temperature {settings.temperature:g}")
    teacher_net = heads.network(task.kind, teacher.config, num_labels)
    example = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    teacher_params = distillation.place_params(teacher_net, example, teacher.params, setup.mesh, setup.rules)
    return task_distillation_step(setup, teacher_net, teacher_params, task.kind, float(settings.temperature),
                                  float(settings.alpha), data_sharding, config.train.grad_accum_steps)


def task_distillation_step(setup: Setup, teacher_net, teacher_params, kind: str, temperature: float, alpha: float,
                           data_sharding, grad_accum_steps: int):
    """task_loss with the teacher's logits mixed into the loss (distillation.task_distillation_loss), jitted
    with the teacher's params as an argument of the step."""
    from bertjax.compression import distillation

    soft = functools.partial(distillation.task_distillation_loss, gold_loss=heads.head(kind).loss, kind=kind,
                             temperature=temperature, alpha=alpha)

    def loss_fn(params, batch, dropout_rng, teacher_params):
        teacher_logits = functools.partial(distillation.teacher_task_logits, teacher_params, net=teacher_net)
        return task_loss(params, batch, dropout_rng, net=setup.net, loss=soft, teacher=teacher_logits)

    return distillation.compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding, grad_accum_steps)


def with_pretrained(params: dict, *, pretrained: Pretrained) -> dict:
    """Fresh (boxed) task params with the pretrained encoder in; the classifier too when init_from was
    a fine-tuning checkpoint of this task."""
    params = heads.with_pretrained_encoder(params, pretrained.params)
    if pretrained.whole_head and set(pretrained.params) == set(params):  # this task's head: classifier too
        is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
        params = {name: tree if name == "bert" else jax.tree_util.tree_map(
            lambda box, value: box.replace_boxed(value) if is_box(box) else value, tree,
            pretrained.params[name], is_leaf=is_box) for name, tree in params.items()}
    return params


def _check_same_task(step: int, meta: dict, *, task) -> None:
    saved = meta.get("task") or {}
    if saved and (saved.get("name"), saved.get("kind"), list(saved.get("labels", []))) != (
            task.name, task.kind, list(task.labels)):
        raise ValueError(f"the workdir's checkpoint at step {step} fine-tunes task {saved.get('name')} "
                         f"({saved.get('kind')}, labels {saved.get('labels')}), not {task.name}: use a new workdir")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
