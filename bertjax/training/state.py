"""A run's state and its layout: TrainState, the run's root keys, and Setup (shapes first with
jax.eval_shape, shardings from the logical axis names, then parameters created already sharded) for
any network, pretraining's or a task head's. Nothing here reads a config."""

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from bertjax.training import sharding
from bertjax.training import step as steps

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
    # model.matmul_dtype=fp8: the scaling state (amax histories, scales; flax's OVERWRITE_WITH_GRADIENT
    # collection), which the step overwrites and never optimizes (step.train_step); None otherwise.
    fp8: Any = None


def under_rules(fn, rules):
    """fn, traced with the logical axis rules in force."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with nn.logical_axis_rules(rules):
            return fn(*args, **kwargs)

    return traced


@dataclasses.dataclass
class Setup:
    """The network, optimizer and state layout of a run. Shared by every program and the tests, so
    that pretraining and fine-tuning create, shard and compile their state the same way."""

    mesh: Any
    rules: tuple
    net: nn.Module
    tx: optax.GradientTransformation
    schedule: Any
    init_state: Callable  # rng -> boxed TrainState
    state_sharding: Any
    abstract_state: Any  # ShapeDtypeStructs carrying the shardings

    @classmethod
    def create(cls, net: nn.Module, example: dict, tx, schedule, mesh, rules, init_key,
               prepare_params: Callable[[dict], dict] | None = None, **fields) -> "Setup":
        """example: keyword inputs of net.init (one small batch). prepare_params(fresh boxed params)
        -> params: what replaces the fresh values (fine-tuning's pretrained encoder); it runs inside
        the traced init, so the state is still created directly in its shards. fields: a subclass's own."""

        def init_state(rng):
            variables = net.init({"params": rng}, **example)
            params = variables["params"]  # boxed with logical axis names
            if prepare_params is not None:
                params = prepare_params(params)
            return TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params),
                              fp8=variables.get(OVERWRITE_WITH_GRADIENT))

        abstract_boxed = jax.eval_shape(init_state, init_key)
        state_sharding = sharding.tree_shardings(abstract_boxed, mesh, rules)
        abstract_state = jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), nn.unbox(abstract_boxed), state_sharding)
        return cls(mesh, rules, net, tx, schedule, init_state, state_sharding, abstract_state, **fields)

    def init(self, rng) -> TrainState:
        """A fresh state, each array created directly in its shards (never whole on one device)."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return jax.jit(lambda r: nn.unbox(self.init_state(r)), out_shardings=self.state_sharding)(rng)

    def init_fp8(self, rng):
        """A fresh fp8 scaling state alone, in its shardings: a run with model.matmul_dtype=fp8 resumed from
        a checkpoint saved without one. XLA drops the parameters' initialisation, whose values it does not return."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return jax.jit(lambda r: nn.unbox(self.init_state(r)).fp8, out_shardings=self.state_sharding.fp8)(rng)

    def compile_train_step(self, loss_fn, data_sharding, grad_accum_steps: int, mean_metrics: tuple = (),
                           loss_and_grad_fn=None, mask_keys: tuple = ("input_mask",), batch_warmup=None):
        """step.train_step over loss_fn(params, batch, dropout_rng) -> (loss, metric sums) (or its
        loss_and_grad_fn), jitted once with explicit shardings; the state is donated.

        The logical axis rules are entered inside the traced function: the model's activation
        constraints then hold wherever the step is traced or lowered (the loop, the planner, the
        benchmark), not only under a caller's `nn.logical_axis_rules`."""
        fn = functools.partial(steps.train_step, loss_fn=loss_fn, tx=self.tx, grad_accum_steps=grad_accum_steps,
                               mean_metrics=mean_metrics, loss_and_grad_fn=loss_and_grad_fn, mask_keys=mask_keys,
                               batch_warmup=batch_warmup)
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return jax.jit(under_rules(fn, self.rules), in_shardings=(self.state_sharding, data_sharding, None),
                           out_shardings=(self.state_sharding, None), donate_argnums=(0,))

    def compile_eval_step(self, fn, data_sharding, params_sharding=None):
        """fn(params, batch) -> anything, jitted once with the params' and the batch's shardings;
        params_sharding: those of the params it is given where they are not the state's (the model alone,
        where the state's params also carry what only training uses)."""
        params_sharding = self.state_sharding.params if params_sharding is None else params_sharding
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return jax.jit(under_rules(fn, self.rules), in_shardings=(params_sharding, data_sharding))
