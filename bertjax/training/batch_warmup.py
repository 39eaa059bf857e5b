"""Batch-size warmup (ModernBERT's): the global batch grows from train.batch_warmup_start sequences to
train.batch_size over the first train.batch_warmup_steps steps, in whole microbatches.

The microbatch (train.batch_size / train.grad_accum_steps sequences) is fixed, so every shape the devices
see is static; what grows is the number of microbatches a step accumulates:

    k(N) = k0 + floor((K - k0) * min(N, W) / W)      K = train.grad_accum_steps, k0 = start / microbatch

a staircase of K - k0 + 1 sizes that reaches K at step W. Step N (0-based, as the schedule counts) takes
microbatches [P(N), P(N) + k(N)) of the host's stream, where P(N) = k(0) + ... + k(N-1), computed stage
by stage (at most K of them): the batch at step N stays a pure function of (corpus, config, seed, N), and a
resumed run starts at the right example with nothing stored. The learning-rate schedule still counts
steps, whatever their size.

One compiled step serves every size: the host fills a buffer of K microbatches (the unused ones zeros) and
the step loops over the first k(N) of them, k(N) computed on the device from the step number
(optim.accumulate_gradients' `count`). A program per size would compile K - k0 + 1 times and hold them all.
"""

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BatchWarmup:
    """k(N) microbatches at step N, from start_microbatches to max_microbatches over `steps` steps."""

    microbatch: int  # global sequences per microbatch: train.batch_size / train.grad_accum_steps
    start_microbatches: int  # k0
    max_microbatches: int  # K, train.grad_accum_steps
    steps: int  # W

    @classmethod
    def from_config(cls, train) -> "BatchWarmup | None":
        """The train section's warmup (checked already by runs/config_checks.py); None when it is off."""
        start = train.get("batch_warmup_start", 0)
        if not start:
            return None
        microbatch = train.batch_size // train.grad_accum_steps
        return cls(microbatch, start // microbatch, train.grad_accum_steps, train.batch_warmup_steps)

    def microbatches(self, step: int) -> int:
        """k(step), on the host."""
        grow = self.max_microbatches - self.start_microbatches
        return self.start_microbatches + grow * min(max(step, 0), self.steps) // self.steps

    def microbatches_on_device(self, step):
        """k(step) as an int32 array, for a step that reads it from its traced state.step."""
        grow = self.max_microbatches - self.start_microbatches
        step = jnp.clip(jnp.asarray(step, jnp.int32), 0, self.steps)
        return (self.start_microbatches + grow * step // self.steps).astype(jnp.int32)

    def batch_size(self, step: int) -> int:
        """Global sequences of step `step`."""
        return self.microbatch * self.microbatches(step)

    def position(self, step: int) -> int:
        """P(step): microbatches the steps before `step` took. Stage j (k = k0 + j) covers the steps N with
        floor((K - k0) N / W) = j, i.e. [ceil(j W / (K - k0)), ceil((j + 1) W / (K - k0)))."""
        grow, w = self.max_microbatches - self.start_microbatches, self.steps
        total = 0
        for j in range(grow):
            begin, end = -(-j * w // grow), -(-(j + 1) * w // grow)
            total += (self.start_microbatches + j) * max(0, min(end, step) - begin)
        return total + self.max_microbatches * max(0, step - w)


def host_batch(microbatches: list[dict], max_microbatches: int) -> dict:
    """k host microbatches [m, ...] -> one host batch [K m, ...] laid out for optim.accumulate_gradients'
    strided split: microbatch i at rows i, i + K, i + 2K, ... (every device keeps its share of each
    microbatch); the rows of microbatches k..K-1 are zeros, which the step does not read."""
    k = len(microbatches)
    out = {}
    for key in microbatches[0]:
        parts = [np.asarray(mb[key]) for mb in microbatches]
        buffer = np.zeros((parts[0].shape[0], max_microbatches) + parts[0].shape[1:], parts[0].dtype)
        buffer[:, :k] = np.stack(parts, axis=1)
        out[key] = buffer.reshape((-1,) + parts[0].shape[1:])
    return out


def warmup_batches(microbatches, warmup: BatchWarmup, start_step: int):
    """Host batches from step start_step on, each of k(step) microbatches of `microbatches` (an iterator
    that starts at microbatch P(start_step) of the stream), in host_batch's layout."""
    step = start_step
    while True:
        yield host_batch([next(microbatches) for _ in range(warmup.microbatches(step))], warmup.max_microbatches)
        step += 1


def batches_by_step(stream, batch_size: int, warmup: BatchWarmup | None, start_step: int):
    """(number of the batch's first example in the stream, batch) of each step from start_step on, the
    examples in stream order (what bertjax.preview shows): stream.dataset(batch, start_step) batched by
    train.batch_size, or, with a warmup, the k(N) microbatches of each step put end to end."""
    if warmup is None:
        for step, batch in enumerate(stream.dataset(batch_size, start_step=start_step).as_numpy_iterator(),
                                     start_step):
            yield step * batch_size, batch
        return
    microbatches = stream.dataset(warmup.microbatch, start_step=warmup.position(start_step)).as_numpy_iterator()
    for step in itertools.count(start_step):
        parts = [next(microbatches) for _ in range(warmup.microbatches(step))]
        yield warmup.position(step) * warmup.microbatch, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
