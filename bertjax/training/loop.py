"""The loop, shared by pretraining and fine-tuning: steps over device batches, with hooks for logging,
evaluation, checkpoints, stopping and profiling. The loop owns the order and the timing."""

import contextlib
import dataclasses
import functools
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp

from bertjax.training import writers


@dataclasses.dataclass
class Hooks:
    """What a program does around the steps. The loop owns the order and the timing; the hooks own
    what is written where.

    log(step, window, speed): window holds the step functions' metric sums since the last line (on the
      host; "steps", "real_tokens" and "nonfinite" among them), speed the loop's tokens/s, steps/s and
      time left over the timed part of that window (empty when none of it was timed).
    evaluate(state, step): evaluation; its time is kept out of the throughput.
    save(state, step, force): a checkpoint; force at the last step and when stopping.
    should_stop(step): asked after every step; True saves and ends the loop.
    preemption: a preemption.Preemption (any context manager with should_stop(step)): entered for the
      loop's duration, so that its signal handlers are in place exactly while steps run, and asked
      after every step on every process, as should_stop is.
    after_step(step, state): right after each step is dispatched (a failed background save, the
      profiler); a hook that waits for the state waits for the step.
    """

    log: Callable[[int, dict, dict], None]
    evaluate: Callable[[Any, int], None] | None = None
    save: Callable[[Any, int, bool], None] | None = None
    should_stop: Callable[[int], bool] | None = None
    preemption: Any = None
    after_step: Sequence[Callable[[int, Any], None]] = ()


@dataclasses.dataclass(frozen=True)
class LoopSteps:
    """Which steps run and when the loop logs, evaluates and saves (every N steps, and at the last)."""

    start: int  # steps already done (a resumed run's checkpoint step)
    total: int
    log_every: int
    eval_every: int
    save_every: int


def check_finite(window: dict, first: int, last: int) -> None:
    if float(window["nonfinite"]) > 0:
        raise FloatingPointError(
            f"the loss or the gradients became NaN or inf between steps {first} and {last}: resume from the "
            f"last checkpoint with a lower optimizer.learning_rate, or inspect those batches (python -m "
            f"bertjax.preview --start_step={first - 1} for pretraining)")


def run_loop(state, step_fn, batches: Iterator, dropout_key, steps: LoopSteps, hooks: Hooks,
             clock: Callable[[], float] = time.perf_counter):
    """Steps start+1..total of step_fn(state, batch, dropout_key) -> (state, sums) over `batches`
    (already on the devices). Returns (state, the step it stopped at on request, or None)."""
    with hooks.preemption if hooks.preemption is not None else contextlib.nullcontext():
        return _run_steps(state, step_fn, batches, dropout_key, steps, hooks, clock)


def _stop_requested(hooks: Hooks, step: int) -> bool:
    # Both are asked every step: with several processes each one's answer is a collective.
    asked = [ask(step) for ask in (hooks.should_stop, hooks.preemption and hooks.preemption.should_stop) if ask]
    return any(asked)


def _run_steps(state, step_fn, batches, dropout_key, steps: LoopSteps, hooks: Hooks, clock):
    add_sums = jax.jit(functools.partial(jax.tree_util.tree_map, jnp.add))  # one dispatch, not one per metric
    timer = writers.StepTimer(steps.total, start_step=steps.start, clock=clock)
    window, window_start = None, steps.start
    untimed_tokens = 0.0  # tokens of the window processed outside the timed span (compiling, evaluating)

    def pause_timer(step):
        nonlocal untimed_tokens
        untimed_tokens = float(jax.device_get(window["real_tokens"])) if window is not None else 0.0
        timer.restart(step)

    for step in range(steps.start + 1, steps.total + 1):
        state, sums = step_fn(state, next(batches), dropout_key)
        for hook in hooks.after_step:
            hook(step, state)
        window = sums if window is None else add_sums(window, sums)
        if step == steps.start + 1:
            pause_timer(step)  # the first step includes compilation
        last = step == steps.total

        if step % steps.log_every == 0 or last:
            window = jax.device_get(window)
            check_finite(window, window_start + 1, step)
            timed_tokens = float(window["real_tokens"]) - untimed_tokens
            speed = timer.update(step, timed_tokens) if step > timer.last_step else {}
            untimed_tokens = 0.0
            hooks.log(step, window, speed)
            window, window_start = None, step

        if hooks.evaluate is not None and (step % steps.eval_every == 0 or last):
            hooks.evaluate(state, step)
            pause_timer(step)

        stop = _stop_requested(hooks, step)
        if hooks.save is not None and (step % steps.save_every == 0 or last or stop):
            if window is not None:  # never save a state whose last steps were not checked
                window = jax.device_get(window)
                check_finite(window, window_start + 1, step)
            hooks.save(state, step, stop or last)
        if stop:
            return state, step
    return state, None


class Profiler:
    """A jax.profiler trace of steps first..first+count-1 into directory (TensorBoard's profile tab and
    Perfetto read it); an after_step hook. first >= 2: the first step is mostly compilation."""

    def __init__(self, directory: str, first: int, count: int):
        if first < 2 or count < 1:
            raise ValueError(f"logging.profile_first_step={first} must be 2 or more (the first step compiles), and "
                             f"logging.profile_steps={count} at least 1; 0 turns profiling off")
        self.directory, self.first, self.last = directory, first, first + count - 1
        self.active = False

    def __call__(self, step: int, state) -> None:
        if step == self.first - 1:
            jax.block_until_ready(state)  # the trace starts with the steps before it done
            jax.profiler.start_trace(self.directory)
            self.active = True
        elif self.active and step == self.last:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.active = False
