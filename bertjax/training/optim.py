"""BERT's optimizers and learning-rate schedules, as optax transformations.

Two recipes (see docs/design.md and the Recipes of the reference notes):

- `bert_adamw`: the original BERT's AdamWeightDecayOptimizer (google-research/bert, optimization.py):
  Adam moments with *no* bias correction, decoupled weight decay on every weight except LayerNorm
  parameters and biases, global-norm clipping 1.0, linear warmup then linear decay to zero.
- `lamb`: LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76
  minutes") as NVIDIA's BERT recipe runs it, i.e. apex/DeepLearningExamples FusedLAMB(AMP) with its
  defaults: bias-corrected Adam direction, decoupled weight decay, per-tensor trust ratio on the
  decayed tensors only, global-norm clipping 1.0, warmup then decay lr * (1 - step/total)^0.5.
- `stable_adamw`: StableAdamW (Wortsman et al. 2023) as torch-optimi's `StableAdamW` computes it, which
  ModernBERT trains with: AdamW whose learning rate is divided, per tensor, by max(1, RMS of g / sqrt(v)).

Library functions take explicit arguments; `optimizer_from_config` is the one adapter from the config's
optimizer/schedule sections, for the training program.

Step convention: optax evaluates a schedule at the number of updates already applied (0 for the first
update). That is the original BERT's convention too: its learning rate reads global_step before the
train op increments it, so the very first update of a warmup has learning rate 0.
"""

from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

# The original's exclude_from_weight_decay: a parameter whose full name contains any of these
# (re.search on e.g. "bert/encoder/layer_0/attention/output/LayerNorm/gamma") does not decay.
# Our names: LayerNorm modules are "*layer_norm*" (scale, bias); biases are "bias" and the MLM
# "output_bias". NVIDIA's list ['bias', 'gamma', 'beta', 'LayerNorm'] selects the same tensors.
NO_DECAY_PATTERNS = ("LayerNorm", "layer_norm", "bias")

# The dict key under which model.Encoder's nn.scan stacks its per-layer params on axis 0.
SCANNED_LAYERS_KEY = "layers"

# decoupled_*: weight decay scaled by lr / peak, not by lr (composer's DecoupledAdamW; optimi's
# decouple_lr=True, ModernBERT's "decoupled_stableadamw").
OPTIMIZERS = ("adamw", "lamb", "decoupled_adamw", "stable_adamw", "decoupled_stable_adamw")
DECAYS = ("linear", "poly", "wsd")

Mask = Union[Any, Callable[[Any], Any]]


def _path_name(path) -> str:
    """Key path -> "bert/encoder/layers_0/mlp/intermediate/kernel"; a boxed (nn.LogicallyPartitioned)
    parameter's path ends in "/value", which no name pattern below looks for."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


# ---------------------------------------------------------------------------------------------------
# Learning-rate schedule
# ---------------------------------------------------------------------------------------------------


def learning_rate_schedule(
    peak: float, warmup_steps: int, total_steps: int, decay: str = "linear", power: float = 1.0
) -> optax.Schedule:
    """Linear warmup to `peak`, then polynomial decay to 0 at `total_steps`, both as BERT writes them.

    lr(step) = peak * step / warmup_steps                      if step < warmup_steps
             = peak * (1 - min(step, total)/total) ** power    otherwise

    The decay is measured from step 0, not from the end of warmup. This is the original BERT's
    tf.train.polynomial_decay(lr, global_step, num_train_steps, end_learning_rate=0, power=1.0) with the
    warmup value substituted while step < warmup, and NVIDIA's PolyWarmUpScheduler
    (lr * (1 - step/total) ** 0.5 after lr * step/warmup). Hence the small jump down at the end of
    warmup, from peak to peak * (1 - warmup/total) ** power: both originals have it.

    decay: "linear" (power 1, BERT) or "poly" (power as given, NVIDIA's LAMB recipe uses 0.5).
    Steps are 0-based update counts (see the module docstring); NVIDIA evaluates its scheduler at the
    1-based count, i.e. one step ahead of this.
    """
    if decay not in DECAYS:
        raise ValueError(f"decay={decay!r} is unknown: choose one of {DECAYS}")
    if decay == "linear" and power != 1.0:
        raise ValueError(f"decay='linear' has power 1, not {power}: use decay='poly' for another power")
    if total_steps <= 0:
        raise ValueError(f"total_steps={total_steps} must be positive")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must lie in [0, total_steps={total_steps}]")
    if power <= 0:
        raise ValueError(f"power={power} must be positive")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        # tf.train.polynomial_decay with cycle=False holds the step at decay_steps: lr stays 0 after.
        # (total - step) / total rather than 1 - step/total: the subtraction of whole numbers is exact
        # in float32, so the last steps keep their relative precision instead of losing it to rounding.
        remaining = (total_steps - jnp.minimum(step, total_steps)) / total_steps
        lr = peak * remaining**power
        if warmup_steps > 0:
            lr = jnp.where(step < warmup_steps, peak * step / warmup_steps, lr)
        return lr

    return schedule


def warmup_stable_decay_schedule(peak: float, warmup_steps: int, total_steps: int, decay_steps: int) -> optax.Schedule:
    """Warmup-stable-decay (ModernBERT's trapezoid): linear warmup to `peak`, `peak` until the last
    `decay_steps` steps, then 1 - sqrt down to 0 at `total_steps` (Hägele et al. 2024's cooldown).

    lr(step) = peak * step / warmup_steps                                  if step < warmup_steps
             = peak                                                        until total - decay_steps
             = peak * (1 - sqrt((step - (total - decay_steps)) / decay_steps)) after (0 from total on)
    """
    if total_steps <= 0 or not 0 <= warmup_steps <= total_steps - decay_steps or decay_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} + decay_steps={decay_steps} must fit in total_steps="
                         f"{total_steps} (all >= 0)")

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        lr = jnp.full_like(step, peak)
        if decay_steps > 0:
            into = jnp.clip((step - (total_steps - decay_steps)) / decay_steps, 0.0, 1.0)
            lr = peak * (1.0 - jnp.sqrt(into))
        if warmup_steps > 0:
            lr = jnp.where(step < warmup_steps, peak * step / warmup_steps, lr)
        return lr

    return schedule


# ---------------------------------------------------------------------------------------------------
# Which parameters decay
# ---------------------------------------------------------------------------------------------------


def weight_decay_mask(params):
    """True for the parameters that decay: every one except LayerNorm parameters and biases.

    Matches by substring on the '/'-joined parameter path, exactly like the original's
    re.search(pattern, variable_name) over NO_DECAY_PATTERNS. Works on the unrolled (layers_i) and
    scanned (stacked "layers") layouts alike, since only names are read, and on boxed
    (nn.LogicallyPartitioned) params, whose mask comes back in the same boxes so that the two trees
    have the same structure.
    """

    def decays(path, _):
        name = _path_name(path)
        return not any(pattern in name for pattern in NO_DECAY_PATTERNS)

    return jax.tree_util.tree_map_with_path(decays, params)


def _resolve_mask(mask: Mask, params):
    return mask(params) if callable(mask) else mask


def _per_tensor_axes(path, p, stacked_key: Optional[str]):
    """The axes a per-tensor statistic reduces over: all of them, or all but the first for the encoder
    layers stacked under `stacked_key` (one value per layer, as in the unrolled layout)."""
    stacked = stacked_key is not None and stacked_key in _path_name(path).split("/") and jnp.ndim(p) > 0
    return tuple(range(1, jnp.ndim(p))) if stacked else None


# ---------------------------------------------------------------------------------------------------
# Transformations
# ---------------------------------------------------------------------------------------------------


class ScaleByBertAdamState(NamedTuple):
    count: jax.Array  # int32 [], updates applied so far
    mu: Any  # first moment, float32, the shape of params
    nu: Any  # second moment, float32


def scale_by_bert_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                       bias_correction: bool = False) -> optax.GradientTransformation:
    """Adam's direction m / (sqrt(v) + eps), with or without bias correction.

    optax.scale_by_adam always bias-corrects (optax 0.2.8 has no switch), and the original BERT Adam
    never does: with b2 = 0.999 its early steps are ~sqrt(1 - b2^t)/(1 - b1^t) times the corrected
    ones, which is part of why BERT needs its warmup. One transformation serves both, so the state
    (and so a checkpoint) has the same structure whichever is chosen. The moments are float32 whatever
    the parameter dtype: bfloat16 cannot hold (1 - b2) * g^2 added to v.

    With bias_correction=True: m_hat / (sqrt(v_hat) + eps), as torch.optim.AdamW, optax.scale_by_adam
    and apex's LAMB kernel compute it (eps outside the square root, after the correction).
    """

    def init_fn(params):
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)  # noqa: E731
        return ScaleByBertAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=jax.tree_util.tree_map(zeros, params),
            nu=jax.tree_util.tree_map(zeros, params),
        )

    def update_fn(updates, state, params=None):
        del params
        grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), updates)
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state.nu, grads)
        count = optax.safe_int32_increment(state.count)
        if bias_correction:
            t = count.astype(jnp.float32)
            c1, c2 = 1.0 - b1**t, 1.0 - b2**t
            direction = jax.tree_util.tree_map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        else:
            direction = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        return direction, ScaleByBertAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_trust_ratio(mask: Mask = True, stacked_key: Optional[str] = SCANNED_LAYERS_KEY
                         ) -> optax.GradientTransformation:
    """LAMB's layer-wise adaptation: update * ||w|| / ||update|| per tensor, 1 when either norm is 0.

    mask: a pytree of bools (or a function of params giving one), True where the ratio applies;
      True alone applies it everywhere.
    stacked_key: params under a dict key of this name hold all encoder layers stacked on axis 0
      (model.Encoder's nn.scan). Their norms are taken per layer, over the other axes, so that each
      layer's tensor gets its own ratio exactly as in the unrolled layout: scan_layers is a
      compilation choice and must not change the optimizer. (optax.scale_by_trust_ratio would take
      one norm over all L layers.)
    """

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_by_trust_ratio needs params: call update(grads, state, params)")
        apply = _resolve_mask(mask, params)
        if isinstance(apply, bool):
            apply = jax.tree_util.tree_map(lambda _: apply, params)

        def scale(path, u, p, on):
            axes = _per_tensor_axes(path, p, stacked_key)
            # float32 norms: a bfloat16 sum of squares over a 30k x 1k embedding loses the ratio.
            p_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=axes, keepdims=True))
            u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=True))
            # apex: ratio = (update_norm != 0 && param_norm != 0) ? param_norm / update_norm : 1.
            # The safe denominator keeps the unused branch of the where finite.
            ratio = jnp.where((p_norm > 0) & (u_norm > 0), p_norm / jnp.where(u_norm > 0, u_norm, 1.0), 1.0)
            ratio = jnp.where(on, ratio, 1.0)
            return (u * ratio).astype(u.dtype)

        return jax.tree_util.tree_map_with_path(scale, updates, params, apply), state

    return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


class ScaleByStableAdamState(NamedTuple):
    count: jax.Array  # int32 [], updates applied so far
    mu: Any  # bias-corrected first moment, float32, the shape of params
    nu: Any  # bias-corrected second moment, float32


def _debiased_beta(beta: float, count):
    """optimi's beta_hat = beta (1 - beta^(t-1)) / (1 - beta^t), written as it does: an average with
    beta_hat holds the bias-corrected moment itself (0 at t = 1, so the first moment is the gradient)."""
    power = jnp.power(jnp.float32(beta), count.astype(jnp.float32))
    return (power - beta) / (power - 1.0)


def scale_by_stable_adamw(b1: float = 0.9, b2: float = 0.99, eps: float = 1e-6, weight_decay: float = 0.0,
                          mask: Mask = True, stacked_key: Optional[str] = SCANNED_LAYERS_KEY
                          ) -> optax.GradientTransformation:
    """StableAdamW's step before the learning rate, per tensor (optimi 0.3.3, stableadamw.py):

        m, v  <- averages with the debiased betas (so m and v are already bias-corrected)
        rms   =  sqrt(mean(g^2 / max(v, eps^2)))             AdaFactor's update clipping
        out   =  (m / (sqrt(v) + eps) + weight_decay * w) / max(1, rms)

    The decay term shares the division because optimi multiplies w by 1 - (lr / max(1, rms)) * wd:
    the clipped learning rate scales both. The decay applies where `mask` is True (optax's
    add_decayed_weights). The RMS of the encoder layers stacked under `stacked_key` is taken per layer,
    so scan_layers does not change the optimizer (as LAMB's trust ratio). Moments are float32.
    """
    decay = optax.add_decayed_weights(weight_decay, mask)

    def init_fn(params):
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)  # noqa: E731
        return ScaleByStableAdamState(count=jnp.zeros([], jnp.int32), mu=jax.tree_util.tree_map(zeros, params),
                                      nu=jax.tree_util.tree_map(zeros, params))

    def update_fn(updates, state, params=None):
        if weight_decay and params is None:
            raise ValueError("scale_by_stable_adamw with weight decay needs params: call update(grads, state, params)")
        grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), updates)
        count = optax.safe_int32_increment(state.count)
        b1_hat, b2_hat = _debiased_beta(b1, count), _debiased_beta(b2, count)
        # torch's lerp(m, g, 1 - b1_hat) and mul-then-addcmul, in their order of operations.
        mu = jax.tree_util.tree_map(lambda m, g: m + (1.0 - b1_hat) * (g - m), state.mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2_hat * v + (1.0 - b2_hat) * (g * g), state.nu, grads)
        direction = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        if weight_decay:
            direction, _ = decay.update(direction, decay.init(params), params)

        def clipped(path, d, g, v):
            axes = _per_tensor_axes(path, g, stacked_key)
            rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v, eps * eps), axis=axes, keepdims=True))
            return d / jnp.maximum(1.0, rms)

        out = jax.tree_util.tree_map_with_path(clipped, direction, grads, nu)
        return out, ScaleByStableAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


# ---------------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------------


def bert_adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = False,
    mask: Mask = weight_decay_mask,
) -> optax.GradientTransformation:
    """BERT's AdamWeightDecayOptimizer:  w <- w - lr * (m / (sqrt(v) + eps) + weight_decay * w).

    The decay term is added to the Adam direction before the learning rate (decoupled, Loshchilov &
    Hutter), only where `mask` is True. With bias_correction=True this is exactly torch.optim.AdamW
    with a no-decay parameter group (torch multiplies w by 1 - lr * wd first; the same arithmetic).
    No clipping here: optimizer_from_config chains the global-norm clip in front.
    """
    return optax.chain(
        scale_by_bert_adam(b1, b2, eps, bias_correction),
        optax.add_decayed_weights(weight_decay, mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def lamb(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = True,
    mask: Mask = weight_decay_mask,
    trust_ratio_on_all_params: bool = False,
    stacked_key: Optional[str] = SCANNED_LAYERS_KEY,
) -> optax.GradientTransformation:
    """LAMB as NVIDIA's BERT recipe uses it (apex FusedLAMB / DeepLearningExamples FusedLAMBAMP defaults).

    Per tensor:  r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w   (decay only where mask is True)
                 w <- w - lr * ratio * r,   ratio = ||w|| / ||r||, or 1 when either norm is 0.

    Facts from apex csrc/multi_tensor_lamb.cu and FusedLAMBAMP, which this follows:
    - bias_correction=True by default (1 - b^step with step counted from 1); grad_averaging=True, so the
      first moment uses (1 - b1) * g, as here.
    - The trust ratio is applied only to tensors whose parameter group has weight_decay != 0, unless
      use_nvlamb=True. NVIDIA's run_pretraining puts ['bias', 'gamma', 'beta', 'LayerNorm'] in a group
      with weight_decay 0, so LayerNorm parameters and biases take plain bias-corrected Adam steps
      with no trust ratio. That is the default here (the ratio follows `mask`; and with
      weight_decay == 0 no tensor gets one). trust_ratio_on_all_params=True is apex's use_nvlamb and
      the paper's algorithm.
    - max_grad_norm=1.0 inside FusedLAMB scales the gradient by 1/max(1, global_norm): the same as the
      optax.clip_by_global_norm(1.0) that optimizer_from_config chains in front.

    Relation to optax.lamb (0.2.8): optax.lamb = scale_by_adam (bias-corrected) + add_decayed_weights
    + scale_by_trust_ratio on *every* tensor + learning rate. On unrolled params it equals
    lamb(..., bias_correction=True, trust_ratio_on_all_params=True) here (tested), but not NVIDIA's
    default, and on the scanned layout it would take one norm over all layers stacked together.
    """
    if trust_ratio_on_all_params:
        trust_ratio = scale_by_trust_ratio(True, stacked_key)
    elif weight_decay == 0:
        trust_ratio = optax.identity()  # apex: no group has decay != 0, so no tensor gets a ratio
    else:
        trust_ratio = scale_by_trust_ratio(mask, stacked_key)
    return optax.chain(
        scale_by_bert_adam(b1, b2, eps, bias_correction),
        optax.add_decayed_weights(weight_decay, mask),
        trust_ratio,
        optax.scale_by_learning_rate(learning_rate),
    )


def stable_adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    eps: float = 1e-6,
    weight_decay: float = 1e-2,
    decouple_lr: bool = False,
    max_lr: Optional[float] = None,
    mask: Mask = weight_decay_mask,
    stacked_key: Optional[str] = SCANNED_LAYERS_KEY,
) -> optax.GradientTransformation:
    """optimi.StableAdamW (its defaults: betas (0.9, 0.99), eps 1e-6, weight decay 1e-2):

        lr_t = lr(t) / max(1, rms_t)                       per tensor (scale_by_stable_adamw)
        w   <- w * (1 - lr_t * wd) - lr_t * m / (sqrt(v) + eps)             decouple_lr=False
        w   <- w * (1 - (lr_t / max_lr) * wd) - ...                         decouple_lr=True

    decouple_lr=True is optimi's "fully decoupled" decay, which ModernBERT trains with: the decay
    follows the schedule's shape but not its size; max_lr is the schedule's peak (optimi's default
    for it is the initial lr). Bias correction is always on (optimi has no switch).
    """
    if decouple_lr:
        if not max_lr or max_lr <= 0:
            raise ValueError(f"stable_adamw with decouple_lr=True needs max_lr > 0 (the schedule's peak), not {max_lr}")
        weight_decay = weight_decay / max_lr
    return optax.chain(
        scale_by_stable_adamw(b1, b2, eps, weight_decay, mask, stacked_key),
        optax.scale_by_learning_rate(learning_rate),
    )


# ---------------------------------------------------------------------------------------------------
# The config adapter
# ---------------------------------------------------------------------------------------------------


def optimizer_from_config(optimizer_cfg, schedule_cfg, num_steps: int):
    """config.optimizer, config.schedule, config.train.num_steps -> (GradientTransformation, schedule).

    The chain is clip_by_global_norm(optimizer.clip_norm) -> the named optimizer; clip_norm=0 turns the
    clipping off. optimizer.bias_correction=None takes the optimizer's own default (False for
    BERT's adamw, True for NVIDIA's lamb). The schedule is returned too, for logging the learning rate.
    """
    o, s = optimizer_cfg, schedule_cfg
    if o.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={o.name!r} is unknown: choose one of {list(OPTIMIZERS)}")
    if num_steps <= 0:
        raise ValueError(f"train.num_steps={num_steps} must be positive")
    if not 0 <= s.warmup_steps <= num_steps:
        raise ValueError(
            f"schedule.warmup_steps={s.warmup_steps} must lie in [0, train.num_steps={num_steps}]: "
            "lower schedule.warmup_steps or raise train.num_steps"
        )
    if s.decay not in DECAYS:
        raise ValueError(f"schedule.decay={s.decay!r} is unknown: choose one of {list(DECAYS)}")
    if s.decay == "linear" and s.power != 1.0:
        raise ValueError(
            f"schedule.power={s.power} has no effect with schedule.decay='linear': set schedule.decay='poly'"
        )
    if s.power <= 0:
        raise ValueError(f"schedule.power={s.power} must be positive")
    if o.learning_rate <= 0:
        raise ValueError(f"optimizer.learning_rate={o.learning_rate} must be positive")
    for key in ("b1", "b2"):
        if not 0 <= o[key] < 1:
            raise ValueError(f"optimizer.{key}={o[key]} must lie in [0, 1)")
    if o.eps <= 0:
        # Embedding rows of tokens not yet seen have m = v = 0: 0 / (0 + eps) must stay finite.
        raise ValueError(f"optimizer.eps={o.eps} must be positive")
    if o.weight_decay < 0:
        raise ValueError(f"optimizer.weight_decay={o.weight_decay} must not be negative")
    if o.clip_norm < 0:
        raise ValueError(f"optimizer.clip_norm={o.clip_norm} must not be negative (0 turns clipping off)")

    if s.decay == "wsd":
        schedule = warmup_stable_decay_schedule(o.learning_rate, s.warmup_steps, num_steps, s.get("decay_steps", 0))
    else:
        schedule = learning_rate_schedule(o.learning_rate, s.warmup_steps, num_steps, s.decay, s.power)
    kwargs = dict(b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    if o.name in ("stable_adamw", "decoupled_stable_adamw"):
        if o.bias_correction is not None and not o.bias_correction:
            raise ValueError(f"optimizer.bias_correction={o.bias_correction} with optimizer.name={o.name!r}: "
                             "StableAdamW always corrects its moments; set optimizer.bias_correction=True")
        decoupled = o.name == "decoupled_stable_adamw"
        tx = stable_adamw(schedule, decouple_lr=decoupled, max_lr=o.learning_rate if decoupled else None, **kwargs)
    else:
        make = lamb if o.name == "lamb" else bert_adamw
        if o.name == "decoupled_adamw":
            # -lr(t) * (adam + wd/peak * w) = -lr(t) * adam - (lr(t)/peak) * wd * w: composer's DecoupledAdamW.
            kwargs["weight_decay"] = o.weight_decay / o.learning_rate
        if o.bias_correction is not None:
            kwargs["bias_correction"] = bool(o.bias_correction)
        tx = make(schedule, **kwargs)
    if o.clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(o.clip_norm), tx)
    return tx, schedule


# ---------------------------------------------------------------------------------------------------
# Gradient accumulation
# ---------------------------------------------------------------------------------------------------


def accumulate_gradients(loss_and_grad_fn, params, batch, num_microbatches: int, rng, count=None):
    """One step's gradients from k microbatches: ((mean loss, summed metrics), mean grads).

    count: the number of microbatches used, a traced int32 in [1, k] (batch-size warmup,
    training/batch_warmup.py): only the first `count` are computed, in a loop whose trip count is that
    value, and the means are over them; None uses all k. One compiled program serves every count.

    loss_and_grad_fn(params, microbatch, rng) -> ((loss, metrics), grads), e.g.
    jax.value_and_grad(loss_fn, has_aux=True). The result has the same structure, so k = 1 (a direct
    call, no scan) and k > 1 are interchangeable. Microbatch i gets rng split i.

    What equals what: mean gradients over k microbatches are the gradient of the mean of the k
    microbatch losses. That is the full-batch loss when the loss is a mean over equal-size
    microbatches (NSP's mean over sequences). BERT's MLM loss is a *weighted* mean over the real
    predictions, sum(w * nll) / sum(w): the mean of per-microbatch MLM losses equals the full-batch
    MLM loss only when every microbatch has the same number of real predictions (the same sum(w));
    otherwise each prediction weighs 1 / (its microbatch's count) instead of 1 / (total count).

    Metrics are summed (model.pretraining_loss returns sums and counts so that they add up); entries
    that are themselves means, like its mlm_loss and nsp_loss, come back as the sum of k means:
    divide those by k, or recompute from the sums.

    Microbatch i holds examples i, i + k, i + 2k, ... (a strided split). The batch axis is sharded in
    contiguous blocks over the data devices; a strided split gives every device B / (k * devices) of
    its own examples for each microbatch, while a contiguous split would put microbatch i on a few
    devices only and make XLA move data.
    """
    k = num_microbatches
    if k < 1:
        raise ValueError(f"train.grad_accum_steps={k} must be at least 1")
    if k == 1 and count is None:
        return loss_and_grad_fn(params, batch, rng)
    microbatches = _strided_microbatches(batch, k)
    rngs = None if rng is None else jax.random.split(rng, k)
    ((loss_sum, metrics), grad_sum), out_shape = _summed_over_microbatches(loss_and_grad_fn, params,
                                                                           microbatches, rngs, count)
    (loss_shape, _), grad_shape = out_shape
    divisor = k if count is None else count.astype(jnp.float32)
    loss = (loss_sum / divisor).astype(loss_shape.dtype)
    divide = lambda g, s: (g / divisor).astype(s.dtype)  # noqa: E731
    if _overwrites(grad_sum):  # new values, combined by max: nothing to average
        return (loss, metrics), {"params": jax.tree_util.tree_map(divide, grad_sum["params"], grad_shape["params"]),
                                 OVERWRITE_WITH_GRADIENT: grad_sum[OVERWRITE_WITH_GRADIENT]}
    return (loss, metrics), jax.tree_util.tree_map(divide, grad_sum, grad_shape)


def _overwrites(grads) -> bool:
    """Gradients of {"params", OVERWRITE_WITH_GRADIENT} (an fp8 run, training/step.py), whose second part
    is new values (amax histories, scales), not gradients."""
    return isinstance(grads, dict) and OVERWRITE_WITH_GRADIENT in grads


def _strided_microbatches(batch, k: int):
    """[B, ...] -> [k, B/k, ...] per feature, microbatch i = examples i::k (see accumulate_gradients)."""
    sizes = {x.shape[0] for x in jax.tree_util.tree_leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"every batch feature needs the same leading (batch) size; got sizes {sorted(sizes)}")
    (size,) = sizes
    if size % k:
        raise ValueError(
            f"train.grad_accum_steps={k} does not divide the batch of {size} sequences: "
            "choose a train.grad_accum_steps that divides train.batch_size (per step)"
        )

    def split(x):  # [B, ...] -> [k, B/k, ...], microbatch i = examples i::k
        return jnp.swapaxes(x.reshape((size // k, k) + x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def _summed_over_microbatches(loss_and_grad_fn, params, microbatches, rngs, count=None):
    """((loss sum, metric sums), grad sums) over the microbatches (the first `count` of them, where
    given), in one scan (a loop), and the shapes and dtypes of one microbatch's result."""

    # Sums accumulate in float32 at least: k bfloat16 additions would round each partial sum.
    def acc_dtype(dtype):
        return jnp.promote_types(dtype, jnp.float32) if jnp.issubdtype(dtype, jnp.floating) else dtype

    first = jax.tree_util.tree_map(lambda x: x[0], microbatches)
    out_shape = jax.eval_shape(loss_and_grad_fn, params, first, None if rngs is None else rngs[0])
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, acc_dtype(s.dtype)), out_shape)

    add = lambda t, o: t + o.astype(t.dtype)  # noqa: E731

    def body(total, xs):
        microbatch, key = xs
        (aux, grads), (aux_total, grads_total) = loss_and_grad_fn(params, microbatch, key), total
        if not _overwrites(grads):
            return jax.tree_util.tree_map(add, total, (aux, grads)), None
        # An fp8 run's new amax histories and scales: their max over the microbatches is the history of
        # the whole step's amax (each microbatch starts from the same state, so the scales agree). All
        # are non-negative, so the zeros they start from are neutral.
        return (jax.tree_util.tree_map(add, aux_total, aux), {
            "params": jax.tree_util.tree_map(add, grads_total["params"], grads["params"]),
            OVERWRITE_WITH_GRADIENT: jax.tree_util.tree_map(jnp.maximum, grads_total[OVERWRITE_WITH_GRADIENT],
                                                            grads[OVERWRITE_WITH_GRADIENT])}), None

    if count is None:
        return jax.lax.scan(body, zeros, (microbatches, rngs))[0], out_shape

    def indexed(i, total):  # microbatch i of the buffer, read in place
        xs = jax.tree_util.tree_map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False),
                                    (microbatches, rngs))
        return body(total, xs)[0]

    return jax.lax.fori_loop(0, count, indexed, zeros), out_shape
