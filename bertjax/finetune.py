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
see bertjax/data/tasks/scoring.py) and summary.json.

The setup, the step (gradient accumulation included), the loop and the preemption handling are
pretraining's (bertjax.training): SIGTERM saves and exits 0, Ctrl-C saves and exits 130, and re-running
the same command resumes.
"""

import contextlib
import dataclasses
import functools
import json
import math
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from ml_collections import config_dict, config_flags

from bertjax import console
from bertjax.interop import pretrained as pretrained_models
from bertjax.models import bert, heads
from bertjax.text import files
from bertjax.training import checkpoint, loop, optim, sharding, writers
from bertjax.training import workdir as workdirs
from bertjax.training.preemption import Preemption
from bertjax.training.state import Setup, TrainState, root_keys

_FLAGS = {}  # defined by entry(): importing this module (evaluate, the tests, a notebook) defines no flags


def _define_flags() -> None:
    _FLAGS["config"] = config_flags.DEFINE_config_file("config", None, "A configs/finetune/<task>.py file.",
                                                       lock_config=True)
    _FLAGS["workdir"] = flags.DEFINE_string("workdir", None,
                                            "Checkpoints, metrics.jsonl, predictions and the summary go here.")

INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")
TRAIN_KEYS = INPUT_KEYS + ("label", "example_weight")


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


def task_loss(params, batch: dict, dropout_rng, *, net, loss):
    """The head's loss on a batch of task examples: (loss, metric sums), as step.train_step takes it."""
    weights = batch["example_weight"]  # [B]
    if "label_weight" in batch:  # tagging: the tokens that carry a tag, [B, S]
        weights = batch["label_weight"] * weights[:, None]
    logits = net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=False,
                       rngs={"dropout": dropout_rng})
    return loss(logits, batch["label"], weights)


def task_logits(params, batch: dict, *, net):
    return net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=True)


def summarize_train(window: dict) -> dict:
    steps = max(float(window["steps"]), 1.0)
    out = {"loss": float(window["loss_sum"]) / steps, "grad_norm": float(window["grad_norm_sum"]) / steps}
    if "correct" in window:
        out["accuracy"] = float(window["correct"]) / max(float(window["count"]), 1.0)
    return out


# ----------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------


def task_from_config(config):
    from bertjax.tasks import registry

    labels = list(config.data.labels) if config.data.labels else None
    return registry.get_task(config.task, labels=labels, num_choices=config.data.num_choices,
                             squad_version=config.data.get("squad_version"))


def squad_settings(config):
    """Span tasks' windowing and decoding settings (configs/finetune/squad.py), None for other kinds."""
    from bertjax.tasks import squad

    if "answers" not in config:
        return None
    return squad.Settings(max_seq_length=config.data.max_seq_length, max_query_length=config.data.max_query_length,
                          doc_stride=config.data.doc_stride, n_best=config.answers.n_best,
                          max_answer_length=config.answers.max_answer_length)


def feature_based_settings(config, task) -> dict | None:
    """config.feature_based (tagging only) as heads.network takes it; None when it is off."""
    settings = config.get("feature_based")
    if not settings or not settings.enabled:
        return None
    if task.kind != "tagging":
        raise ValueError(f"config.feature_based is for tagging tasks; task {task.name} is {task.kind}")
    return {"layers": tuple(int(layer) for layer in settings.layers), "lstm_size": int(settings.lstm_size),
            "lstm_layers": int(settings.lstm_layers)}


def featurize(task, examples: list, tokenizer, config) -> dict:
    """Examples of any kind -> their fixed-shape features (bertjax/data/tasks/*.py)."""
    from bertjax.tasks import features, registry, squad

    if task.kind == registry.SPAN:
        return squad.featurize_squad(examples, tokenizer, squad_settings(config))
    if task.kind == registry.TAGGING:
        from bertjax.tasks import tagging

        return tagging.featurize_tagging(examples, task.labels, tokenizer, config.data.max_seq_length)
    return features.featurize(examples, task, tokenizer, config.data.max_seq_length)


def split_features(task, tokenizer, config) -> tuple:
    """(train Split, {dev split: Split}, {test split: Split}) of the task (bertjax.tasks.scoring.Split:
    examples and features), from the user's files where config.data names them, else from TFDS."""
    from bertjax.tasks import readers, scoring

    data = config.data

    def read(split_name, file, labeled=True):
        examples = readers.read_split(task, split_name, path=file, data_dir=data.tfds_data_dir, labeled=labeled)
        return scoring.Split(examples, featurize(task, examples, tokenizer, config), labeled)

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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    config, workdir = _FLAGS["config"].value, _FLAGS["workdir"].value
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
    from bertjax.text import tf_cpu

    tf_cpu.import_tensorflow()  # TensorFlow only tokenizes here: the accelerators belong to JAX
    from bertjax.tasks import batches as task_batches
    from bertjax.tasks import scoring

    process_index, process_count = jax.process_index(), jax.process_count()

    # ---------------------------------------------------------------- mesh
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.logical_axis_rules)
    batch_size = config.train.batch_size
    grad_accum = config.train.grad_accum_steps
    sharding.check_batch_size(batch_size, grad_accum, mesh, rules)
    data_sharding = sharding.batch_sharding(mesh, rules)

    # ---------------------------------------------------------------- task and pretrained model
    task = task_from_config(config)
    head = heads.head(task.kind)
    num_labels = heads.resolve_num_labels(task.kind, task.num_labels if task.kind in ("classification", "tagging") else None)
    source = init_from(config)
    pretrained = load_pretrained(source, task.kind, num_labels, config.model.to_dict())
    bert_config = pretrained.bert_config
    say(f"task {task.name} ({task.kind}{', labels ' + ', '.join(task.labels) if task.labels else ''}); "
        f"from {source}: {bert_config.num_layers} layers, hidden {bert_config.hidden_size}")
    if pretrained.tokenizer.vocab_size > bert_config.vocab_size:
        raise ValueError(f"the vocabulary of {source} has {pretrained.tokenizer.vocab_size} tokens but "
                         f"its model only {bert_config.vocab_size}: a checkpoint of another vocabulary size")

    # ---------------------------------------------------------------- data
    train_split, dev_splits, test_splits = split_features(task, pretrained.tokenizer, config)
    train_features = train_split.features
    settings = squad_settings(config)
    num_train = task_batches.num_examples(train_features)
    num_steps = task_batches.num_train_steps(num_train, batch_size, config.train.epochs)
    steps_per_epoch = math.ceil(num_train / batch_size)
    dev_sizes = ", ".join(f"{len(s.examples)} {split}" for split, s in dev_splits.items())
    rows = "" if num_train == len(train_split.examples) else f" in {num_train} rows"
    say(f"{len(train_split.examples)} training examples{rows}, {dev_sizes}; {num_steps} steps of {batch_size} "
        f"({config.train.epochs:g} epochs)")

    # ---------------------------------------------------------------- head, optimizer, state: shapes first
    feature_based = feature_based_settings(config, task)
    if feature_based:
        states = bert_config.num_layers + 1  # the embeddings, then each layer
        if any(not -states <= layer < states for layer in feature_based["layers"]):
            raise ValueError(f"config.feature_based.layers={feature_based['layers']}: the model has hidden states "
                             f"0..{states - 1} (0 the embeddings), or -1..-{states} from the last")
    init_key, dropout_key = root_keys(config.train.seed, config.train.dropout_rng)
    setup = task_setup(config, task, pretrained, num_labels, feature_based, num_steps, mesh, rules, init_key)
    net, schedule, abstract_state = setup.net, setup.schedule, setup.abstract_state

    # ---------------------------------------------------------------- restore: this workdir > init_from
    checkpointer = checkpoint.Checkpointer(workdir, every_steps=steps_per_epoch, keep=config.checkpoint.keep,
                                           async_save=config.checkpoint.async_save)
    restored = checkpointer.restore_latest(abstract_state.params, abstract_state.opt_state,
                                           check_meta=functools.partial(_check_same_task, task=task))
    best = {"step": 0, "value": -math.inf, "metrics": {}}
    if restored is not None:
        state = TrainState(jnp.int32(restored.step), restored.params, restored.opt_state)
        best = restored.meta.get("best", best)
        say(f"resumed from step {restored.step}")
    else:
        state = setup.init(init_key)
    start_step = int(state.step)

    # ---------------------------------------------------------------- jitted steps
    p_train_step = setup.compile_train_step(functools.partial(task_loss, net=net, loss=head.loss), data_sharding,
                                            grad_accum)
    p_logits = setup.compile_eval_step(functools.partial(task_logits, net=net), data_sharding)

    def gather(x):
        """The rows of every process, in global order (one process: as it is)."""
        if process_count == 1:
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    def logits_of(params, feats) -> np.ndarray:
        """The logits of every row of a split's features, in order (float32 [N, ...])."""
        outs = []
        for b in task_batches.eval_batches(feats, config.logging.eval_batch_size, process_index=process_index,
                                           process_count=process_count):
            logits = gather(p_logits(params, sharding.global_batch({k: b[k] for k in INPUT_KEYS}, data_sharding)))
            outs.append(np.asarray(logits, np.float32)[gather(b["example_weight"]) > 0])
        return np.concatenate(outs)

    def scored(params, split_name, split, null_threshold=0.0):
        return scoring.score(task, split_name, split, logits_of(params, split.features), squad_settings=settings,
                             null_threshold=null_threshold)

    # ---------------------------------------------------------------- loop
    writer = writers.MetricWriter(workdir, enabled=process_index == 0)
    writer.write_config(config.to_dict())
    if start_step > 0:
        writer.resumed(start_step)
    meta_base = {"model": bert_config.__dict__, "optimizer": config.optimizer.to_dict(),
                 "tokenizer": {"kind": pretrained.files.kind, "lower_case": pretrained.files.lower_case,
                               "path": workdirs.keep_vocabulary(workdir, pretrained.files.vocab_path,
                                                                pretrained.files.kind)
                               if process_index == 0 else files.VOCAB_FILES[pretrained.files.kind]},
                 "task": {"name": task.name, "kind": task.kind, "labels": list(task.labels),
                          "num_choices": task.num_choices, "max_seq_length": config.data.max_seq_length,
                          "squad_version": task.squad_version, "feature_based": feature_based,
                          "squad_settings": dataclasses.asdict(settings) if settings else None}}

    def log(step, window, speed):
        writer.write(step, dict(summarize_train(window), learning_rate=float(schedule(step - 1)), **speed))

    def evaluate(state, step):
        scores = {split: scored(state.params, split, s).metrics for split, s in dev_splits.items()}
        for split, values in scores.items():
            writer.write(step, values, split=split)
        # The main metric of the first dev split chooses the best checkpoint (MNLI: matched).
        first = scores[next(iter(dev_splits))]
        value = first[task.main_metric]
        if value > best["value"]:
            best.update(step=step, value=float(value), metrics=scores)
            # SQuAD v2.0: the no-answer threshold this dev set chose is kept with the model.
            best["null_threshold"] = float(first.get("best_f1_threshold", 0.0))
            meta_task = dict(meta_base["task"], null_threshold=best["null_threshold"])
            checkpoint.save_params(workdir, checkpoint.BEST_DIR, step, state.params,
                                   dict(meta_base, task=meta_task, step=step, best=dict(best)))

    def save(state, step, force):
        checkpointer.save(step, state.params, state.opt_state, dict(meta_base, step=step, best=dict(best)),
                          force=force)

    eval_every = config.logging.eval_every or steps_per_epoch
    after_step = [lambda step, state: checkpointer.check_for_errors()]
    if config.logging.profile_first_step:
        after_step.append(loop.Profiler(files.join(workdir, "profile"), config.logging.profile_first_step,
                                           config.logging.profile_steps))
    preemption = Preemption()
    hooks = loop.Hooks(log=log, evaluate=evaluate, save=save, preemption=preemption, after_step=after_step)
    steps = loop.LoopSteps(start=start_step, total=num_steps, log_every=config.logging.log_every,
                           eval_every=eval_every, save_every=steps_per_epoch)
    batches = task_batches.train_batches(train_features, batch_size, config.train.seed, start_step,
                                         process_index=process_index, process_count=process_count)
    train_keys = TRAIN_KEYS + tuple(k for k in ("label_weight",) if k in train_features)
    device_batches = sharding.prefetch_to_devices(({k: b[k] for k in train_keys} for b in batches), data_sharding,
                                                  size=config.train.prefetch_batches)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), device_batches:
        state, stopped_at = loop.run_loop(state, p_train_step, device_batches, dropout_key, steps, hooks)
    checkpointer.wait()
    checkpointer.close()
    if stopped_at is not None:
        writer.close()
        say(f"{preemption.name}: saved the checkpoint of step {stopped_at}; re-run the same command to resume")
        raise Stopped(stopped_at, preemption.exit_code)

    # ---------------------------------------------------------------- predictions of the best checkpoint
    if best["step"] != num_steps:
        best_params, _ = checkpoint.restore_params(files.join(workdir, checkpoint.BEST_DIR), abstract_state.params)
    else:
        best_params = state.params
    written = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        for split, s in {**dev_splits, **test_splits}.items():
            result = scored(best_params, split, s, null_threshold=best.get("null_threshold", 0.0))
            if process_index == 0:
                written += scoring.write_predictions(files.join(workdir, "predictions"), result)
    summary = {"task": task.name, "main_metric": task.main_metric, "steps": num_steps,
               "learning_rate": config.optimizer.learning_rate, "best": best, "predictions": written}
    writer.close()
    if process_index == 0:
        files.write_bytes(files.join(workdir, "summary.json"), json.dumps(summary, indent=1).encode())
    shown = "; ".join(f"{split} " + ", ".join(f"{k} {v:.4f}" for k, v in m.items() if not k.startswith("f1_"))
                      for split, m in best["metrics"].items())
    say(f"{task.name}: best dev {task.main_metric} {best['value']:.4f} at step {best['step']} of {num_steps} "
        f"({shown}); predictions in {files.join(workdir, 'predictions')}")
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
    task_inputs = heads.dummy_inputs(task.kind, 1, config.data.max_seq_length, task.num_choices or 1)
    return Setup.create(net, task_inputs, tx, schedule, mesh, rules, init_key,
                        prepare_params=functools.partial(with_pretrained, pretrained=pretrained))


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
    _define_flags()
    app.run(main, flags_parser=console.parse_flags)


if __name__ == "__main__":
    entry()
