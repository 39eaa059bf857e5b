"""The mesh session: the tests of sharding (marked `mesh`) run together in one pytest process of their own
with eight virtual CPU devices, while every other test runs on one device (tests/conftest.py).

XLA fixes a process's device count when JAX starts, so one process cannot offer both, and eight virtual
devices on two cores make every test that does not need them pay for them (8-way data parallelism, its
collectives and replicated checkpoints). In the main session each marked test is a stand-in (MeshTest) with
the same node id: the first stand-in to run starts the mesh session on all of them, and each then reports
the outcome its test had there (a failure with the mesh session's own report, a skip with its reason, and a
failure if the session never ran it). The scheduler in conftest keeps the stand-ins on one worker.

Debugging a mesh test: its failure shows the mesh session's own report, and the session's whole output is
in the run directory's mesh-session-<worker>.log. To run it as the session does, alone and in the
foreground: `BERTJAX_TEST_MESH_RESULTS=/tmp/mesh.jsonl python -m pytest -p no:xdist tests/test_elastic_resume.py` (the
variable gives the process its eight devices, tests/conftest.py)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

RESULTS_ENV = "BERTJAX_TEST_MESH_RESULTS"  # set in the mesh session: the file its outcomes go to
NUM_DEVICES = 8
TIMEOUT_S = 1500
REPO = pathlib.Path(__file__).resolve().parents[1]


class MeshTestFailed(Exception):
    """The test failed in the mesh session: the message is its report there."""


class MeshTest(pytest.Item):
    """A `mesh` test as the main session sees it: it runs in the mesh session and reports that outcome."""

    def runtest(self):
        outcome, text = _outcome(self)
        if outcome == "skipped":
            pytest.skip(text)
        if outcome != "passed":
            raise MeshTestFailed(text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, MeshTestFailed):
            return f"in the mesh session ({NUM_DEVICES} devices):\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"{self.name} (mesh session)"


def stand_ins(items: list, run_directory: pathlib.Path) -> list:
    """items with each `mesh` test replaced by its stand-in (the same node id, markers and keywords);
    the mesh session will keep its files in run_directory."""
    _session["root"] = run_directory
    out = []
    for item in items:
        if item.get_closest_marker("mesh") is None:
            out.append(item)
            continue
        stand_in = MeshTest.from_parent(item.parent, name=item.name)
        stand_in.own_markers.extend(item.own_markers)
        stand_in.keywords.update(item.keywords)
        out.append(stand_in)
    return out


def record(report, path: str) -> None:
    """In the mesh session: one line per test phase that failed or was skipped, and per test that passed."""
    if report.when != "call" and report.outcome == "passed":
        return
    text = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else report.longreprtext
    with open(path, "a") as out:
        out.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                              "text": text}) + "\n")


_session: dict = {}  # this process's mesh session: its run directory, then {"records", "exit_code", "output"}


def _run(item: MeshTest, root: pathlib.Path) -> dict:
    nodeids = [i.nodeid for i in item.session.items if isinstance(i, MeshTest)]
    # Per worker: with another --dist mode than conftest's, each worker that gets a stand-in runs its own.
    name = f"mesh-session-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    results, log = root / f"{name}.jsonl", root / f"{name}.log"
    results.unlink(missing_ok=True)
    # Not an xdist worker: the session is a plain pytest run of its own (the compilation cache is shared).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_CURRENT_TEST"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
               f"--basetemp={root / name}", *nodeids]
    try:
        done = subprocess.run(command, cwd=REPO, env={**env, RESULTS_ENV: str(results)}, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        exit_code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        exit_code, output = "timeout", f"{e.stdout or ''}{e.stderr or ''}\nstopped after {TIMEOUT_S} s"
    log.write_text(output)
    records = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    return dict(records=records, exit_code=exit_code, output=output)


def _outcome(item: MeshTest) -> tuple[str, str]:
    if "records" not in _session:
        _session.update(_run(item, _session["root"]))
    return outcome_of(item.nodeid, **_session)


def outcome_of(nodeid: str, *, records: list, exit_code, output: str, **_) -> tuple[str, str]:
    """(passed | failed | skipped, text) of a test from the mesh session's records: passed only if its call
    passed and no phase failed."""
    reports = [r for r in records if r["nodeid"] == nodeid]
    failed = [f"[{r['when']}] {r['text']}" for r in reports if r["outcome"] == "failed"]
    if failed:
        return "failed", "\n\n".join(failed)
    skipped = [r["text"] for r in reports if r["outcome"] == "skipped"]
    if skipped:
        return "skipped", skipped[0]
    if any(r["when"] == "call" and r["outcome"] == "passed" for r in reports):
        return "passed", ""
    return "failed", f"the mesh session (exit {exit_code}) did not run it; its output ends:\n{output[-4000:]}"
