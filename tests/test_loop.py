"""The training loop library, in-process: when it logs, evaluates, saves and stops; that a run stopped
and resumed takes the uninterrupted run's steps; that it refuses to go on (or save) past a NaN; the
profiler hook."""

import pathlib

import jax
import jax.numpy as jnp
import pytest

from bertjax.training import sharding
from bertjax.training import loop
from bertjax.training import pretraining_step
from bertjax.training import state as train_state
from bertjax.data import synthetic
from test_train import small_config  # tests/ is on sys.path under pytest

# The loop on a mesh of two devices: the mesh session (tests/mesh_session.py).
pytestmark = pytest.mark.mesh


@pytest.fixture(scope="module")
def setup():
    config = small_config()
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:2])
    rules = sharding.logical_rules(config.logical_axis_rules)
    init_key, dropout_key = train_state.root_keys(0)
    s = pretraining_step.setup(config, mesh, rules, init_key)
    data_sharding = sharding.batch_sharding(mesh, rules)
    step_fn, _ = s.compile_steps(data_sharding, 1)
    return dict(setup=s, step_fn=step_fn, init_key=init_key, dropout_key=dropout_key, data_sharding=data_sharding,
                mesh=mesh)


def batches(ctx, start):
    step = start
    while True:
        host = synthetic.synthetic_batch(step, batch_size=16, max_seq_length=32, max_predictions_per_seq=5,
                                         vocab_size=96)
        yield sharding.global_batch({k: host[k] for k in pretraining_step.BATCH_KEYS}, ctx["data_sharding"])
        step += 1


class Recorder:
    """Hooks that write down what the loop asked for."""

    def __init__(self, stop_at=None):
        self.logged, self.evaluated, self.saved, self.after = [], [], [], []
        self.losses = {}
        self.stop_at = stop_at

    def hooks(self):
        def log(step, window, speed):
            self.logged.append((step, int(window["steps"])))
            self.losses[step] = float(window["loss_sum"])

        return loop.Hooks(log=log, evaluate=lambda state, step: self.evaluated.append(step),
                             save=lambda state, step, force: self.saved.append((step, force)),
                             should_stop=lambda step: step == self.stop_at,
                             after_step=[lambda step, state: self.after.append(step)])


def run(ctx, start, total, recorder, state=None, **every):
    steps = loop.LoopSteps(start=start, total=total, **{"log_every": 1, "eval_every": 100, "save_every": 100,
                                                          **every})
    state = state if state is not None else ctx["setup"].init(ctx["init_key"])
    with jax.set_mesh(ctx["mesh"]):
        return loop.run_loop(state, ctx["step_fn"], batches(ctx, start), ctx["dropout_key"], steps,
                                recorder.hooks())


def test_the_loop_logs_evaluates_and_saves_on_schedule(setup):
    rec = Recorder()
    state, stopped = run(setup, 0, 7, rec, log_every=3, eval_every=2, save_every=4)
    assert stopped is None and int(state.step) == 7
    assert rec.logged == [(3, 3), (6, 3), (7, 1)]  # each line sums the steps since the previous one
    assert rec.evaluated == [2, 4, 6, 7]
    assert rec.saved == [(4, False), (7, True)]  # the last step is always saved, forced
    assert rec.after == list(range(1, 8))


def test_a_stopped_and_resumed_loop_takes_the_uninterrupted_steps(setup):
    whole = Recorder()
    run(setup, 0, 6, whole)
    first = Recorder(stop_at=3)
    state, stopped = run(setup, 0, 6, first)
    assert stopped == 3 and first.saved == [(3, True)] and int(state.step) == 3
    rest = Recorder()
    _, stopped = run(setup, 3, 6, rest, state=state)
    assert stopped is None and sorted(rest.losses) == [4, 5, 6]
    assert {**first.losses, **rest.losses} == whole.losses


def test_a_nan_stops_the_loop_before_it_logs_or_saves(setup):
    def nan_after_two(state, batch, key):
        state, sums = setup["step_fn"](state, batch, key)
        return state, dict(sums, nonfinite=jnp.float32(state.step > 2))

    rec = Recorder()
    steps = loop.LoopSteps(start=0, total=6, log_every=5, eval_every=100, save_every=4)
    with jax.set_mesh(setup["mesh"]), pytest.raises(FloatingPointError, match="NaN or inf between steps 1 and 4"):
        loop.run_loop(setup["setup"].init(setup["init_key"]), nan_after_two, batches(setup, 0),
                         setup["dropout_key"], steps, rec.hooks())
    assert rec.saved == [] and rec.logged == []


def test_the_profiler_hook_writes_a_trace(setup, tmp_path):
    rec = Recorder()
    hooks = rec.hooks()
    hooks.after_step = [loop.Profiler(str(tmp_path / "profile"), first=2, count=2)]
    steps = loop.LoopSteps(start=0, total=4, log_every=4, eval_every=100, save_every=100)
    with jax.set_mesh(setup["mesh"]):
        loop.run_loop(setup["setup"].init(setup["init_key"]), setup["step_fn"], batches(setup, 0),
                         setup["dropout_key"], steps, hooks)
    assert list(pathlib.Path(tmp_path / "profile").rglob("*.xplane.pb"))
    with pytest.raises(ValueError, match="profile_first_step=1 must be 2 or more"):
        loop.Profiler(str(tmp_path), first=1, count=2)


def test_the_loop_holds_the_signal_handlers_only_while_it_runs(setup):
    """SIGTERM during the loop saves and stops it; before and after, the program's own handlers stand."""
    import signal

    from bertjax.training.preemption import Preemption

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    preemption = Preemption()
    rec = Recorder()
    hooks = rec.hooks()
    hooks.preemption = preemption
    hooks.after_step = [lambda step, state: step == 2 and signal.raise_signal(signal.SIGTERM)]
    steps = loop.LoopSteps(start=0, total=6, log_every=1, eval_every=100, save_every=100)
    with jax.set_mesh(setup["mesh"]):
        state, stopped = loop.run_loop(setup["setup"].init(setup["init_key"]), setup["step_fn"], batches(setup, 0),
                                       setup["dropout_key"], steps, hooks)
    assert stopped == 2 and rec.saved == [(2, True)] and preemption.exit_code == 0 and preemption.name == "SIGTERM"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
