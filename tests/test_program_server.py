"""tests/program_server.py: a command run in a fork of the server behaves as the same command in a fresh
interpreter (what the tests that start programs rely on)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO, program_env, run_command, start_command

# What a command sees of its process: arguments, directory, environment, temporary directory, JAX's options
# and devices (XLA reads its flags when JAX starts its backend, which the server never does).
PROBE = """
import json, os, sys, tempfile
import jax
print(json.dumps(dict(argv=sys.argv, cwd=os.getcwd(), path0=sys.path[0], marker=os.environ.get("PROBE_MARKER"),
                      tmp=tempfile.gettempdir(), cache=jax.config.jax_compilation_cache_dir, devices=jax.device_count(),
                      pid=os.getpid())))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def fresh(argv, env, cwd):
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_a_forked_command_sees_what_a_fresh_one_sees(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = program_env(PROBE_MARKER="yes", TMPDIR=str(tmp_path / "tmp"), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "c"),
                      XLA_FLAGS="--xla_force_host_platform_device_count=3")
    argv = [sys.executable, "-c", PROBE, "3"]
    forked, alone = run_command(argv, env=env, cwd=tmp_path), fresh(argv, env, tmp_path)
    assert (forked.returncode, forked.stderr) == (alone.returncode, alone.stderr) == (3, "to stderr\n")
    seen, expected = json.loads(forked.stdout), json.loads(alone.stdout)
    assert seen.pop("pid") != os.getpid() and expected.pop("pid")
    assert seen == expected and seen["marker"] == "yes" and seen["tmp"] == str(tmp_path / "tmp")
    assert seen["cache"] == str(tmp_path / "c") and seen["devices"] == 3


def test_a_module_runs_as_main_with_its_own_arguments(tmp_path):
    result = run_command([sys.executable, "-m", "bertjax.export", f"--from={tmp_path}", f"--to={tmp_path / 'x'}",
                          "--format=onnx"], cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["export.py: error: --format=onnx: choose one of hf, savedmodel, params, "
                                          "sentence-transformers"]


def test_an_uncaught_exception_and_a_timeout_end_as_in_a_fresh_interpreter(tmp_path):
    failed = run_command([sys.executable, "-c", "raise ValueError('no')"], cwd=tmp_path)
    assert failed.returncode == 1 and failed.stderr.rstrip().endswith("ValueError: no")
    assert "Traceback (most recent call last)" in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path, timeout=1)


def test_a_started_command_can_be_signalled_while_another_runs(tmp_path):
    waiting = start_command([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            cwd=tmp_path)
    assert run_command([sys.executable, "-c", "print('beside it')"], cwd=tmp_path).stdout == "beside it\n"
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGTERM)
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == -signal.SIGTERM and out == "up\n"


def test_a_command_that_changes_an_import_time_variable_gets_a_fresh_interpreter(tmp_path):
    env = program_env(TF_CPP_MIN_LOG_LEVEL="0")
    code = "import sys; print('tensorflow' in sys.modules)"
    assert run_command([sys.executable, "-c", code], env=env, cwd=REPO).stdout == "False\n"
    assert run_command([sys.executable, "-c", code], cwd=REPO).stdout == "True\n"  # the server's own imports
