"""What fine-tuning puts into the shared core (bertjax/training): a task batch's keys, the head's loss and
logits on a batch, the logged training metrics, and the Scorer that runs the jitted logits over a split
and scores it by the task's kind. Shared by fine-tuning, pruning and the compression report."""

import dataclasses
import functools

import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax.models import heads
from bertjax.tasks import batches as task_batches
from bertjax.tasks import registry, scoring
from bertjax.training import sharding

INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")
TRAIN_KEYS = INPUT_KEYS + ("label", "example_weight")
PACKED_INPUT_KEYS = task_batches.PACKED_INPUT_KEYS  # sequence_ids, position_ids, cls_positions


# Distillation's intermediate-layer losses (compression/distillation.py's LayerLosses), returned as means
# where weighed: TinyBERT's embedding, hidden-state and attention MSEs and BERT-PKD's [CLS] loss.
LAYER_LOSS_METRICS = ("embedding_loss", "hidden_loss", "attention_loss", "pkd_loss")


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
    if "pair_slots" in batch:  # rerank's packed pairs: each query's candidates' scores back to [B, C]
        logits = logits.reshape(-1)[batch["pair_slots"]]
    if teacher is not None:
        return loss(logits, batch["label"], weights, teacher(*(batch[k] for k in INPUT_KEYS), **packed))
    return loss(logits, batch["label"], weights)


def head_loss(task, settings):
    """The head's loss (logits, labels, weights) -> (loss, sums) of a task: heads.HEADS[kind].loss, with the
    run's loss and its settings where the kind has several (rerank)."""
    loss = heads.head(task.kind).loss
    if task.kind == registry.RERANK:
        return functools.partial(loss, **settings.loss_settings())
    return loss


def task_logits(params, batch: dict, *, net):
    return net.apply({"params": params}, *(batch[k] for k in INPUT_KEYS), deterministic=True)


def summarize_train(window: dict) -> dict:
    steps = max(float(window["steps"]), 1.0)
    out = {"loss": float(window["loss_sum"]) / steps, "grad_norm": float(window["grad_norm_sum"]) / steps}
    if "correct" in window:
        out["accuracy"] = float(window["correct"]) / max(float(window["count"]), 1.0)
    if "soft_loss_sum" in window:  # task distillation's loss toward the teacher
        out["soft_loss"] = float(window["soft_loss_sum"]) / max(float(window["count"]), 1.0)
    out.update({name: float(window[name]) / steps for name in LAYER_LOSS_METRICS if name in window})
    if "replace_rate_sum" in window:  # module replacing: the mean rate p and modules replaced per step
        out["replace_rate"] = float(window["replace_rate_sum"]) / steps
        out["replaced_modules"] = float(window["replaced_sum"]) / steps
    return out


def gather_rows(x) -> np.ndarray:
    """The rows of every process, in global order (one process: as it is)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


@dataclasses.dataclass
class Scorer:
    """A split's logits from the jitted eval step, scored by the task's kind."""

    task: object
    settings: object  # the kind's own
    p_logits: object  # jitted (params, batch) -> logits
    data_sharding: object
    batch_size: int
    input_keys: tuple = INPUT_KEYS  # the keys p_logits reads, where a split has them (contrastive: a pair's texts)

    def logits_of(self, params, feats) -> np.ndarray:
        """The logits of every row of a split's features, in order (float32 [N, ...])."""
        outs = []
        for b in task_batches.eval_batches(feats, self.batch_size, process_index=jax.process_index(),
                                           process_count=jax.process_count()):
            batch = sharding.global_batch({k: b[k] for k in self.input_keys if k in b}, self.data_sharding)
            logits = gather_rows(self.p_logits(params, batch))
            outs.append(np.asarray(logits, np.float32)[gather_rows(b["example_weight"]) > 0])
        return np.concatenate(outs)

    def __call__(self, params, split_name: str, split, null_threshold: float = 0.0):
        return scoring.score(self.task, split_name, split, self.logits_of(params, split.features),
                             settings=self.settings, null_threshold=null_threshold)
