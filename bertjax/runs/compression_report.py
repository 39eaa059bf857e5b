"""The compression report: a fine-tuned teacher and its compressed variants (distilled, pruned, int8, int4) on
one task's dev set, one table: parameters and size against the teacher's, dev score and the share of
the teacher's retained, latency at batch 1 and batch 32 and the speed-up, measured on this machine.

Every model is read by bertjax.load (a fine-tuning workdir, a params export, a Hugging Face directory, a BiLSTM
student of task distillation; `quantize` quantises it on load); every one is fed the same dev examples at the same
sequence length S, each through its own tokenizer. Size is the bytes of the weights as loaded: what a params export of
the model writes (int8 kernels with their scales, float32 for the rest), less the file's headers; the
dense kernels' size is that of the dense layers' kernels alone (values and scales), what low-bit
weights shrink (the embedding tables stay int8 at most).
Latency is the median of `repeats` timed calls of the task head on a batch of dev rows after `warmup`
untimed ones (the compile among them), host to host (LoadedBert.task_logits); the models are held
together and take turns, so that the machine's changing load falls on each alike.
"""

import dataclasses
import time

import numpy as np

from bertjax import inference
from bertjax.compression import quantize
from bertjax.tasks import kinds, registry, scoring, squad


@dataclasses.dataclass(frozen=True)
class Model:
    """One row of the report: its name, the directory bertjax.load reads, and the mode to quantise it
    with on load (int8, int4-g128, ...; None: as stored)."""

    name: str
    path: str
    quantize: str | None = None


@dataclasses.dataclass
class Row:
    name: str
    parameters: int
    size_bytes: int
    kernel_bytes: int  # the dense layers' kernels alone
    score: float  # the task's main dev metric
    latency_ms: dict  # batch size -> median milliseconds


def task_of(model) -> tuple:
    """(registry.Task, settings, null_threshold) of a fine-tuned model, from its checkpoint's task record."""
    record = model.task
    if record is None:
        raise ValueError(f"{model.source}: not a fine-tuned model (no task head): the report compares fine-tuned "
                         "models on their task's dev set")
    if record.name in registry.TASKS:
        task = registry.get_task(record.name)
    else:
        task = registry.get_task(record.name, labels=record.labels or None,
                                 num_choices=record.num_choices, squad_version=record.squad_version)
    settings = squad.Settings(**record.squad_settings) if record.squad_settings else None
    return task, settings, float(record.null_threshold or 0.0)


def read_dev(task, dev_path: str | None = None, data_dir: str | None = None) -> tuple[str, list]:
    """(split name, labeled examples) of the task's dev set: the file dev_path (the kind's own format:
    JSON lines for classification), else the task's first TFDS dev split."""
    if dev_path is None and not task.eval_splits:
        raise ValueError(f"task {task.name} has no dev split of its own: give the dev file (JSON lines) as --task")
    split = "validation" if dev_path else task.eval_splits[0]
    examples = kinds.get(task.kind).read(task, split, path=dev_path, data_dir=data_dir, labeled=True)
    if not examples:
        raise ValueError(f"the dev set of task {task.name} ({dev_path or split}) is empty")
    return split, examples


def timed_batch(features: dict, batch_size: int) -> dict:
    """batch_size dev rows (repeated to fill the batch) of the model inputs."""
    rows = np.resize(np.arange(len(features["input_ids"])), batch_size)
    return {k: np.asarray(features[k])[rows] for k in ("input_ids", "segment_ids", "input_mask")}


def latencies_ms(models: list, batches: list[dict], *, repeats: int = 10, warmup: int = 2) -> list[float]:
    """Median milliseconds of each model's task_logits on its batch. The models take turns, one call
    each per round, so that a change in the machine's load falls on all of them alike."""
    for model, batch in zip(models, batches):
        for _ in range(warmup):  # the compile among them
            model.task_logits(batch, batch_size=len(batch["input_ids"]))
    times = [[] for _ in models]
    for _ in range(repeats):
        for model, batch, mine in zip(models, batches, times):
            start = time.perf_counter()
            model.task_logits(batch, batch_size=len(batch["input_ids"]))
            mine.append(time.perf_counter() - start)
    return [1e3 * float(np.median(t)) for t in times]


def dev_score(model, task, split: str, examples: list, features: dict, *, settings=None,
              null_threshold: float = 0.0) -> float:
    """The task's main dev metric of the model on these features."""
    logits = model.task_logits(features, batch_size=32)
    scored = kinds.get(task.kind).score(task, split, scoring.Split(examples, features, True), logits,
                                        settings=settings, null_threshold=null_threshold)
    return float(scored.metrics[task.main_metric])


def compression_report(teacher: Model, variants: list[Model], *, dev_path: str | None = None,
                       data_dir: str | None = None, max_seq_length: int | None = None, batch_sizes=(1, 32),
                       repeats: int = 10, warmup: int = 2) -> dict:
    """Loads the teacher and each variant, scores each on the dev set, then times them taking turns;
    returns {"task", "metric", "split", "max_seq_length", "examples", "rows" [Row], "table" [markdown]}."""
    if not variants:
        raise ValueError("the report needs at least one variant to compare with the teacher")
    names = [teacher.name] + [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must differ: {names}")
    models = [inference.load(spec.path, quantize=spec.quantize) for spec in [teacher, *variants]]
    task, settings, null_threshold = task_of(models[0])
    for spec, model in zip(variants, models[1:]):
        theirs = task_of(model)[0]
        if (theirs.kind, theirs.labels) != (task.kind, task.labels):
            raise ValueError(f"{spec.name} ({spec.path}) is fine-tuned for {theirs.name} {list(theirs.labels)}, the "
                             f"teacher for {task.name} {list(task.labels)}: compare models of one task")
    length = int(max_seq_length or models[0].task.max_seq_length)
    split, examples = read_dev(task, dev_path, data_dir)
    featurize = kinds.get(task.kind).featurize
    features = [featurize(task, examples, model.tokenizer, length, settings) for model in models]
    scores = [dev_score(model, task, split, examples, f, settings=settings, null_threshold=null_threshold)
              for model, f in zip(models, features)]
    latency = {b: latencies_ms(models, [timed_batch(f, b) for f in features], repeats=repeats, warmup=warmup)
               for b in batch_sizes}
    rows = [Row(name, quantize.parameter_count(model.params), quantize.weight_bytes(model.params),
                quantize.weight_bytes(model.params, kernels_only=True), score, {b: latency[b][i] for b in batch_sizes})
            for i, (name, model, score) in enumerate(zip(names, models, scores))]
    return {"task": task.name, "metric": task.main_metric, "split": split, "max_seq_length": length,
            "examples": len(examples), "rows": rows, "table": table(rows, task.main_metric)}


def table(rows: list[Row], metric: str) -> list[str]:
    """Markdown lines: one row per model, the first the teacher every ratio is taken against."""
    teacher = rows[0]
    sizes = sorted(teacher.latency_ms)
    headings = ["model", "parameters", "size MB", "size ratio", "kernels MB", "kernel ratio", f"dev {metric}",
                "retained"]
    for b in sizes:
        headings += [f"batch {b} ms", f"speed-up {b}"]
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    for row in rows:
        cells = [row.name, f"{row.parameters:,}", f"{row.size_bytes / 1e6:.2f}",
                 f"{teacher.size_bytes / row.size_bytes:.2f}x", f"{row.kernel_bytes / 1e6:.2f}",
                 f"{teacher.kernel_bytes / row.kernel_bytes:.2f}x", f"{100 * row.score:.2f}",
                 f"{100 * row.score / teacher.score:.1f}%" if teacher.score else "-"]
        for b in sizes:
            cells += [f"{row.latency_ms[b]:.2f}", f"{teacher.latency_ms[b] / row.latency_ms[b]:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
