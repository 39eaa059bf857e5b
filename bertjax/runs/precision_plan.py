"""A precision per encoder layer within a size budget (Q-BERT's mixed precision, Shen et al. 2020, with a
measured sensitivity on the dev set standing in for its Hessian's top eigenvalue), what
`python -m bertjax.export --quantize=mixed --size_budget=B --dev=FILE` writes.

    plan(float_model, low, high, task, ...)   # each layer at `low` alone (the rest at `high`): the dev
                                              # score's drop -> the most sensitive layers get `high` while
                                              # the dense kernels stay within B x their float32 bytes

Sensitivity is the drop of the task's main dev metric, ties (a small dev set moves few predictions)
broken by how far the layer's low precision moves the logits (their mean squared change). Each variant
runs as the float network on its dequantised weights (quantize.dequantized: what the weight-only
network computes, to float32 rounding), so one compiled function scores them all. The
embeddings, pooler and heads keep `high` (quantize.mix). The result is a fine-tuned model whose params
hold each kernel as int8 or packed int4 (quantize="mixed"); its record says each layer's mode and
measured sensitivity.
"""

import copy
import dataclasses

import numpy as np

from bertjax import inference
from bertjax.compression import quantize
from bertjax.runs import compression_report
from bertjax.tasks import kinds, scoring

LOW, HIGH = "int4-g128", "int8-g128"
BATCH = 32


def plan(float_model, low, high, size_budget: float, task, split: str, examples: list, features: dict):
    """(the mixed LoadedBert, its record {"size_budget", "kernel_ratio", "layers": {name: {"mode",
    "score_drop", "logit_change"}}}). float_model, low, high: one fine-tuned model loaded as float and
    quantised two ways; features: the dev examples' features. One line for a budget below every layer
    at `low`."""
    if not 0 < size_budget <= 1:
        raise ValueError(f"--size_budget={size_budget}: the dense kernels' bytes as a share of their float32 bytes, "
                         "in (0, 1] (int4-g128 everywhere is about 0.13, int8 about 0.25)")
    floats = quantize.weight_bytes(float_model.params, kernels_only=True)
    budget = size_budget * floats
    chosen = set()
    least = quantize.weight_bytes(quantize.mix(low.params, high.params, chosen), kernels_only=True)
    if least > budget:
        raise ValueError(f"--size_budget={size_budget}: the dense kernels take at least {least / floats:.3f} of their "
                         f"float32 bytes (every layer {low.quantize}): give at least that")
    # The float network of the quantised models' (unrolled) layout, compiled once for every variant: the
    # rows padded to whole batches, so that it compiles one shape.
    probe = dataclasses.replace(high, params=quantize.dequantized(high.params), quantize=None)
    rows = len(features["input_ids"])
    padded = compression_report.timed_batch(features, -(-rows // BATCH) * BATCH)

    def scored(params):
        model = copy.copy(probe)
        model.params = quantize.dequantized(params)
        logits = model.task_logits(padded, batch_size=BATCH)[:rows]
        result = kinds.get(task.kind).score(task, split, scoring.Split(examples, features, True), logits)
        return float(result.metrics[task.main_metric]), logits

    layers = sorted((name for name in high.params["bert"]["encoder"] if name.startswith("layers_")),
                    key=lambda name: int(name.split("_")[1]))
    base, base_logits = scored(high.params)
    sensitivity = {}
    for name in layers:
        score, logits = scored(quantize.mix(low.params, high.params, set(layers) - {name}))
        sensitivity[name] = (base - score, float(np.mean((logits - base_logits) ** 2)))
    for name in sorted(layers, key=lambda n: sensitivity[n], reverse=True):
        if quantize.weight_bytes(quantize.mix(low.params, high.params, chosen | {name}), kernels_only=True) > budget:
            break
        chosen.add(name)
    params = quantize.mix(low.params, high.params, chosen)
    record = {"size_budget": size_budget, "kernel_ratio": quantize.weight_bytes(params, kernels_only=True) / floats,
              "layers": {name: {"mode": high.quantize if name in chosen else low.quantize,
                                "score_drop": sensitivity[name][0], "logit_change": sensitivity[name][1]}
                         for name in layers}}
    return dataclasses.replace(high, params=params, quantize=quantize.MIXED), record


def plan_from_path(path: str, dev_path: str, size_budget: float, *, low: str = LOW, high: str = HIGH,
                   data_dir: str | None = None):
    """plan() of a fine-tuned model's directory and its task's dev set (a file of the task's format, or
    None: its TFDS dev split)."""
    float_model = inference.load(path)
    task, settings, _ = compression_report.task_of(float_model)
    split, examples = compression_report.read_dev(task, dev_path, data_dir)
    features = kinds.get(task.kind).featurize(task, examples, float_model.tokenizer,
                                              int(float_model.task.max_seq_length), settings)
    return plan(float_model, inference.load(path, quantize=low), inference.load(path, quantize=high), size_budget,
                task, split, examples, features)
