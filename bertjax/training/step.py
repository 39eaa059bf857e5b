"""The one train step every program jits: any loss function, gradient accumulation, the optimizer
update and the metric sums the loop reads (grad_norm, nonfinite, real_tokens). Pure and top level."""

import jax
import jax.numpy as jnp
import optax
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from bertjax.training import optim


def train_step(state, batch: dict, dropout_key, *, loss_fn, tx, grad_accum_steps: int, mean_metrics: tuple = (),
               loss_and_grad_fn=None, mask_keys: tuple = ("input_mask",), batch_warmup=None):
    """One optimizer step over the global batch (in grad_accum_steps microbatches).

    state: a TrainState. loss_fn(params, batch, dropout_rng) -> (loss, metric sums); sums add up over
    microbatches and steps, except the mean_metrics, which loss_fn returns as means (they come back
    as the microbatches' mean). loss_and_grad_fn(params, batch, dropout_rng) -> ((loss, sums), grads),
    where given, replaces jax.value_and_grad(loss_fn) (contrastive GradCache computes its gradient its
    own way). batch carries mask_keys (1 at real tokens), for the tokens/s the loop reports. Returns
    the new state and the step's metric sums (added up over a logging interval on the device).

    batch_warmup: a training.batch_warmup.BatchWarmup; the step then uses the first k(state.step) of the
    batch's grad_accum_steps microbatches (the host filled only those).

    With state.fp8 (model.matmul_dtype=fp8) loss_fn's first argument is {"params", OVERWRITE_WITH_GRADIENT}
    (models/fp8.variables makes it net.apply's variables), and the "gradient" of the second is the fp8
    scaling state's new value, as flax's convention has it: kept, never given to the optimizer."""
    rng = jax.random.fold_in(dropout_key, state.step)  # a new dropout mask each step, reproducibly
    grad_fn = loss_and_grad_fn or jax.value_and_grad(loss_fn, has_aux=True)
    used = None if batch_warmup is None else batch_warmup.microbatches_on_device(state.step)
    wrt = state.params if state.fp8 is None else {"params": state.params, OVERWRITE_WITH_GRADIENT: state.fp8}
    (loss, sums), grads = optim.accumulate_gradients(grad_fn, wrt, batch, grad_accum_steps, rng, used)
    fp8 = state.fp8
    if fp8 is not None:
        grads, fp8 = grads["params"], grads[OVERWRITE_WITH_GRADIENT]
    # The per-microbatch means come back added up over the microbatches.
    divisor = grad_accum_steps if used is None else used.astype(jnp.float32)
    sums = dict(sums, **{k: sums[k] / divisor for k in mean_metrics})
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums = dict(sums, loss_sum=loss, grad_norm_sum=grad_norm, steps=jnp.float32(1),
                real_tokens=sum(jnp.sum(batch[k]).astype(jnp.float32) for k in mask_keys if k in batch),
                # Counts the steps whose loss or gradient was not finite: the host stops the run.
                nonfinite=jnp.float32(~(jnp.isfinite(loss) & jnp.isfinite(grad_norm))))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, fp8=fp8), sums
