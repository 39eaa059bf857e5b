"""What pretraining puts into the shared core: its batch keys, its loss (masked LM, plus next-sentence or
sentence-order prediction by data.objective; or, with an `electra` section, ELECTRA's generator masked LM
plus its weighted replaced-token detection), its eval step and logged metrics, and its Setup
(BertForPreTraining or ElectraForPreTraining from a configs/<size>.py config). Shared by the pretraining
program, the planner, the benchmark and the tests."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import bert, electra, fp8

from bertjax.models.config import BertConfig
from bertjax.training import optim
from bertjax.training import state

BATCH_KEYS = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
              "masked_lm_weights", "next_sentence_labels")
# Packed rows add these (docs/data.md, "Packing"): which sequence each token is of, its position in it,
# and each sequence's [CLS] position and weight (next_sentence_labels is then [B, K]).
PACKED_KEYS = ("sequence_ids", "position_ids", "sentence_positions", "sentence_weights")
# pretraining_loss returns these as means over the batch: a step of k microbatches reports their mean.
MEAN_METRICS = ("mlm_loss", "nsp_loss")


def mean_metrics(objective: str, electra_run: bool = False) -> tuple:
    """MEAN_METRICS of an objective: its sentence loss is named after it; "none" has none. ELECTRA adds
    the discriminator's loss."""
    sentence = () if objective == "none" else (f"{objective}_loss",)
    return ("mlm_loss",) + sentence + (("disc_loss",) if electra_run else ())


def batch_keys(packing: bool) -> tuple:
    """The keys of a batch the step reads: BATCH_KEYS, and PACKED_KEYS for packed rows (data.packing)."""
    return BATCH_KEYS + (PACKED_KEYS if packing else ())


def forward(net, params, batch, deterministic: bool, rngs=None, heads_only: bool = True, mutable: tuple = ()):
    """BertForPreTraining's (or ElectraForPreTraining's) outputs on a pretraining batch. heads_only
    (training and evaluation): the last block only where the heads read, the same loss for less work;
    False when a loss reads every token's last hidden state (distillation's cosine loss). mutable: the
    collections the model records (distillation's layers); given, (outputs, the collections) as flax returns."""
    record = {"mutable": list(mutable)} if mutable else {}
    # A packed batch (its keys are static under jit) gives the model each row's sequences.
    packed = {key: batch[key] for key in ("sequence_ids", "position_ids", "sentence_positions") if key in batch}
    if isinstance(net, electra.ElectraForPreTraining):
        return net.apply(
            fp8.variables(params), batch["input_ids"], batch["segment_ids"], batch["input_mask"],
            batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"],
            deterministic=deterministic, rngs=rngs, heads_only=heads_only, **packed, **record)
    return net.apply(
        fp8.variables(params), batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        batch["masked_lm_positions"], deterministic=deterministic, rngs=rngs, heads_only=heads_only, **packed,
        **record,
    )


def _loss(out, batch, objective: str, discriminator_weight: float | None = None):
    if discriminator_weight is not None:  # ELECTRA
        return electra.electra_loss(out["mlm_logits"], out["disc_logits"], out["disc_labels"], batch["masked_lm_ids"],
                                    batch["masked_lm_weights"], batch["input_mask"], discriminator_weight)
    return bert.pretraining_loss(bert.mlm_output(out), out.get("nsp_logits"), batch["masked_lm_ids"],
                                 batch["masked_lm_weights"], batch["next_sentence_labels"], objective=objective,
                                 sentence_weights=batch.get("sentence_weights"))


# ELECTRA's held-out batches sample their replacements from this fixed key: the same draws at every eval.
EVAL_SAMPLE_KEY = 0


def loss_fn(params, batch, dropout_rng, *, net, objective: str = "nsp", discriminator_weight: float | None = None):
    # ELECTRA samples its replacements from the step's key (as dropout: a new draw each step and
    # microbatch, the same on every mesh), a stream of its own.
    rngs = {"dropout": dropout_rng, "sample": jax.random.fold_in(dropout_rng, 1)}
    return _loss(forward(net, params, batch, False, rngs), batch, objective, discriminator_weight)


def eval_step(params, batch, *, net, objective: str = "nsp", discriminator_weight: float | None = None):
    rngs = {"sample": jax.random.key(EVAL_SAMPLE_KEY)} if discriminator_weight is not None else None
    loss, sums = _loss(forward(net, params, batch, True, rngs), batch, objective, discriminator_weight)
    return dict(sums, loss_sum=loss, steps=jnp.float32(1))


def summarize(sums: dict) -> dict:
    """Metric sums over some steps -> the logged means and accuracies. The sentence task's metrics are
    named by the sums present: nsp_* (data.objective=nsp), sop_* (sop), none for objective none."""
    steps = max(sums["steps"], 1.0)
    out = {
        "loss": sums["loss_sum"] / steps,
        "mlm_loss": sums["mlm_loss"] / steps,
        "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_count"], 1.0),
    }
    for task in ("nsp", "sop"):
        if f"{task}_loss" in sums:
            out[f"{task}_loss"] = sums[f"{task}_loss"] / steps
            out[f"{task}_accuracy"] = sums[f"{task}_correct"] / max(sums[f"{task}_count"], 1.0)
    if "disc_loss" in sums:  # ELECTRA: mlm_* are the generator's
        out["disc_loss"] = sums["disc_loss"] / steps
        out["disc_accuracy"] = sums["disc_correct"] / max(sums["disc_count"], 1.0)
        out["replaced_share"] = sums["replaced"] / max(sums["disc_count"], 1.0)
    if "grad_norm_sum" in sums:
        out["grad_norm"] = sums["grad_norm_sum"] / steps
    return out


@dataclasses.dataclass
class PretrainingSetup(state.Setup):
    """state.Setup of BertForPreTraining, with its model config and its pair of jitted steps."""

    bert_config: BertConfig | None = None  # the discriminator's, for ELECTRA
    objective: str = "nsp"  # data.objective: which sentence task the loss adds (none: masked LM only)
    generator_config: BertConfig | None = None  # ELECTRA's generator; None: BERT's pretraining
    discriminator_weight: float | None = None  # ELECTRA's weight of the discriminator's loss

    def compile_steps(self, data_sharding, grad_accum_steps: int, batch_warmup=None):
        """(train_step, eval_step), jitted once with explicit shardings; the state is donated. batch_warmup:
        a training.batch_warmup.BatchWarmup, or None."""
        how = dict(net=self.net, objective=self.objective, discriminator_weight=self.discriminator_weight)
        p_train_step = self.compile_train_step(functools.partial(loss_fn, **how), data_sharding, grad_accum_steps,
                                               mean_metrics=mean_metrics(self.objective,
                                                                         self.generator_config is not None),
                                               batch_warmup=batch_warmup)
        p_eval_step = self.compile_eval_step(functools.partial(eval_step, **how), data_sharding)
        return p_train_step, p_eval_step


def constant_guess_accuracy(eval_batches: list) -> float | None:
    """Held-out masked-LM accuracy of the best constant guess, the most frequent masked token of these
    batches: the figure a model's mlm_acc must beat to have learned anything beyond token frequency.
    None when the batches hold no prediction."""
    labels = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in eval_batches])
    return float(np.bincount(labels).max() / labels.size) if labels.size else None


def setup(config, mesh, rules, init_key, platform: str | None = None, prepare_params=None) -> PretrainingSetup:
    """The pretraining Setup of a configs/<size>.py config. platform resolves the model's "auto" fields
    (default: the backend JAX runs on); the planner passes "tpu" to lay out a TPU step from a CPU machine.
    prepare_params: as state.Setup.create's (distillation adds the student's projections)."""
    bert_config = BertConfig.from_dict(config.model, platform=platform)
    if config.get("electra") is not None and bert_config.mlm_loss == "chunked":
        raise ValueError("model.mlm_loss='chunked' does not apply to ELECTRA, whose generator samples from its "
                         "whole logits: set model.mlm_loss=logits")
    tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
    shapes = (1, config.data.max_seq_length, config.data.max_predictions_per_seq)
    if config.get("electra") is None:
        return PretrainingSetup.create(bert.BertForPreTraining(bert_config), bert.dummy_batch(*shapes), tx, schedule,
                                       mesh, rules, init_key, prepare_params, bert_config=bert_config,
                                       objective=config.data.objective)
    generator = electra_generator(config.electra, bert_config)
    return PretrainingSetup.create(electra.ElectraForPreTraining(bert_config, generator), electra.dummy_batch(*shapes),
                                   tx, schedule, mesh, rules, init_key, bert_config=bert_config,
                                   objective=config.data.objective, generator_config=generator,
                                   discriminator_weight=float(config.electra.discriminator_weight))


def electra_generator(section, discriminator: BertConfig) -> BertConfig:
    """The generator's network from a config's electra section."""
    return electra.generator_config(discriminator, section.generator_hidden_size, section.generator_num_layers,
                                    section.generator_num_heads, section.generator_intermediate_size)
