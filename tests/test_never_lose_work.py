"""Accidents that used to lose a run: a changed config on resume, two runs on one workdir, Ctrl-C, a
full disk, an unreadable newest checkpoint under bertjax.load / init_from. Each gets one clear line, a
non-zero exit, and every good checkpoint left as it was."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bertjax.training import checkpoint
from bertjax.training import workdir
from bertjax.training.checkpoint_meta import CheckpointMeta

REPO = pathlib.Path(__file__).resolve().parents[1]
SMALL = ["--config=configs/tiny.py", "--config.data.source=synthetic", "--config.schedule.warmup_steps=1",
         "--config.train.batch_size=8", "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
         "--config.model.hidden_size=64", "--config.model.num_heads=2", "--config.model.intermediate_size=128",
         "--config.model.vocab_size=512", "--config.logging.eval_every=1000", "--config.logging.log_every=1"]


def train_command(workdir, *overrides):
    return [sys.executable, "-m", "bertjax.train", f"--workdir={workdir}", *SMALL, *overrides]


def run_train(workdir, *overrides, timeout=240):
    return subprocess.run(train_command(workdir, *overrides), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start_train(workdir, *overrides):
    return subprocess.Popen(train_command(workdir, *overrides), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_step(process, timeout=180):
    """Read the run's console until it has logged a training step."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if line.startswith("step "):
            return int(line.split()[1])
        if not line and process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.stderr.read()}")
    raise AssertionError("no training step was logged in time")


def one_error_line(result, *fragments):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def steps_in(workdir):
    return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_resume_with_a_changed_config_stops_and_keeps_the_checkpoints(tmp_path):
    done = run_train(tmp_path, "--config.train.num_steps=4", "--config.checkpoint.every_steps=2")
    assert done.returncode == 0, done.stderr
    assert steps_in(tmp_path) == [2, 4]
    assert not (tmp_path / workdir.LOCK_FILE).exists()  # a run that ended leaves no lock
    changed = run_train(tmp_path, "--config.train.num_steps=6", "--config.model.hidden_size=128")
    one_error_line(changed, "checkpoint at step 4 has model.hidden_size=64, the config 128", "new workdir",
                   "train.init_from")
    other_pooler = run_train(tmp_path, "--config.train.num_steps=6", "--config.model.pooler=gelu_norm")
    one_error_line(other_pooler, "model.pooler='tanh', the config 'gelu_norm'")
    other_optimizer = run_train(tmp_path, "--config.train.num_steps=6", "--config.optimizer.name=lamb")
    one_error_line(other_optimizer, "optimizer.name='adamw', the config 'lamb'")
    # Nothing was set aside or overwritten, and the run still resumes with its own config.
    assert steps_in(tmp_path) == [2, 4]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if "unreadable" in p.name]
    resumed = run_train(tmp_path, "--config.train.num_steps=6", "--config.checkpoint.every_steps=2")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 4" in resumed.stdout
    # Raising train.num_steps stretches the schedule: said in one line, with the learning rate now.
    assert "the learning-rate schedule differs from the checkpoint's (train.num_steps 4 -> 6)" in resumed.stdout
    again = run_train(tmp_path, "--config.train.num_steps=6", "--config.checkpoint.every_steps=2")
    assert again.returncode == 0 and "nothing to do: the checkpoint of step 6 is already at train.num_steps=6" in (
        again.stdout), again.stdout


@pytest.mark.slow
def test_a_second_run_on_the_workdir_is_refused_and_a_stale_lock_taken_over(tmp_path):
    first = start_train(tmp_path, "--config.train.num_steps=100000", "--config.checkpoint.every_steps=100000")
    try:
        wait_for_step(first)
        second = run_train(tmp_path, "--config.train.num_steps=3")
        one_error_line(second, f"is in use by process {first.pid}", "choose another workdir")
    finally:
        first.kill()  # SIGKILL: the run leaves its lock file behind
        first.wait()
    assert json.loads((tmp_path / workdir.LOCK_FILE).read_text())["pid"] == first.pid
    third = run_train(tmp_path, "--config.train.num_steps=2", "--config.checkpoint.every_steps=2")
    assert third.returncode == 0, third.stderr


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_exits_130(tmp_path):
    run = start_train(tmp_path, "--config.train.num_steps=100000", "--config.checkpoint.every_steps=100000")
    try:
        step = wait_for_step(run)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Ctrl-C: saved the checkpoint of step" in out
    saved = steps_in(tmp_path)
    assert len(saved) == 1 and saved[0] >= step
    resumed = run_train(tmp_path, f"--config.train.num_steps={saved[0] + 1}")
    assert resumed.returncode == 0 and f"resumed from step {saved[0]}" in resumed.stdout, resumed.stderr
    # metrics.jsonl logs each step once, and says where the run resumed.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "split" not in r]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == saved[0] + 1
    assert [r["step"] for r in records if "resumed_from" in r] == [saved[0] + 1]
    assert [r["resumed_from"] for r in records if "resumed_from" in r] == [saved[0]]


def test_a_failed_background_save_becomes_one_line_and_its_partial_files_go(tmp_path, monkeypatch):
    ckpt = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=3, async_save=True,
                                   bytes_per_checkpoint=3 * 2**30)
    partial = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-123"
    partial.mkdir(parents=True)

    def no_space():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.manager, "check_for_errors", no_space)
    with pytest.raises(checkpoint.SaveFailed) as failure:
        ckpt.check_for_errors()
    message = str(failure.value)
    assert "no space left on device" in message and "about 3.00 GiB" in message
    assert "no checkpoint was completed" in message and "partial files removed" in message
    assert not partial.exists()
    ckpt.close()


def _can_mount_tmpfs(path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line(tmp_path):
    small_disk = tmp_path / "disk"
    small_disk.mkdir()
    if not _can_mount_tmpfs(small_disk):
        pytest.skip("needs root to mount a 1 MB tmpfs as the full disk")
    try:
        result = run_train(small_disk / "run", "--config.train.num_steps=50", "--config.checkpoint.every_steps=2")
        one_error_line(result, "saving a checkpoint to", "failed (no space left on device)",
                       "a checkpoint needs about", "free space or choose another workdir")
        # No partial save is left for the next run (a writer thread of the failed save may still be
        # finishing as the run exits; the next start removes what it left).
        checkpoint.Checkpointer(str(small_disk / "run"), every_steps=2, keep=1, async_save=False).close()
        leftovers = [p.name for p in (small_disk / "run" / "checkpoints").iterdir() if "tmp" in p.name]
        assert leftovers == []
        # It stopped at the failed save, not 48 steps later.
        logged = [json.loads(line)["step"] for line in (small_disk / "run" / "metrics.jsonl").read_text().splitlines()]
        assert max(logged) <= 4
    finally:
        subprocess.run(["umount", str(small_disk)], capture_output=True)


@pytest.mark.slow
def test_load_and_init_from_fall_back_past_an_unreadable_newest_checkpoint(tmp_path):
    done = run_train(tmp_path, "--config.train.num_steps=4", "--config.checkpoint.every_steps=2")
    assert done.returncode == 0, done.stderr
    for f in (tmp_path / "checkpoints" / "4" / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(b"broken")
    params, meta = checkpoint.restore_params(str(tmp_path))
    assert meta.step == 2
    other = tmp_path / "other"
    init = run_train(other, "--config.train.num_steps=1", f"--config.train.init_from={tmp_path}")
    assert init.returncode == 0, init.stderr
    assert "step 4" in init.stdout and "unreadable" in init.stdout


def test_a_checkpoint_of_other_shapes_is_a_mismatch_and_stays_where_it_is(tmp_path):
    """Below the metadata check: a readable checkpoint whose arrays differ from the config's is a config
    mismatch naming the arrays, never a reason to set checkpoints aside and start over."""
    import jax
    import jax.numpy as jnp
    import optax

    params = {"bert": {"dense": {"kernel": jnp.zeros((4, 8))}}}
    tx = optax.adam(1e-3)
    saver = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=3, async_save=False)
    for step in (2, 4):
        saver.save(step, params, tx.init(params), CheckpointMeta(step, {}))
    saver.wait()
    saver.close()

    other = {"bert": {"dense": {"kernel": jnp.zeros((4, 16))}, "pooler_norm": {"scale": jnp.ones(4)}}}
    abstract = lambda tree: jax.tree_util.tree_map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
        tree)
    reader = checkpoint.Checkpointer(str(tmp_path), every_steps=1, keep=3, async_save=False)
    with pytest.raises(checkpoint.CheckpointMismatch) as raised:
        reader.restore_latest(abstract(other), abstract(tx.init(other)))
    message = str(raised.value)
    assert "step 4" in message and "bert/pooler_norm/scale is not in the checkpoint" in message
    assert "bert/dense/kernel is (4, 8) in the checkpoint, (4, 16) in the config" in message
    assert steps_in(tmp_path) == [2, 4]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if "unreadable" in p.name]
    # The same checkpoint under its own shapes restores: the check compares named tuples and dicts alike.
    restored = reader.restore_latest(abstract(params), abstract(tx.init(params)))
    assert restored.step == 4
    reader.close()


def test_a_run_that_never_started_leaves_nothing_behind(tmp_path):
    """A refused start (here: a teacher that is not there) leaves neither the workdir it would have made nor
    a lock; a workdir that was there keeps everything but the lock."""
    from bertjax.runs import general_distillation
    from configs.distill import tiny

    config = tiny.get_config()
    config.distill.teacher = str(tmp_path / "no-teacher")
    fresh = tmp_path / "student"
    with pytest.raises(FileNotFoundError, match="distill.teacher=.*does not exist"):
        general_distillation.distill(config, str(fresh))
    assert not fresh.exists()
    kept = tmp_path / "kept"
    (kept / "notes").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        general_distillation.distill(config, str(kept))
    assert sorted(p.name for p in kept.iterdir()) == ["notes"]


def test_prune_on_a_workdir_in_use_is_refused(tmp_path):
    """Pruning holds the workdir's lock as every run does: a second run there is one line, nothing touched."""
    from bertjax.runs import prune_and_recover
    from configs.finetune import classification

    (tmp_path / "train.jsonl").write_text('{"text": "a", "label": "x"}\n')
    config = classification.get_config()
    config.data.update(train=str(tmp_path / "train.jsonl"), validation=str(tmp_path / "train.jsonl"))
    config.train.init_from = str(tmp_path / "finetuned")
    (tmp_path / "finetuned").mkdir()  # there (the checks before the run look), never read: the lock refuses first
    config.prune.heads = 1
    busy = tmp_path / "busy"
    with workdir.WorkdirLock(str(busy)):
        with pytest.raises(workdir.WorkdirInUse, match=f"is in use by process {os.getpid()}"):
            prune_and_recover.prune(config, str(busy))
    assert not (busy / workdir.LOCK_FILE).exists()  # the lock went with its holder
