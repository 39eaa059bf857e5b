"""Pruning a fine-tuned encoder: whole attention heads by importance, and single weights by magnitude.

Heads (Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?"): a head's importance is
the expected absolute gradient of the task loss with respect to a multiplier on its attention output (the
head mask, all ones), accumulated over batches of the task's training data, then normalised within each
layer by the layer's L2 norm as the paper does. The globally least important heads go, every layer
keeping at least one; the kept heads' parameters are sliced out (q/k/v kernels and biases, the output
kernel's rows) and the config's layer_heads says how many each layer has, so the pruned model is smaller
and faster. ALBERT's layers share their parameters, so its heads go per shared group, for every layer
that runs the group, ranked by their importance summed over those layers. Hugging Face export pads the
removed heads back as zeros (`with_all_heads`), for every family.

Weights: unstructured magnitude pruning sets the smallest |w| of the encoder layers' dense kernels (the
attention q/k/v/output and feed-forward kernels; not the embeddings, pooler or classifier) to zero, with
one threshold over all of them (global), and `keep_pruned_zeros` keeps them zero through recovery
fine-tuning. Zeros in dense kernels do not make dense matmuls faster (docs/performance.md, Pruning).

Shape legend (as in bertjax/models/bert.py): L layers, N heads of a layer, H hidden size, D head size.
"""

import contextlib
import dataclasses
import functools
from typing import Callable, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.models import bert as bert_model

from bertjax.models.config import BertConfig

# --------------------------------------------------------------------------------------------------
# Head importance
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def head_mask_in(head_mask):
    """Within it, every BertModel call (inside any task head's apply) takes `head_mask` [L, N]: how a
    mask reaches the encoder of a network whose head does not pass one."""

    def interceptor(next_fun, args, kwargs, context):
        if isinstance(context.module, bert_model.BertModel) and context.method_name == "__call__":
            kwargs = dict(kwargs, head_mask=head_mask)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


def mask_shape(cfg: BertConfig) -> tuple[int, int]:
    """[L, N] of the head mask: N the most heads any layer has."""
    return cfg.num_layers, max(cfg.layer_heads or (cfg.num_heads,))


def head_importance(loss_fn: Callable, params, batches: Iterable[dict], cfg: BertConfig,
                    normalize: bool = True) -> np.ndarray:
    """Michel et al.'s head importance [L, N] (float64): the mean over `batches` of |d loss / d mask| at a
    head mask of ones, where loss_fn(params, batch) -> the scalar task loss (deterministic: no dropout).
    As the paper's own code (and transformers' bertology example) do, the absolute value is taken of each
    batch's gradient. normalize: each layer's scores divided by their L2 norm (as the paper does),
    so that layers compare on one scale. Heads a pruned layer does not have score 0."""

    grad = _mask_gradient(loss_fn)
    ones = jnp.ones(mask_shape(cfg), jnp.float32)
    total, count = np.zeros(ones.shape), 0
    for batch in batches:
        total += np.abs(np.asarray(grad(ones, params, batch), np.float64))
        count += 1
    if count == 0:
        raise ValueError("head importance needs at least one batch of training data")
    scores = total / count
    for layer in range(cfg.num_layers):
        scores[layer, cfg.heads_of(layer):] = 0.0
    if normalize:
        scores = scores / np.maximum(np.linalg.norm(scores, axis=1, keepdims=True), 1e-20)
    return scores


@functools.lru_cache(maxsize=8)
def _mask_gradient(loss_fn: Callable):
    """jit(d loss_fn / d head mask), compiled once per loss function."""

    def masked_loss(mask, params, batch):
        with head_mask_in(mask):
            return loss_fn(params, batch)

    return jax.jit(jax.grad(masked_loss))


def group_importance(importance: np.ndarray, cfg: BertConfig) -> np.ndarray:
    """[G, N]: the importance of each parameter group's heads, the sum over the layers that run it (ALBERT's
    shared groups: a head removed from a group is removed from all its layers); [L, N] as it is otherwise."""
    per_group = cfg.num_layers // cfg.num_groups
    return importance.reshape(cfg.num_groups, per_group, -1).sum(axis=1)


def total_heads(cfg: BertConfig) -> int:
    """The heads with parameters of their own: over the layers, or over ALBERT's shared groups."""
    return sum(cfg.heads_of_group(g) for g in range(cfg.num_groups))


def heads_to_keep(importance: np.ndarray, cfg: BertConfig, target: int) -> list[list[int]]:
    """The heads (indices in each parameter group, ascending) of the `target` most important in all, each
    group (each layer, but for ALBERT's shared groups) keeping at least its most important one; importance
    is [L, N] (head_importance)."""
    scores = group_importance(importance, cfg)
    groups = cfg.num_groups
    have = total_heads(cfg)
    if not groups <= target <= have:
        raise ValueError(f"prune.heads={target}: between {groups} (one head per layer or group) and the model's "
                         f"{have} heads")
    keep = [{int(np.argmax(scores[g, :cfg.heads_of_group(g)]))} for g in range(groups)]
    ranked = sorted(((scores[g, h], g, h) for g in range(groups) for h in range(cfg.heads_of_group(g))
                     if h not in keep[g]), reverse=True)
    for _, g, h in ranked[:target - groups]:
        keep[g].add(h)
    return [sorted(k) for k in keep]


# --------------------------------------------------------------------------------------------------
# Removing heads
# --------------------------------------------------------------------------------------------------


def _encoder_layers(params: dict, cfg: BertConfig) -> dict:
    """The encoder's params unrolled ({layers_0: ...}, one entry per parameter group), from a task head's or
    pretraining's params."""
    params = nn.meta.unbox(params)
    return bert_model.unrolled_encoder(params["bert"]["encoder"], cfg)


def _with_encoder(params: dict, encoder: dict, cfg: BertConfig) -> dict:
    """params with the unrolled `encoder` in, laid out as cfg says (stacked where it scans)."""
    if cfg.scan_layers:
        encoder = bert_model.stack_layers(encoder, cfg)
    params = nn.meta.unbox(params)
    return {**params, "bert": {**params["bert"], "encoder": encoder}}


# The head axis of each attention param: q/k/v kernels [H, N, D] and biases [N, D]; output kernel [N, D, H]
# (its bias [H] belongs to no head and stays whole).
_HEAD_AXES = {"query": {"kernel": 1, "bias": 0}, "key": {"kernel": 1, "bias": 0},
              "value": {"kernel": 1, "bias": 0}, "output": {"kernel": 0}}


def _map_head_axes(layer: dict, fn: Callable) -> dict:
    """A layer's params with fn(x, head axis) applied to each attention param that has a head axis."""
    attention = {name: {k: fn(x, _HEAD_AXES[name][k]) if k in _HEAD_AXES.get(name, {}) else x for k, x in sub.items()}
                 for name, sub in layer["attention"].items()}
    return {**layer, "attention": attention}


def prune_heads(params: dict, cfg: BertConfig, keep: list[list[int]]):
    """(pruned config, pruned params): parameter group g (layer g, but for ALBERT's shared groups) keeps the
    heads keep[g] (indices among its own), the others' parameters removed. The config keeps num_heads
    (what Hugging Face export pads back to) and says the head size and each group's count. Equal counts
    stay scanned; unequal ones cannot be (one shape per scan): scan_layers is then turned off."""
    if len(keep) != cfg.num_groups or any(not k for k in keep):
        raise ValueError(f"keep names the heads of each of the {cfg.num_groups} layers (or groups), at least one each")
    encoder = _encoder_layers(params, cfg)
    for i, heads in enumerate(keep):
        if sorted(set(heads)) != sorted(heads) or not all(0 <= h < cfg.heads_of_group(i) for h in heads):
            raise ValueError(f"layer (group) {i} has heads 0..{cfg.heads_of_group(i) - 1}: cannot keep {heads}")
        index = jnp.asarray(sorted(heads))
        encoder[f"layers_{i}"] = _map_head_axes(encoder[f"layers_{i}"],
                                                lambda x, axis, index=index: jnp.take(x, index, axis=axis))
    counts = tuple(len(k) for k in keep)
    pruned = dataclasses.replace(cfg, layer_heads=counts, head_size=cfg.head_dim,
                                 scan_layers=cfg.scan_layers and len(set(counts)) == 1)
    return pruned, _with_encoder(params, encoder, pruned)


def with_all_heads(params: dict, cfg: BertConfig):
    """(config, params) of a head-pruned model at full shapes: every layer back to num_heads heads, the
    removed ones all zeros (so they add nothing: the same outputs). What Hugging Face export writes, as
    transformers 5's BERT has no pruned heads. An unpruned model comes back as it is."""
    if not cfg.layer_heads:
        return cfg, params
    if cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise ValueError(f"model.head_size={cfg.head_dim} x model.num_heads={cfg.num_heads} is not "
                         f"model.hidden_size={cfg.hidden_size}: no full-size BERT holds these heads")
    encoder = _encoder_layers(params, cfg)
    for i in range(cfg.num_groups):
        missing = cfg.num_heads - cfg.heads_of_group(i)

        def pad(x, axis, missing=missing):
            return jnp.pad(x, [(0, missing if a == axis else 0) for a in range(x.ndim)])

        encoder[f"layers_{i}"] = _map_head_axes(encoder[f"layers_{i}"], pad)
    full = dataclasses.replace(cfg, layer_heads=(), head_size=0)
    return full, _with_encoder(params, encoder, full)


# --------------------------------------------------------------------------------------------------
# Magnitude pruning
# --------------------------------------------------------------------------------------------------


def is_prunable(path) -> bool:
    """A dense kernel of an encoder layer: attention query/key/value/output and the feed-forward's."""
    names = [getattr(k, "key", str(k)) for k in path]
    return names[-1] == "kernel" and "encoder" in names and any(n.startswith("layers") for n in names)


def magnitude_prune(params, sparsity: float):
    """(params, achieved sparsity): the fraction `sparsity` of the prunable weights (is_prunable) with the
    smallest |w| over all of them together set to zero (global magnitude pruning). The achieved
    sparsity counts zeros among the prunable weights, exact up to ties at the threshold."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"prune.sparsity={sparsity}: a fraction in [0, 1)")
    params = nn.meta.unbox(params)
    leaves = [np.abs(np.asarray(x, np.float32)).ravel() for p, x in jax.tree_util.tree_leaves_with_path(params)
              if is_prunable(p)]
    if not leaves:
        raise ValueError("the params have no encoder kernels to prune")
    magnitudes = np.concatenate(leaves)
    count = int(round(sparsity * magnitudes.size))
    if count == 0:
        return params, prunable_sparsity(params)
    threshold = np.partition(magnitudes, count - 1)[count - 1]  # the count-th smallest |w|
    pruned = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.where(jnp.abs(x) <= threshold, jnp.zeros_like(x), x) if is_prunable(p) else x, params)
    return pruned, prunable_sparsity(pruned)


def prunable_sparsity(params) -> float:
    """The fraction of zeros among the prunable weights."""
    leaves = [np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(params)) if is_prunable(p)]
    return float(sum(int(np.sum(x == 0)) for x in leaves) / sum(x.size for x in leaves))


def keep_pruned_zeros() -> optax.GradientTransformation:
    """Chained after the optimizer: the updates of prunable weights that are zero are zero, so that the
    weights magnitude pruning removed stay exactly zero through recovery fine-tuning (weight decay
    included). The mask is the kernels' own zero pattern, so it needs no state and survives a resume;
    a surviving weight that became exactly 0.0 would be frozen too, which float updates all but never do."""

    def keep(updates, params):
        return jax.tree_util.tree_map_with_path(
            lambda p, u, w: jnp.where(w == 0, jnp.zeros_like(u), u) if is_prunable(p) else u, updates, params)

    return optax.stateless(keep)
