"""The first hour, as a newcomer meets it: a plain training run, bertjax.load and an export print nothing
at warning level or above that is not about the user's run (libtpu's TPU probe, TensorFlow's native
start-up, Orbax's per-item warnings are silenced in bertjax/environment.py and bertjax/text/tf_cpu.py),
and the common mistakes fail fast, in one line, leaving nothing behind."""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
from conftest import FAST_COMPILE_FLAGS  # quick compiles; one device, as a user's machine has

REPO = pathlib.Path(__file__).resolve().parents[1]
# As a user's shell has it: none of the variables conftest sets to keep the tests quiet and on the CPU.
USER_ENV = {k: v for k, v in os.environ.items()
            if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES") and not k.startswith("TPU_")}
USER_ENV.update(PYTHONPATH=str(REPO), XLA_FLAGS=FAST_COMPILE_FLAGS)
# Levels as the libraries print them: absl/glog "W0000"/"E0000", Python's "WARNING:"/"ERROR:", "Traceback".
LOUD = re.compile(r"^(?:[WEF]\d{4} |WARNING|ERROR|Traceback|.*\bwarn(?:ing)?s?\b)", re.I | re.M)


def run(args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=USER_ENV, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_plain_run_then_load_and_export_say_nothing_loud(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"The river runs north past mill {i}.\nA bridge crosses it at town {i % 7}."
                                  for i in range(40)) + "\n")
    workdir = tmp_path / "run"
    train = run(["-m", "bertjax.train", "--config=configs/tiny.py", f"--workdir={workdir}",  # from tmp_path
                 "--config.data.source=text", f"--config.data.input_pattern={corpus}", "--config.data.vocab_size=64",
                 "--config.model.vocab_size=128", "--config.data.max_seq_length=32",
                 "--config.data.max_predictions_per_seq=5", "--config.train.batch_size=4",
                 "--config.train.num_steps=2", "--config.logging.eval_batches=1", "--config.data.eval_fraction=0.2"],
                cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    assert not LOUD.findall(train.stderr), train.stderr
    assert "warming up over 1 step(s) instead" in train.stdout  # tiny's 60-step warmup, fitted in one line
    assert f"load the model with bertjax.load('{workdir}')" in train.stdout
    load = run(["-c", f"import bertjax; print(bertjax.load({str(workdir)!r}).fill_mask('the [MASK] runs.'))"],
               cwd=tmp_path)
    assert load.returncode == 0 and not load.stderr.strip(), load.stderr
    export = run(["-m", "bertjax.export", f"--from={workdir}", f"--to={tmp_path / 'hf'}"], cwd=tmp_path)
    assert export.returncode == 0 and not export.stderr.strip(), export.stderr


@pytest.mark.parametrize("flags,message", [
    (["--config.model.dtype=float16x"], "model.dtype='float16x' is not a dtype"),
    (["--config.data.source=text", "--config.data.input_pattern=/nowhere/*.txt"],
     "no files match data.input_pattern='/nowhere/*.txt'"),
    (["--config.model.attention_impl=flash"], "model.attention_impl='flash': choose one of"),
    (["--config.train.init_from=/nowhere"], "train.init_from=/nowhere does not exist"),
])
def test_a_mistake_is_one_line_within_seconds_and_leaves_nothing(tmp_path, flags, message):
    workdir = tmp_path / "run"
    began = time.perf_counter()
    result = run(["-m", "bertjax.train", "--config=configs/tiny.py", f"--workdir={workdir}", *flags], cwd=REPO)
    seconds = time.perf_counter() - began
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert not workdir.exists()
    assert seconds < 20, seconds  # the checks come before JAX and the model (5 s on an idle machine)


def test_dry_run_prints_the_config_it_would_use(tmp_path):
    result = run(["-m", "bertjax.train", "--config=configs/tiny.py", "--dry_run", "--config.train.num_steps=20"],
                 cwd=tmp_path)  # configs/ found from anywhere
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "train.num_steps=20" in lines and "schedule.warmup_steps=2" in lines and "model.hidden_size=128" in lines
    assert lines[-1].startswith("--dry_run: the config is valid")
    typo = run(["-m", "bertjax.train", "--config=configs/tiny.py", "--config.train.nm_steps=3"], cwd=tmp_path)
    assert "Did you mean \"num_steps\"" in typo.stderr and "--dry_run prints every key" in typo.stderr
