"""Two processes on this machine as one JAX job (launch/local.py --cpu): training, writing once,
checkpointing, preemption and an exact resume.

Three launches of the same training command, which differ only in the workdir:
  A  runs 16 steps uninterrupted;
  B  has its process 1 sent SIGTERM (as one preempted VM of a pod would be) once it has logged step 5,
     past its first regular checkpoint: both processes agree on a step, save it and exit 0; re-running the
     command resumes from that latest checkpoint and finishes.
B's metrics.jsonl must then hold every step once, with the losses of A, bit for bit: a stopped and
resumed run is the uninterrupted run.

The launches share a JAX compilation cache in the test's directory: compiling is most of a launch's
time on two cores, and A compiles what B needs (a cached executable computes what a fresh one does).
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from bertjax.training import checkpoint
from bertjax.text import vocab_learning as vocabularies
from test_inputs import write_corpus  # tests/ is on sys.path under pytest, as test_api uses test_hf

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launch" / "local.py"
NUM_STEPS = 32  # with compiled programs cached, a step takes a fraction of a second: room for the signal
CHECKPOINT_EVERY = 4
STOP_AFTER = 5  # B's process 1 is sent SIGTERM once it has logged this step
# Generous: two processes start TensorFlow and compile on two shared cores. The launcher's own
# timeout stops the children first, so a hang ends as a failure with output, not as a stuck test.
LAUNCH_TIMEOUT_S = 300


class Launch:
    """launch/local.py running in the background; its output (both streams) collected line by line."""

    def __init__(self, command: list[str], compilation_cache):
        self.lines: list[str] = []
        env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        self._watch: tuple[re.Pattern, threading.Event] | None = None
        self.proc = subprocess.Popen(
            [sys.executable, str(LAUNCHER), "--cpu", "--num_processes=2", f"--timeout={LAUNCH_TIMEOUT_S - 30}",
             "--grace_period=20", "--", *command],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, errors="replace",
        )
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
                if self._watch and self._watch[0].search(line):
                    self._watch[1].set()

    def wait_for(self, pattern: str, timeout: float) -> bool:
        """True once a line matching `pattern` has been printed (or was already)."""
        event = threading.Event()
        with self._lock:
            self._watch = (re.compile(pattern), event)
            if any(self._watch[0].search(line) for line in self.lines):
                event.set()
        return event.wait(timeout)

    def finish(self) -> "Launch":
        try:
            self.proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)
        self.output = "\n".join(self.lines)
        return self

    def check(self) -> "Launch":
        assert self.proc.returncode == 0, f"launcher exited {self.proc.returncode}:\n{self.output[-6000:]}"
        return self


def train_command(corpus, workdir) -> list[str]:
    vocab_size = len((corpus / "vocab.txt").read_text(encoding="utf-8").splitlines())
    return [
        sys.executable, "-m", "bertjax.train", "--config=configs/tiny.py", f"--workdir={workdir}",
        "--config.data.source=text", f"--config.data.input_pattern={corpus / '*.txt'}",
        f"--config.data.vocab_path={corpus / 'vocab.txt'}", "--config.data.eval_fraction=0.1",
        "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
        f"--config.model.vocab_size={vocab_size}", "--config.train.batch_size=8",
        f"--config.train.num_steps={NUM_STEPS}", "--config.schedule.warmup_steps=2",
        "--config.logging.log_every=1", "--config.logging.eval_every=1000", "--config.logging.eval_batches=2",
        f"--config.checkpoint.every_steps={CHECKPOINT_EVERY}",
        # INFO logs carry each host's share of the documents (checked below); they change nothing else.
        "--verbosity=0",
    ]


def child_pid(launcher_pid: int, process_id: int) -> int:
    """The pid of the launcher's child with this BERTJAX_PROCESS_ID."""
    children = pathlib.Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for pid in map(int, children):
        environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"BERTJAX_PROCESS_ID={process_id}".encode() in environ:
            return pid
    raise AssertionError(f"no child with BERTJAX_PROCESS_ID={process_id} among {children}")


def read_metrics(workdir) -> tuple[list[dict], list[dict]]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "split" not in r], [r for r in records if r.get("split") == "eval"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus / "part-0.txt", seed=0)
    write_corpus(corpus / "part-1.txt", seed=1)
    sentences = (line for p in sorted(corpus.glob("*.txt")) for line in p.read_text().splitlines() if line)
    vocabularies.learn_wordpiece_vocab(sentences, 400, True, str(corpus / "vocab.txt"))
    a_dir, b_dir, cache = root / "a", root / "b", root / "jax-cache"

    a = Launch(train_command(corpus, a_dir), cache).finish().check()
    b_first = Launch(train_command(corpus, b_dir), cache)
    # One host preempted: SIGTERM reaches process 1 alone, and both must agree on the step to save.
    # Once a step is logged, the signal is sure to find the handlers installed in both processes. The
    # steps left leave ample time for the signal to arrive before the end.
    started = b_first.wait_for(rf"^\[0\] step {STOP_AFTER} \|", timeout=LAUNCH_TIMEOUT_S)
    if started:
        os.kill(child_pid(b_first.proc.pid, process_id=1), signal.SIGTERM)
    b_first.finish()
    assert started, f"run B never logged step {STOP_AFTER}:\n{b_first.output[-6000:]}"
    b_first.check()
    b_resumed = Launch(train_command(corpus, b_dir), cache).finish().check()
    return dict(a=a, a_dir=a_dir, b_first=b_first, b_resumed=b_resumed, b_dir=b_dir)


@pytest.mark.slow
def test_two_processes_train_and_only_process_0_writes(runs):
    a, a_dir = runs["a"], runs["a_dir"]
    assert "[0] 2 process(es), 2 cpu device(s), mesh {'data': 2" in a.output
    steps, evals = read_metrics(a_dir)
    # One line per step: a second writer would have appended its own copy of every step.
    assert [r["step"] for r in steps] == list(range(1, NUM_STEPS + 1))
    assert all(r["loss"] is not None for r in steps)
    assert [r["step"] for r in evals] == [NUM_STEPS]  # the held-out evaluation ran, on both processes' shares
    assert re.search(r"^\[0\] step 1 \|", a.output, re.M) and not re.search(r"^\[1\] step \d", a.output, re.M)
    kept = sorted(int(p.name) for p in (a_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == [NUM_STEPS - 2 * CHECKPOINT_EVERY, NUM_STEPS - CHECKPOINT_EVERY, NUM_STEPS]  # every 4, keep=3

    # A checkpoint written by two processes is read whole by one (as bertjax.load does).
    params, meta = checkpoint.restore_params(str(a_dir))
    assert meta.step == NUM_STEPS and meta.data["process_count"] == 2
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) > 100_000


@pytest.mark.slow
def test_sigterm_saves_and_the_resumed_run_matches_the_uninterrupted_one(runs):
    first, resumed = runs["b_first"], runs["b_resumed"]
    saved = re.search(r"SIGTERM: saved the checkpoint of step (\d+)", first.output)
    assert saved, first.output[-6000:]
    stop = int(saved.group(1))
    assert STOP_AFTER <= stop < NUM_STEPS, f"B stopped at step {stop}, not between {STOP_AFTER} and {NUM_STEPS}"
    assert f"resumed from step {stop} " in resumed.output, resumed.output[-6000:]

    a_steps, a_evals = read_metrics(runs["a_dir"])
    b_steps, b_evals = read_metrics(runs["b_dir"])
    # Every step once: the stopped run logged 1..stop, the resumed one stop+1..NUM_STEPS.
    assert [r["step"] for r in b_steps] == list(range(1, NUM_STEPS + 1))
    keys = ("loss", "mlm_loss", "nsp_loss", "grad_norm", "mlm_accuracy", "nsp_accuracy", "learning_rate")
    for x, y in zip(a_steps, b_steps):
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}, f"step {x['step']} (B resumed at {stop})"
    # The final parameters agree too, and so the held-out evaluation at the last step.
    assert [(r["loss"], r["mlm_accuracy"]) for r in a_evals] == [(r["loss"], r["mlm_accuracy"]) for r in b_evals]
    a_params, _ = checkpoint.restore_params(str(runs["a_dir"]))
    b_params, _ = checkpoint.restore_params(str(runs["b_dir"]))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a_params, b_params)


@pytest.mark.slow
def test_each_process_reads_its_half_of_the_documents(runs):
    out = runs["a"].output
    total = re.search(r"corpus: (\d+) documents, (\d+) held out", out)
    found = re.findall(r"^\[(\d)\] .*host (\d)/2: (\d+) training documents .*, (\d+) held-out documents", out, re.M)
    assert all(prefix == host for prefix, host, _, _ in found), found  # each process logs its own share
    shares = {int(host): (int(train), int(held)) for _, host, train, held in found}
    assert total and sorted(shares) == [0, 1], out[-6000:]
    documents, held_out = int(total.group(1)), int(total.group(2))
    # Disjoint and complete shares are tested in test_inputs; here: each process got its own share.
    assert shares[0][0] + shares[1][0] == documents - held_out
    assert shares[0][1] + shares[1][1] == held_out
    assert all(train > (documents - held_out) / 4 for train, _ in shares.values())


# ----------------------------------------------------------------------------------------------------
# The launcher itself, with small stand-in programs (a second or two each)
# ----------------------------------------------------------------------------------------------------

CHILD = """
import os, signal, sys, time
i = int(os.environ["BERTJAX_PROCESS_ID"])
print("env", i, os.environ["BERTJAX_NUM_PROCESSES"], os.environ["BERTJAX_COORDINATOR_ADDRESS"],
      os.environ.get("JAX_PLATFORMS"), os.environ.get("XLA_FLAGS"), flush=True)
print("to stderr", i, file=sys.stderr, flush=True)
mode = sys.argv[1]
if mode == "fail" and i == 1:
    sys.exit(3)
if mode == "save_on_sigterm":
    signal.signal(signal.SIGTERM, lambda *_: (print("saving", i, flush=True), sys.exit(0)))
    print("ready", i, flush=True)
if mode == "ignore_sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(0 if mode == "ok" else 120)
"""


def launch_child(tmp_path, mode, *options):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(LAUNCHER), *options, "--", sys.executable, str(script), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_launcher_gives_each_process_its_rank_and_prefixes_its_output(tmp_path):
    proc = launch_child(tmp_path, "ok", "--num_processes=3", "--cpu", "--devices_per_process=2")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    envs = sorted(line.split() for line in out.splitlines() if " env " in line)
    assert [e[:4] for e in envs] == [["[0]", "env", "0", "3"], ["[1]", "env", "1", "3"], ["[2]", "env", "2", "3"]]
    assert len({e[4] for e in envs}) == 1 and envs[0][4].startswith("127.0.0.1:")  # one coordinator
    # --cpu replaces an inherited device count (conftest sets 8) rather than adding a second one.
    assert all(e[5] == "cpu"
               and [f for f in e[6:] if "device_count" in f] == ["--xla_force_host_platform_device_count=2"]
               for e in envs), envs
    assert {f"[{i}] to stderr {i}" for i in range(3)} <= set(out.splitlines())


def test_launcher_stops_the_others_when_one_fails(tmp_path):
    proc = launch_child(tmp_path, "fail", "--num_processes=2", "--grace_period=30")
    out, _ = proc.communicate(timeout=60)  # process 0 would sleep for 120 s
    assert proc.returncode == 3, out
    assert "process 1 exited with status 3" in out


def test_launcher_passes_sigterm_on_so_the_processes_can_save(tmp_path):
    proc = launch_child(tmp_path, "save_on_sigterm", "--num_processes=2", "--timeout=60")  # never hangs
    ready = set()
    for line in proc.stdout:  # both handlers installed before the signal
        ready |= {line.strip()} & {"[0] ready 0", "[1] ready 1"}
        if len(ready) == 2:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "[0] saving 0" in out and "[1] saving 1" in out


def test_launcher_timeout_ends_even_processes_that_ignore_sigterm(tmp_path):
    proc = launch_child(tmp_path, "ignore_sigterm", "--num_processes=2", "--timeout=2", "--grace_period=1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124, out
    assert "SIGKILL" in out


# ----------------------------------------------------------------------------------------------------
# A cluster JAX detects by itself (here Open MPI's environment, as mpirun sets it): two processes join
# one job with no coordinator flags; without any cluster, one process runs alone.
# ----------------------------------------------------------------------------------------------------

JOIN = """
import jax
from bertjax.training import sharding
sharding.initialize_distributed()
print("joined", jax.process_index(), jax.process_count(), flush=True)
"""


def test_a_detected_cluster_is_joined_without_flags(tmp_path):
    script = tmp_path / "join.py"
    script.write_text(JOIN)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SLURM_", "BERTJAX_"))}
    base.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    job = 4096 * (1000 + os.getpid() % 3000)  # Open MPI job ids are multiples of 2^12; JAX derives the port
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT,
                              env=dict(base, OMPI_MCA_orte_hnp_uri=f"{job}.0;tcp://127.0.0.1:1",
                                       OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK=str(i),
                                       OMPI_COMM_WORLD_LOCAL_RANK=str(i)))
             for i in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [re.search(r"joined (\d) (\d)", out).groups() for out in outs] == [("0", "2"), ("1", "2")], outs
    alone = subprocess.run([sys.executable, str(script)], cwd=REPO, env=base, text=True, capture_output=True,
                           timeout=120)
    assert alone.returncode == 0 and "joined 0 1" in alone.stdout, alone.stderr[-2000:]
