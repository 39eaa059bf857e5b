"""A pruning run: a fine-tuned model made smaller, attention heads by importance and weights by magnitude,
then fine-tuned again to recover; the story `python -m bertjax.prune` tells.

    prune(config, workdir)   # the fine-tuned model and the task's data -> head importance over
                             # prune.importance_batches training batches -> the prune.heads most important
                             # heads kept, the others removed -> prune.sparsity of the encoder's dense weights
                             # zeroed by magnitude -> the dev metric before and after -> WORKDIR/pruned ->
                             # with prune.recovery_epochs, fine-tuning from it in WORKDIR (zeros kept zero),
                             # else the pruned checkpoint as WORKDIR's best

WORKDIR then reads as any fine-tuned workdir (bertjax.load, evaluate, export); its checkpoints' metadata
carry the pruned model config, and pruning.json what was done.
"""

import dataclasses
import functools
import json

import jax
import numpy as np
from ml_collections import config_dict

from bertjax.compression import pruning
from bertjax.models import bert, heads
from bertjax.runs import config_checks, finetuning, start
from bertjax.runs.console import say
from bertjax.runs.task_data import TaskStart, task_data, task_from_config
from bertjax.tasks import batches as task_batches
from bertjax.tasks import kinds
from bertjax.tasks.steps import INPUT_KEYS, TRAIN_KEYS, Scorer, task_logits
from bertjax.text import files
from bertjax.training import checkpoint

PRUNED_DIR = "pruned"  # WORKDIR/pruned: the pruned model before recovery fine-tuning


def check_settings(settings) -> None:
    if settings.heads < 0 or settings.importance_batches < 1 or settings.recovery_epochs < 0:
        raise ValueError("prune.heads must be >= 0 (0: keep all), prune.importance_batches >= 1 and "
                         "prune.recovery_epochs >= 0")
    if not settings.heads and not settings.sparsity:
        raise ValueError("nothing to prune: set prune.heads (heads kept) and/or prune.sparsity (a fraction)")


def importance_loss(params, batch: dict, *, net, loss) -> float:
    """The head's loss without dropout: what head importance differentiates."""
    logits = net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=True)
    return loss(logits, batch["label"], batch["example_weight"])[0]


def prune(config, workdir: str, distributed: start.Distributed | None = None) -> dict:
    """The pruning run; returns what pruning.json records."""
    settings = config.prune
    check_settings(settings)
    config, _ = config_checks.check_finetuning(config)
    with start.session(workdir, distributed):
        # ---------------------------------------------------------------- mesh
        layout = start.make_layout(config.mesh, config.logical_axis_rules)

        # ---------------------------------------------------------------- the fine-tuned model and the task's data
        task = task_from_config(config)
        num_labels = heads.resolve_num_labels(task.kind, kinds.get(task.kind).num_labels(task.labels))
        model = finetuning.starting_model(config, task, num_labels)
        if not model.whole_head:
            raise ValueError(f"train.init_from={config.train.init_from} is not a model fine-tuned on task "
                             f"{task.name}: pruning needs the task's own fine-tuned head (run bertjax.finetune first)")
        data = task_data(config, task, model.tokenizer, model.bert_config, layout)

        # ---------------------------------------------------------------- heads by importance, weights by magnitude
        cfg, params, record = prune_model(config, task, num_labels, model, data)

        # ---------------------------------------------------------------- the dev metric before and after
        evaluate = functools.partial(dev_metrics, task, data, num_labels, config=config, layout=layout)
        record["dev_before"] = evaluate(model.bert_config, model.params)
        record["dev_pruned"] = evaluate(cfg, params)
        say(f"dev {task.main_metric}: {record['dev_before'][task.main_metric]:.4f} before, "
            f"{record['dev_pruned'][task.main_metric]:.4f} pruned; params {record['params_before']:,} -> "
            f"{record['params_after']:,}")

        # ---------------------------------------------------------------- the pruned checkpoint, then recovery
        pruned_model = dataclasses.replace(model, bert_config=cfg, params=params)
        best = {"step": 0, "value": float(record["dev_pruned"][task.main_metric]),
                "metrics": {"validation": record["dev_pruned"]}}
        meta = finetuning.run_meta(config, workdir, task, pruned_model, None, data.settings).replace(best=best)
        checkpoint.save_params(workdir, PRUNED_DIR if settings.recovery_epochs else checkpoint.BEST_DIR, 0, params,
                               meta)
        if settings.recovery_epochs:
            recovered = finetuning.finetune_in_session(recovery_config(config, files.join(workdir, PRUNED_DIR)),
                                                       workdir)
            record["dev_recovered"] = recovered["best"]["metrics"][next(iter(data.dev))]
            say(f"dev {task.main_metric} after recovery: {recovered['best']['value']:.4f}")
        if jax.process_index() == 0:
            files.write_bytes(files.join(workdir, "pruning.json"), json.dumps(record, indent=1).encode())
        return record


def prune_model(config, task, num_labels: int, model: TaskStart, data) -> tuple:
    """(pruned config, pruned params, the record so far): prune.heads kept by importance over
    prune.importance_batches training batches, then prune.sparsity of the dense weights zeroed."""
    settings = config.prune
    cfg, params = model.bert_config, jax.device_get(model.params)
    record = {"heads_before": pruning.total_heads(cfg), "params_before": bert.count_params(params["bert"])}
    if settings.heads:
        net = heads.network(task.kind, cfg, num_labels)
        loss = functools.partial(importance_loss, net=net, loss=heads.head(task.kind).loss)
        batches = task_batches.train_batches(data.train.features, config.train.batch_size, config.train.seed)
        chosen = ({k: b[k] for k in TRAIN_KEYS} for _, b in zip(range(settings.importance_batches), batches))
        importance = pruning.head_importance(loss, params, chosen, cfg)
        keep = pruning.heads_to_keep(importance, cfg, settings.heads)
        cfg, params = pruning.prune_heads(params, cfg, keep)
        record.update(importance=np.round(importance, 4).tolist(), kept_heads=keep)
        say(f"heads: {record['heads_before']} -> {settings.heads} by importance; per layer {cfg.layer_heads}")
    if settings.sparsity:
        params, achieved = pruning.magnitude_prune(params, settings.sparsity)
        record["sparsity"] = achieved
        say(f"magnitude: {100 * achieved:.2f}% of the encoder layers' dense weights are zero")
    record["params_after"] = bert.count_params(params["bert"])
    return cfg, params, record


def dev_metrics(task, data, num_labels: int, cfg, params, *, config, layout: start.Layout) -> dict:
    """The first dev split's metrics of a model (the one that chooses fine-tuning's best checkpoint)."""
    net = heads.network(task.kind, cfg, num_labels)
    replicated = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec())
    params = jax.device_put(params, replicated)
    p_logits = jax.jit(functools.partial(task_logits, net=net))
    scorer = Scorer(task, data.settings, p_logits, layout.data_sharding, config.logging.eval_batch_size)
    split = next(iter(data.dev))
    return {k: float(v) for k, v in scorer(params, split, data.dev[split]).metrics.items()}


def recovery_config(config, pruned_path: str):
    """The fine-tuning config of the recovery run: from the pruned checkpoint, for prune.recovery_epochs;
    prune.sparsity stays set, so that fine-tuning keeps the pruned weights zero."""
    out = config_dict.ConfigDict(config.to_dict())
    out.train.init_from = pruned_path
    out.train.epochs = float(config.prune.recovery_epochs)
    out.init_from = None
    out.sweep = False
    return out
