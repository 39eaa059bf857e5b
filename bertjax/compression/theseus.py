"""BERT-of-Theseus (Xu et al. 2020, arXiv 2002.02925): compression by progressive module replacing.

A predecessor fine-tuned on the task, of N layers, is cut into M modules of N/M consecutive layers; each
module has a successor of one layer, started (as the authors' code does) from the predecessor's first M
layers: successor layer g = predecessor layer g. At every training step each module is replaced by its
successor with probability p, one Bernoulli draw per module per step for the whole batch, so the
successor layers learn to work among the predecessor's. p is constant or rises linearly with the step
(the paper's curriculum: p_t = min(1, b + k t)).

What trains: the successor layers alone. The embeddings, the pooler and the task's output layer are the
predecessor's, shared and frozen, as in the authors' code (its optimizer holds only `scc_layer`); the
predecessor's layers are an argument of the step, never trained nor saved. Dropout is on in every layer
that runs (the mixed model is in training mode, as there). Evaluation and the saved model are the
successor alone: embeddings + M layers + pooler + head, which `python -m bertjax.finetune
--config.train.init_from=WORKDIR` then fine-tunes on its own (the paper's successor fine-tuning; that run
trains every parameter, where the authors' p = 1 phase kept training the layers only).

The run is fine-tuning's (bertjax/runs/finetuning.py, its start and step from
bertjax/runs/finetuning_compression.py); here: the settings' checks, the replacement rate and draws, the
successor made from the predecessor, the mixed forward, the loss and the jitted step.

Shape legend (as in bertjax/models/bert.py): B batch, S sequence, H hidden, N predecessor layers,
M successor layers (modules), Q rows kept ([CLS] and any asked for).
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax.compression import distillation
from bertjax.models import bert, heads, layers
from bertjax.models.config import BertConfig
from bertjax.tasks.steps import task_loss
from bertjax.training import step as steps
from bertjax.training.state import under_rules

# The replacement draws' own stream, apart from dropout's: fold_in(key(seed), REPLACE_STREAM), then the step.
REPLACE_STREAM = 0x7E5E
# Task kinds whose step is task_loss over a head on BertModel (contrastive trains embeddings its own way).
TASK_KINDS = ("classification", "regression", "multiple_choice", "span", "tagging")


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplaceRate:
    """p_t = min(1, start + slope * t) at step t (the steps done before it): constant where slope is 0."""

    start: float
    slope: float = 0.0

    def __call__(self, step):
        return jnp.minimum(1.0, self.start + self.slope * jnp.asarray(step, jnp.float32))


def replace_rate(rate: float, start: float | None, slope: float | None) -> ReplaceRate:
    """theseus.replace_rate (constant p), or replace_rate_start and replace_rate_slope (the linear
    curriculum), checked in one line each."""
    if slope is None and start is None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"theseus.replace_rate={rate} must lie in [0, 1] (the paper's constant rate: 0.5)")
        return ReplaceRate(float(rate))
    if slope is None or start is None:
        raise ValueError("the linear replacement curriculum needs both theseus.replace_rate_start (b) and "
                         "theseus.replace_rate_slope (k per step); unset both for the constant theseus.replace_rate")
    if not 0.0 <= start <= 1.0:
        raise ValueError(f"theseus.replace_rate_start={start} must lie in [0, 1]")
    if not slope >= 0.0:
        raise ValueError(f"theseus.replace_rate_slope={slope} must be >= 0 (p rises to 1 over the steps)")
    return ReplaceRate(float(start), float(slope))


def check_predecessor(predecessor: BertConfig, successor_layers: int, what: str) -> None:
    """The predecessor's layers cut into successor_layers modules of equal size, or one line why not."""
    if predecessor.num_groups != predecessor.num_layers:
        raise ValueError(f"{what} shares one set of parameters across its layers (ALBERT): there are no modules to "
                         "replace; compress a model whose layers are its own")
    m, n = successor_layers, predecessor.num_layers
    if not isinstance(m, int) or not 1 <= m < n:
        raise ValueError(f"theseus.successor_layers={m!r} must be a whole number in [1, {n - 1}] (fewer than the "
                         f"predecessor's {n} layers)")
    if n % m:
        raise ValueError(f"theseus.successor_layers={m} does not divide the predecessor's {n} layers into equal "
                         f"modules: choose a divisor of {n} (the paper: 12 -> 6)")


def successor_config(predecessor: BertConfig, successor_layers: int) -> BertConfig:
    """The predecessor's architecture with M layers (their head counts: those of its first M)."""
    kept = tuple(predecessor.layer_heads[:successor_layers]) if predecessor.layer_heads else ()
    return dataclasses.replace(predecessor, num_layers=successor_layers, layer_heads=kept)


def successor_params(predecessor_params: dict, predecessor: BertConfig, successor: BertConfig) -> dict:
    """The successor's task params: the predecessor's embeddings, pooler and head, and successor layer g =
    predecessor layer g (the authors' initialisation), in the successor's layout."""
    return distillation.with_teacher_layers(predecessor_params, predecessor, successor, range(successor.num_layers))


def predecessor_layers(predecessor_params: dict, predecessor: BertConfig) -> dict:
    """{layers_i: params of predecessor layer i}, what the step takes as its argument."""
    encoder = bert.unrolled_encoder(predecessor_params["bert"]["encoder"], predecessor)
    return {k: v for k, v in encoder.items() if k.startswith("layers_")}


# --------------------------------------------------------------------------------------------------
# The draws and what trains
# --------------------------------------------------------------------------------------------------


def replacement_key(seed: int):
    """The run's key of the replacement draws (threefry: the same draws on any mesh)."""
    return jax.random.fold_in(jax.random.key(seed), REPLACE_STREAM)


def replacement_draws(key, step, num_modules: int, rate):
    """[M] bool: module g replaced by its successor at this step, each True with probability rate. The step
    is folded into the key (as dropout's is), so a resumed run draws what the uninterrupted one drew."""
    return jax.random.bernoulli(jax.random.fold_in(key, step), rate, (num_modules,))


def is_successor_layer(path) -> bool:
    """Whether a params path is one of the successor's layers (bert/encoder/layers_g, or the stacked layers)."""
    keys = [getattr(k, "key", None) for k in path[:3]]
    return keys[:2] == ["bert", "encoder"] and isinstance(keys[2], str) and keys[2].startswith("layers")


def successor_layers_only(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """tx on the successor's layers; the rest (embeddings, final norm, pooler, head) frozen with no
    optimizer state, as the authors' optimizer holds the successor layers only."""
    # A label per boxed param (init's nn.Partitioned) as per array: the frozen ones then leave no trace in
    # the state (a whole MaskedNode, not a box holding one), so its shardings follow the params'.
    labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: "train" if is_successor_layer(path) else "frozen", params,
        is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def _frozen_but_layers(params: dict) -> dict:
    """No gradient reaches what successor_layers_only freezes (its backward pass is then not computed)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x if is_successor_layer(path) else jax.lax.stop_gradient(x), params)


# --------------------------------------------------------------------------------------------------
# The mixed forward
# --------------------------------------------------------------------------------------------------


def _block(cfg: BertConfig, index: int, deterministic: bool) -> nn.Module:
    return bert.TransformerBlock(cfg, deterministic, False, cfg.is_local(index), index == 0, heads=cfg.heads_of(index))


def mixed_layers(x, padding, *, predecessor_layers: dict, successor_layers: dict, replaced, predecessor: BertConfig,
                 successor: BertConfig, deterministic: bool, rng=None):
    """Module g of the predecessor (its layers g r .. g r + r - 1, r = N / M) or successor layer g, as
    replaced[g] ([M] bool) says; x: [B, S, H] -> [B, S, H]. A lax.cond per module: only the chosen branch
    runs. Its blocks are not rematerialised (model.remat_policy applies to the successor's evaluation only).
    Dropout keys: fold_in(rng, 0) then the predecessor layer's index; fold_in(rng, 1) then the
    successor layer's."""
    per_module = predecessor.num_layers // successor.num_layers
    keys = (None, None) if deterministic else (jax.random.fold_in(rng, 0), jax.random.fold_in(rng, 1))

    def run(cfg, index, params, key, h):
        rngs = {} if deterministic else {"dropout": jax.random.fold_in(key, index)}
        return _block(cfg, index, deterministic).apply({"params": params}, h, padding, rngs=rngs)[0]

    for g in range(successor.num_layers):
        def keep(h, g=g):
            for i in range(g * per_module, (g + 1) * per_module):
                h = run(predecessor, i, predecessor_layers[f"layers_{i}"], keys[0], h)
            return h

        def replace(h, g=g):
            return run(successor, g, successor_layers[f"layers_{g}"], keys[1], h)

        x = jax.lax.cond(replaced[g], replace, keep, x)
    return x


def _mixed_encoder(predecessor_layers, replaced, predecessor: BertConfig, successor: BertConfig):
    """An interceptor of flax methods that runs the successor network's Encoder as the mixed one: the
    successor's layers from the network's own params, the predecessor's from the argument. The rest of
    the network (embeddings, pooler, head) runs as it is."""

    def encode(encoder, x, padding, deterministic, output_hidden_states=False, rows=None, head_mask=None):
        # x: [B, S, H]; rows: None or [B, Q] int. Returns ([B, S, H] or [B, Q, H], no hidden states, no scores),
        # as Encoder.__call__ returns them.
        if output_hidden_states or head_mask is not None:
            raise ValueError("module replacing runs the task heads' encoder only (no hidden states, no head mask)")
        own = encoder.variables["params"]
        x = mixed_layers(x, padding, predecessor_layers=predecessor_layers,
                         successor_layers=bert.unrolled_encoder(own, successor), replaced=replaced,
                         predecessor=predecessor, successor=successor, deterministic=deterministic,
                         rng=None if deterministic else encoder.make_rng("dropout"))
        if successor.pre_layer_norm or successor.norm_placement == "pre":  # the final norm: shared and frozen
            x = layers.layer_norm(successor, "final_layer_norm").apply({"params": own["final_layer_norm"]}, x)
        if rows is not None:
            x = jnp.take_along_axis(x, rows[..., None], axis=1)  # [B, Q, H]
        return x, [], []

    def intercept(next_fun, args, kwargs, context):
        if isinstance(context.module, bert.Encoder) and context.method_name == "__call__":
            return encode(context.module, *args, **kwargs)
        return next_fun(*args, **kwargs)

    return intercept


def theseus_loss(params, batch, dropout_rng, predecessor_layers, replaced, *, net, loss, predecessor: BertConfig,
                 successor: BertConfig):
    """The task loss of the mixed model: (loss, sums) as step.train_step takes them. params: the successor
    network's (only its layers get gradients); predecessor_layers: {layers_i: ...}; replaced: [M] bool."""
    with nn.intercept_methods(_mixed_encoder(predecessor_layers, replaced, predecessor, successor)):
        return task_loss(_frozen_but_layers(params), batch, dropout_rng, net=net, loss=loss)


# --------------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------------


def compile_step(setup, loss_fn, predecessor_layers: dict, rate: ReplaceRate, key, num_modules: int, data_sharding,
                 grad_accum_steps: int):
    """step.train_step over loss_fn(params, batch, dropout_rng, predecessor_layers, replaced) with this
    step's draws (the same for every microbatch), jitted once with the predecessor's layers an argument
    in their own shardings (not donated, not in the state). Its sums add replace_rate_sum (p_t) and
    replaced_sum (modules replaced). Returns (state, batch, dropout_key) -> (state, sums)."""

    def one_step(state, batch, dropout_key, layers_in, draws_key, rate_in):
        p = rate_in(state.step)
        replaced = replacement_draws(draws_key, state.step, num_modules, p)
        loss = functools.partial(loss_fn, predecessor_layers=layers_in, replaced=replaced)
        state, sums = steps.train_step(state, batch, dropout_key, loss_fn=loss, tx=setup.tx,
                                       grad_accum_steps=grad_accum_steps)
        return state, dict(sums, replace_rate_sum=p, replaced_sum=jnp.sum(replaced.astype(jnp.float32)))

    layer_sharding = jax.tree_util.tree_map(lambda a: a.sharding, predecessor_layers)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        jitted = jax.jit(under_rules(one_step, setup.rules),
                         in_shardings=(setup.state_sharding, data_sharding, None, layer_sharding, None, None),
                         out_shardings=(setup.state_sharding, None), donate_argnums=(0,))
    # The rate's numbers are arguments too: one program for any p (and the same one after a resume).
    rate_args = ReplaceRate(jnp.float32(rate.start), jnp.float32(rate.slope))
    return lambda state, batch, dropout_key: jitted(state, batch, dropout_key, predecessor_layers, key, rate_args)


def task_step(setup, predecessor_params: dict, predecessor: BertConfig, kind: str, num_labels: int, example: dict,
              rate: ReplaceRate, seed: int, data_sharding, grad_accum_steps: int):
    """Module replacing's train step on a task of `kind`: the mixed model's task loss, the predecessor's
    layers (unrolled) an argument of the step in the shardings its own network's axes give, the draws keyed
    by seed and the step. example: heads.dummy_inputs of the task, for the predecessor's layout."""
    unrolled = dataclasses.replace(predecessor, scan_layers=False)
    encoder = bert.unrolled_encoder(predecessor_params["bert"]["encoder"], predecessor)
    params = dict(predecessor_params, bert=dict(predecessor_params["bert"], encoder=encoder))
    placed = distillation.place_params(heads.network(kind, unrolled, num_labels), example, params, setup.mesh,
                                       setup.rules)
    loss = functools.partial(theseus_loss, net=setup.net, loss=heads.head(kind).loss, predecessor=predecessor,
                             successor=setup.net.config)
    return compile_step(setup, loss, predecessor_layers(placed, unrolled), rate, replacement_key(seed),
                        setup.net.config.num_layers, data_sharding, grad_accum_steps)
