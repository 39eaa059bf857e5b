"""The training library: TrainState, the pure step functions, and the state's layout (Setup).

Shared by the pretraining program (bertjax.train), the benchmark and the tests. Nothing here reads
flags; everything takes the config or explicit arguments. No TensorFlow.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bertjax import model, optim, sharding

BATCH_KEYS = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
              "masked_lm_weights", "next_sentence_labels")


DROPOUT_RNGS = ("threefry", "rbg")


def root_keys(seed: int, dropout_rng: str = "threefry"):
    """(init_key, dropout_key) of a run. dropout_rng "threefry" draws the same dropout masks on any mesh;
    "rbg" asks the hardware generator for the bits (cheaper on accelerators; the masks then depend on
    the device layout)."""
    if dropout_rng not in DROPOUT_RNGS:
        raise ValueError(f"train.dropout_rng={dropout_rng!r}: choose one of {DROPOUT_RNGS}")
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    if dropout_rng == "rbg":
        dropout_key = jax.random.fold_in(jax.random.key(seed, impl="rbg"), 1)
    return init_key, dropout_key


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # completed steps
    params: Any
    opt_state: Any


# ----------------------------------------------------------------------------------------------------
# Pure step functions (jitted once, with explicit shardings, by Setup.compile_steps)
# ----------------------------------------------------------------------------------------------------


def loss_fn(params, batch, dropout_rng, *, net):
    out = net.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        batch["masked_lm_positions"], deterministic=False, rngs={"dropout": dropout_rng},
        heads_only=True,  # the last block only where the heads read: same loss, less work
    )
    loss, sums = model.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                        batch["masked_lm_weights"], batch["next_sentence_labels"])
    sums["real_tokens"] = jnp.sum(batch["input_mask"]).astype(jnp.float32)
    return loss, sums


def train_step(state: TrainState, batch: dict, dropout_key, *, net, tx, grad_accum_steps: int):
    """One optimizer step over the global batch (in grad_accum_steps microbatches). Returns the new
    state and the step's metric sums (added up over a logging interval on the device)."""
    rng = jax.random.fold_in(dropout_key, state.step)  # a new dropout mask each step, reproducibly
    grad_fn = jax.value_and_grad(functools.partial(loss_fn, net=net), has_aux=True)
    (loss, sums), grads = optim.accumulate_gradients(grad_fn, state.params, batch, grad_accum_steps, rng)
    # The per-microbatch means come back added up over the microbatches.
    sums = dict(sums, mlm_loss=sums["mlm_loss"] / grad_accum_steps, nsp_loss=sums["nsp_loss"] / grad_accum_steps)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums = dict(sums, loss_sum=loss, grad_norm_sum=grad_norm, steps=jnp.float32(1),
                # Counts the steps whose loss or gradient was not finite: the host stops the run.
                nonfinite=jnp.float32(~(jnp.isfinite(loss) & jnp.isfinite(grad_norm))))
    return TrainState(state.step + 1, params, opt_state), sums


def eval_step(params, batch, *, net):
    out = net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                    batch["masked_lm_positions"], deterministic=True, heads_only=True)
    loss, sums = model.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                        batch["masked_lm_weights"], batch["next_sentence_labels"])
    return dict(sums, loss_sum=loss, steps=jnp.float32(1))


def summarize(sums: dict) -> dict:
    """Metric sums over some steps -> the logged means and accuracies."""
    steps = max(sums["steps"], 1.0)
    out = {
        "loss": sums["loss_sum"] / steps,
        "mlm_loss": sums["mlm_loss"] / steps,
        "nsp_loss": sums["nsp_loss"] / steps,
        "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_count"], 1.0),
        "nsp_accuracy": sums["nsp_correct"] / max(sums["nsp_count"], 1.0),
    }
    if "grad_norm_sum" in sums:
        out["grad_norm"] = sums["grad_norm_sum"] / steps
    return out


@dataclasses.dataclass
class Setup:
    """The model, optimizer and state layout of a run: shapes first (jax.eval_shape), shardings from
    the logical axis names, then parameters created already sharded. Shared by main and the tests."""

    config: Any
    mesh: Any
    rules: tuple
    bert_config: model.BertConfig
    net: model.BertForPreTraining
    tx: optax.GradientTransformation
    schedule: Any
    init_state: Any  # rng -> boxed TrainState
    state_sharding: Any
    abstract_state: Any  # ShapeDtypeStructs carrying the shardings

    @classmethod
    def create(cls, config, mesh, rules, init_key, platform: str | None = None) -> "Setup":
        """platform resolves the model's "auto" fields (default: the backend JAX runs on); the planner
        passes "tpu" to lay out a TPU step from a CPU machine."""
        bert_config = model.BertConfig.from_dict(config.model, platform=platform)
        net = model.BertForPreTraining(bert_config)
        tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
        example = model.dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)

        def init_state(rng):
            params = net.init({"params": rng}, **example)["params"]  # boxed with logical axis names
            return TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))

        abstract_boxed = jax.eval_shape(init_state, init_key)
        state_sharding = sharding.tree_shardings(abstract_boxed, mesh, rules)
        abstract_state = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(abstract_boxed), state_sharding)
        return cls(config, mesh, rules, bert_config, net, tx, schedule, init_state, state_sharding, abstract_state)

    def init(self, rng) -> TrainState:
        """A fresh state, each array created directly in its shards (never whole on one device)."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return jax.jit(lambda r: nn.unbox(self.init_state(r)), out_shardings=self.state_sharding)(rng)

    def compile_steps(self, data_sharding, grad_accum_steps: int):
        """train_step and eval_step, jitted once with explicit shardings; the state is donated.

        The logical axis rules are entered inside the traced functions: the model's activation
        constraints then hold wherever the step is traced or lowered (the loop, the planner, the
        benchmark), not only under a caller's `nn.logical_axis_rules`."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            p_train_step = jax.jit(
                _under_rules(functools.partial(train_step, net=self.net, tx=self.tx,
                                               grad_accum_steps=grad_accum_steps), self.rules),
                in_shardings=(self.state_sharding, data_sharding, None),
                out_shardings=(self.state_sharding, None),
                donate_argnums=(0,),
            )
            p_eval_step = jax.jit(_under_rules(functools.partial(eval_step, net=self.net), self.rules),
                                  in_shardings=(self.state_sharding.params, data_sharding))
        return p_train_step, p_eval_step


def _under_rules(fn, rules):
    """fn, traced with the logical axis rules in force."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with nn.logical_axis_rules(rules):
            return fn(*args, **kwargs)

    return traced
