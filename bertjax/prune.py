"""python -m bertjax.prune: a fine-tuned model made smaller, attention heads by importance and weights by
magnitude, then fine-tuned again to recover.

    python -m bertjax.prune --config=configs/finetune/sst2.py --config.train.init_from=/tmp/ft-sst2 \\
        --config.prune.heads=72 --config.prune.recovery_epochs=1 --workdir=/tmp/ft-sst2-pruned

train.init_from is a model fine-tuned on the config's task (a bertjax fine-tuning workdir, or a Hugging Face
directory of the task's class). The story: the fine-tuned model and the task's data -> head importance
over prune.importance_batches training batches (bertjax.compression.pruning) -> the prune.heads most
important heads kept, the others' parameters removed -> prune.sparsity of the encoder's dense weights set
to zero by magnitude -> the dev metric before and after -> WORKDIR/pruned, the pruned checkpoint ->
with prune.recovery_epochs, bertjax.finetune from it into WORKDIR (the zeros kept zero), else the pruned
checkpoint as WORKDIR's best. WORKDIR then reads as any fine-tuned workdir (bertjax.load, bertjax.evaluate,
bertjax.export); its checkpoints' metadata carry the pruned model config, and pruning.json what was done.
"""

import dataclasses
import functools
import json

import jax
import numpy as np
from absl import app
from ml_collections import config_dict

from bertjax import console, finetune
from bertjax.compression import pruning
from bertjax.models import bert, heads
from bertjax.text import files
from bertjax.training import checkpoint, sharding

PRUNED_DIR = "pruned"  # WORKDIR/pruned: the pruned model before recovery fine-tuning


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    if not args.workdir:
        console.fail("--workdir is required (the pruned model and its metrics go there)")
    try:
        prune(args.config, args.workdir)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        console.fail(str(e))
    except finetune.Stopped as e:  # recovery fine-tuning saved and stopped: re-running resumes it
        raise SystemExit(e.exit_code)


def check_settings(settings) -> None:
    if settings.heads < 0 or settings.importance_batches < 1 or settings.recovery_epochs < 0:
        raise ValueError("prune.heads must be >= 0 (0: keep all), prune.importance_batches >= 1 and "
                         "prune.recovery_epochs >= 0")
    if not settings.heads and not settings.sparsity:
        raise ValueError("nothing to prune: set prune.heads (heads kept) and/or prune.sparsity (a fraction)")


def task_loss(params, batch: dict, *, net, loss) -> float:
    """The head's loss without dropout: what head importance differentiates."""
    logits = net.apply({"params": params}, *(batch[k] for k in finetune.INPUT_KEYS), deterministic=True)
    return loss(logits, batch["label"], batch["example_weight"])[0]


def prune(config, workdir: str) -> dict:
    """The pruning run; returns what pruning.json records."""
    settings = config.prune
    check_settings(settings)
    finetune.check_inputs(config)
    from bertjax.tasks import batches as task_batches
    from bertjax.tasks import kinds
    from bertjax.text import tf_cpu

    tf_cpu.import_tensorflow()  # TensorFlow only tokenizes here
    files.make(workdir)

    # ---------------------------------------------------------------- mesh
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.logical_rules(config.logical_axis_rules)
    data_sharding = sharding.batch_sharding(mesh, rules)

    # ---------------------------------------------------------------- the fine-tuned model and the task's data
    task = finetune.task_from_config(config)
    num_labels = heads.resolve_num_labels(task.kind, kinds.get(task.kind).num_labels(task.labels))
    model = finetune.pretrained_for(config, task, num_labels)
    if not model.whole_head:
        raise ValueError(f"train.init_from={config.train.init_from} is not a model fine-tuned on task {task.name}: "
                         "pruning needs the task's own fine-tuned head (run bertjax.finetune first)")
    data = finetune.task_data(config, task, model.tokenizer, mesh, rules)
    cfg, params = model.bert_config, jax.device_get(model.params)
    net = heads.network(task.kind, cfg, num_labels)
    loss = functools.partial(task_loss, net=net, loss=heads.head(task.kind).loss)

    # ---------------------------------------------------------------- heads by importance
    record = {"heads_before": pruning.total_heads(cfg),
              "params_before": bert.count_params(params["bert"])}
    if settings.heads:
        batches = task_batches.train_batches(data.train.features, config.train.batch_size, config.train.seed)
        chosen = ({k: b[k] for k in finetune.TRAIN_KEYS} for _, b in zip(range(settings.importance_batches), batches))
        importance = pruning.head_importance(loss, params, chosen, cfg)
        keep = pruning.heads_to_keep(importance, cfg, settings.heads)
        cfg, params = pruning.prune_heads(params, cfg, keep)
        record.update(importance=np.round(importance, 4).tolist(), kept_heads=keep)
        finetune.say(f"heads: {record['heads_before']} -> {settings.heads} by importance; per layer {cfg.layer_heads}")

    # ---------------------------------------------------------------- weights by magnitude
    if settings.sparsity:
        params, achieved = pruning.magnitude_prune(params, settings.sparsity)
        record["sparsity"] = achieved
        finetune.say(f"magnitude: {100 * achieved:.2f}% of the encoder layers' dense weights are zero")
    record["params_after"] = bert.count_params(params["bert"])

    # ---------------------------------------------------------------- the dev metric before and after
    evaluate = functools.partial(dev_metrics, task, data, num_labels, config=config, mesh=mesh,
                                 data_sharding=data_sharding)
    record["dev_before"] = evaluate(model.bert_config, model.params)
    record["dev_pruned"] = evaluate(cfg, params)
    finetune.say(f"dev {task.main_metric}: {record['dev_before'][task.main_metric]:.4f} before, "
                 f"{record['dev_pruned'][task.main_metric]:.4f} pruned; params {record['params_before']:,} -> "
                 f"{record['params_after']:,}")

    # ---------------------------------------------------------------- the pruned checkpoint, then recovery
    pruned_model = dataclasses.replace(model, bert_config=cfg, params=params)
    meta = finetune.run_meta(config, workdir, task, pruned_model, None, data.settings)
    meta = dict(meta, step=0, best={"step": 0, "value": float(record["dev_pruned"][task.main_metric]),
                                    "metrics": {"validation": record["dev_pruned"]}})
    checkpoint.save_params(workdir, PRUNED_DIR if settings.recovery_epochs else checkpoint.BEST_DIR, 0, params, meta)
    if settings.recovery_epochs:
        recovered = finetune.finetune(recovery_config(config, files.join(workdir, PRUNED_DIR)), workdir)
        record["dev_recovered"] = recovered["best"]["metrics"][next(iter(data.dev))]
        finetune.say(f"dev {task.main_metric} after recovery: {recovered['best']['value']:.4f}")
    if jax.process_index() == 0:
        files.write_bytes(files.join(workdir, "pruning.json"), json.dumps(record, indent=1).encode())
    return record


def dev_metrics(task, data, num_labels: int, cfg, params, *, config, mesh, data_sharding) -> dict:
    """The first dev split's metrics of a model (the one that chooses fine-tuning's best checkpoint)."""
    net = heads.network(task.kind, cfg, num_labels)
    params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))  # replicated
    p_logits = jax.jit(functools.partial(finetune.task_logits, net=net))
    scorer = finetune.Scorer(task, data.settings, p_logits, data_sharding, config.logging.eval_batch_size)
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


def entry():
    console.run_program(main, finetune.define_flags)


if __name__ == "__main__":
    entry()
