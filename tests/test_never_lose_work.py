"""Accidents that used to lose a run: a changed config on resume, two runs on one workdir, Ctrl-C, a
full disk, an unreadable newest checkpoint under bertjax.load / init_from. Each gets one clear line, a
non-zero exit, and every good checkpoint left as it was."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import config_flags, copy_of, run_command, start_command, tiny_config

from bertjax.runs import pretraining
from bertjax.training import checkpoint
from bertjax.training import workdir
from bertjax.training.checkpoint_meta import CheckpointMeta

SMALL = {"data.source": "synthetic", "schedule.warmup_steps": 1, "train.batch_size": 8, "data.max_seq_length": 32,
         "data.max_predictions_per_seq": 5, "model.hidden_size": 64, "model.num_heads": 2,
         "model.intermediate_size": 128, "model.vocab_size": 512, "logging.eval_every": 1000, "logging.log_every": 1}


def train_command(workdir, settings):
    return [sys.executable, "-m", "bertjax.train", "--config=configs/tiny.py", f"--workdir={workdir}",
            *config_flags(settings)]


def run_train(workdir, settings, timeout=240):
    return run_command(train_command(workdir, settings), timeout=timeout)


def start_train(workdir, settings):
    return start_command(train_command(workdir, settings))


def pretrain(workdir, settings):
    """The run `python -m bertjax.train` makes of these settings, in this process."""
    pretraining.pretrain(tiny_config(settings), str(workdir))


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
def test_resume_with_a_changed_config_stops_and_keeps_the_checkpoints(small_run, tmp_path, capsys):
    workdir = copy_of(small_run["workdir"], tmp_path / "run")  # conftest's small run: checkpoints at 4, 8, 12
    settings = dict(small_run["settings"], **{"train.num_steps": 14})
    # The program: one line naming the difference, a non-zero exit.
    changed = run_train(workdir, dict(settings, **{"model.hidden_size": 128}))
    one_error_line(changed, "checkpoint at step 12 has model.hidden_size=64, the config 128", "new workdir",
                   "train.init_from")
    # The run raises the same for any other difference of the model or the optimizer.
    with pytest.raises(checkpoint.CheckpointMismatch, match=re.escape("model.pooler='tanh', the config 'gelu_norm'")):
        pretrain(workdir, dict(settings, **{"model.pooler": "gelu_norm"}))
    with pytest.raises(checkpoint.CheckpointMismatch, match=re.escape("optimizer.name='adamw', the config 'lamb'")):
        pretrain(workdir, dict(settings, **{"optimizer.name": "lamb"}))
    # Nothing was set aside or overwritten, and the run still resumes with its own config.
    assert steps_in(workdir) == [4, 8, 12]
    assert not [p for p in (workdir / "checkpoints").iterdir() if "unreadable" in p.name]
    capsys.readouterr()
    pretrain(workdir, settings)
    out = capsys.readouterr().out
    assert "resumed from step 12" in out
    # Raising train.num_steps stretches the schedule: said in one line, with the learning rate now.
    assert "the learning-rate schedule differs from the checkpoint's (train.num_steps 12 -> 14)" in out, out
    pretrain(workdir, settings)
    assert "nothing to do: the checkpoint of step 14 is already at train.num_steps=14" in capsys.readouterr().out


@pytest.mark.slow
def test_a_second_run_is_refused_then_ctrl_c_saves_the_step_and_exits_130(tmp_path, capsys):
    """A run holds its workdir: a second run on it is refused in one line naming the first. Ctrl-C to the
    first saves its step and exits 130; re-run, it resumes there, metrics.jsonl keeping each step once. (The
    lock a killed run leaves behind is taken over: tests/test_train.py's SIGKILL test.)"""
    run = start_train(tmp_path, dict(SMALL, **{"train.num_steps": 100000, "checkpoint.every_steps": 100000}))
    try:
        step = wait_for_step(run)
        with pytest.raises(workdir.WorkdirInUse, match=f"is in use by process {run.pid} .*choose another workdir"):
            pretrain(tmp_path, dict(SMALL, **{"train.num_steps": 3}))
        assert json.loads((tmp_path / workdir.LOCK_FILE).read_text())["pid"] == run.pid  # the first's, still
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Ctrl-C: saved the checkpoint of step" in out
    saved = steps_in(tmp_path)
    assert len(saved) == 1 and saved[0] >= step
    capsys.readouterr()
    pretrain(tmp_path, dict(SMALL, **{"train.num_steps": saved[0] + 1}))  # the same command, re-run
    assert f"resumed from step {saved[0]}" in capsys.readouterr().out
    assert not (tmp_path / workdir.LOCK_FILE).exists()
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
        result = run_train(small_disk / "run", dict(SMALL, **{"train.num_steps": 50, "checkpoint.every_steps": 2}))
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
def test_load_and_init_from_fall_back_past_an_unreadable_newest_checkpoint(small_run, tmp_path, capsys):
    broken = copy_of(small_run["workdir"], tmp_path / "broken")  # conftest's small run: checkpoints at 4, 8, 12
    for f in (broken / "checkpoints" / "12" / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(b"broken")
    params, meta = checkpoint.restore_params(str(broken))
    assert meta.step == 8
    capsys.readouterr()
    pretrain(tmp_path / "other", dict(small_run["settings"], **{"train.num_steps": 2, "train.init_from": str(broken)}))
    out = capsys.readouterr().out
    assert "step 12" in out and "unreadable" in out and f"parameters from {broken}" in out


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
