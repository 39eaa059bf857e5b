"""The training library: TrainState, the pure step functions, and the state's layout (Setup).

Shared by the pretraining program (bertjax.train), the benchmark and the tests. Nothing here reads
flags; everything takes the config or explicit arguments. No TensorFlow.
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Iterator, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bertjax.models import bert
from bertjax.training import optim
from bertjax.training import sharding

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
    loss, sums = bert.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
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
    loss, sums = bert.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
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
    bert_config: bert.BertConfig
    net: bert.BertForPreTraining
    tx: optax.GradientTransformation
    schedule: Any
    init_state: Any  # rng -> boxed TrainState
    state_sharding: Any
    abstract_state: Any  # ShapeDtypeStructs carrying the shardings

    @classmethod
    def create(cls, config, mesh, rules, init_key, platform: str | None = None) -> "Setup":
        """platform resolves the model's "auto" fields (default: the backend JAX runs on); the planner
        passes "tpu" to lay out a TPU step from a CPU machine."""
        bert_config = bert.BertConfig.from_dict(config.model, platform=platform)
        net = bert.BertForPreTraining(bert_config)
        tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
        example = bert.dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)

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
                under_rules(functools.partial(train_step, net=self.net, tx=self.tx,
                                               grad_accum_steps=grad_accum_steps), self.rules),
                in_shardings=(self.state_sharding, data_sharding, None),
                out_shardings=(self.state_sharding, None),
                donate_argnums=(0,),
            )
            p_eval_step = jax.jit(under_rules(functools.partial(eval_step, net=self.net), self.rules),
                                  in_shardings=(self.state_sharding.params, data_sharding))
        return p_train_step, p_eval_step


def under_rules(fn, rules):
    """fn, traced with the logical axis rules in force."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with nn.logical_axis_rules(rules):
            return fn(*args, **kwargs)

    return traced


# ----------------------------------------------------------------------------------------------------
# The loop, shared by pretraining and fine-tuning
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Hooks:
    """What a program does around the steps. The loop owns the order and the timing; the hooks own
    what is written where.

    log(step, window, speed): window holds the step functions' metric sums since the last line (on the
      host; "steps", "real_tokens" and "nonfinite" among them), speed the loop's tokens/s, steps/s and
      time left over the timed part of that window (empty when none of it was timed).
    evaluate(state, step): evaluation; its time is kept out of the throughput.
    save(state, step, force): a checkpoint; force at the last step and when stopping.
    should_stop(step): asked after every step (preemption, Ctrl-C); True saves and ends the loop.
    after_step(step, state): right after each step is dispatched (a failed background save, the
      profiler); a hook that waits for the state waits for the step.
    """

    log: Callable[[int, dict, dict], None]
    evaluate: Callable[[Any, int], None] | None = None
    save: Callable[[Any, int, bool], None] | None = None
    should_stop: Callable[[int], bool] | None = None
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
            f"bertjax.data.preview --start_step={first - 1} for pretraining)")


def run_loop(state, step_fn, batches: Iterator, dropout_key, steps: LoopSteps, hooks: Hooks,
             clock: Callable[[], float] = time.perf_counter):
    """Steps start+1..total of step_fn(state, batch, dropout_key) -> (state, sums) over `batches`
    (already on the devices). Returns (state, the step it stopped at on request, or None)."""
    from bertjax.training import writers  # the timer; writers itself imports nothing heavy

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

        stop = hooks.should_stop is not None and hooks.should_stop(step)
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
