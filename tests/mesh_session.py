"""The mesh session: the tests of sharding (marked `mesh`) run together in one pytest process of their own
with eight virtual CPU devices, while every other test runs on one device (tests/conftest.py).

XLA fixes a process's device count when JAX starts, so one process cannot offer both, and eight virtual
devices on two cores make every test that does not need them pay for them (8-way data parallelism, its
collectives and replicated checkpoints). In the main session each marked test is a stand-in (MeshTest)
with the same node id, which reports the outcome its test had in the mesh session: a failure with that
session's own report, a skip with its reason, and a failure if the session never ran it. The session
starts in the background as soon as the tests are collected, and the stand-ins wait for it; the
scheduler in conftest keeps them on one worker."""

import json
import os
import pathlib
import subprocess
import sys
import time

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


def _files(root: pathlib.Path) -> dict:
    return {name: root / f"mesh-session{suffix}" for name, suffix in
            (("lock", ".lock"), ("started", ".started"), ("results", ".jsonl"), ("log", ".log"), ("done", ".done"))}


def start(items: list, root: pathlib.Path) -> None:
    """Starts the mesh session on the stand-ins among items, in the background, once per test run (the
    first xdist worker to collect starts it; the other finds it started): it runs beside the main session's
    tests, on the CPU time their single-threaded stretches leave, and the stand-ins wait for it."""
    import filelock

    nodeids = [i.nodeid for i in items if isinstance(i, MeshTest)]
    files = _files(root)
    if not nodeids:
        return
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())  # a --basetemp may hold an old run's
    with filelock.FileLock(str(files["lock"])):
        if files["started"].exists() and json.loads(files["started"].read_text())["run"] == run:
            return
        for name in ("results", "log", "done"):
            files[name].unlink(missing_ok=True)
        files["started"].write_text(json.dumps({"run": run, "nodeids": nodeids}))
    # Not an xdist worker: the session is a plain pytest run of its own (the compilation cache is shared).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_CURRENT_TEST"}
    subprocess.Popen([sys.executable, __file__, str(root)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run(root: pathlib.Path) -> None:
    """The background process: the mesh session's pytest, then its exit code in the done file."""
    files = _files(root)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
               f"--basetemp={root / 'mesh-session'}", *json.loads(files["started"].read_text())["nodeids"]]
    with open(files["log"], "w") as log:
        try:
            code = subprocess.run(command, cwd=REPO, env={**os.environ, RESULTS_ENV: str(files["results"])},
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = f"stopped after {TIMEOUT_S} s"
    files["done"].write_text(json.dumps(code))


_session: dict = {}  # this process's view of the mesh session: its run directory, then its outcomes


def _wait(root: pathlib.Path) -> dict:
    files = _files(root)
    deadline = time.time() + TIMEOUT_S + 60
    while not files["done"].exists():
        if time.time() > deadline:
            return dict(records=[], exit="never ended", output="")
        time.sleep(0.5)
    records = [json.loads(line) for line in files["results"].read_text().splitlines()] \
        if files["results"].exists() else []
    return dict(records=records, exit=json.loads(files["done"].read_text()), output=files["log"].read_text())


def _outcome(item: MeshTest) -> tuple[str, str]:
    if "records" not in _session:
        _session.update(_wait(_session["root"]))
    reports = [r for r in _session["records"] if r["nodeid"] == item.nodeid]
    failed = [f"[{r['when']}] {r['text']}" for r in reports if r["outcome"] == "failed"]
    if failed:
        return "failed", "\n\n".join(failed)
    skipped = [r["text"] for r in reports if r["outcome"] == "skipped"]
    if skipped:
        return "skipped", skipped[0]
    if any(r["when"] == "call" and r["outcome"] == "passed" for r in reports):
        return "passed", ""
    return "failed", (f"the mesh session (exit {_session['exit']}) did not run it; its output ends:\n"
                      f"{_session['output'][-4000:]}")


if __name__ == "__main__":
    _run(pathlib.Path(sys.argv[1]))
