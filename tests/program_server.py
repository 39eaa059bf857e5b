"""A bertjax program run as `python -m` for the tests, at the cost of a fork instead of an interpreter start.

A program a test starts spends most of its seconds importing (TensorFlow alone takes several on two cores),
and the suite starts dozens. One server per test worker imports TensorFlow, JAX and the programs once,
then runs each command a test asks for in a forked child of itself: the child takes the command's
environment, directory, arguments and streams, runs the module as `__main__` (as `python -m` does; or a
`-c` program as `python -c` does) and exits as the interpreter exits, so its exit code,
output and at-exit work are those of a fresh process (it ends as the programs end, through
console.exit_without_teardown).

What a fork cannot give, a fresh interpreter still does (the fallback, with no option to ask for it):
a command whose environment differs from the server's in a variable read when a library is imported
(TensorFlow's, JAX's, Python's, the loader's, the accelerators'). Tests of
what happens at import (which libraries a program imports, what a start-up prints) start their own
interpreter.

Debugging a test through it: a command's stdout, stderr and exit code come back as subprocess's would; the
server's own errors are in its log (bertjax-program-server-<run>-<pid>.log in the temporary directory,
kept when it failed). BERTJAX_TESTS_NO_FORK=1 runs every command as its own interpreter instead
(tests/conftest.py), which tells a fault of the fork from one of the program.
"""

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

# Variables read when Python, TensorFlow, JAX or an accelerator runtime starts: a command that changes one of
# these gets a fresh interpreter (JAX reads its JAX_* ones when imported, and has no public way to read
# them again).
IMPORT_TIME_PREFIXES = ("PYTHON", "TF_", "JAX_", "LD_", "CUDA", "TPU_", "OMP_", "MALLOC", "XLA_PYTHON")

SERVER = textwrap.dedent(r"""
    import json, os, runpy, select, signal, sys, tempfile
    import jax
    import bertjax
    from bertjax import environment
    from bertjax.runs import console
    from bertjax.text import tf_cpu
    tf_cpu.import_tensorflow()
    for name in sys.argv[1:]:
        __import__(name)

    def child(job):
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        tempfile.tempdir = None  # found again from the command's TMPDIR
        environment.quiet_start_up()  # what `import bertjax` does in a fresh interpreter
        if job["module"]:
            sys.argv = [job["module"], *job["args"]]
            sys.modules.pop(job["module"], None)  # run as __main__ alone, as in a fresh interpreter
            sys.path[0] = job["cwd"]
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *job["args"]]
            sys.path[0] = ""
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})

    def exit_code(job):
        # The command's exit status as sys.exit was given it (console.exit_without_teardown reads it).
        try:
            child(job)
        except SystemExit as stop:
            return stop.code
        except KeyboardInterrupt:
            return -signal.SIGINT
        except BaseException:
            sys.excepthook(*sys.exc_info())
            return 1
        return 0

    def finish(code):
        # A program's own exit (bertjax/runs/console.py), or, after an uncaught Ctrl-C, the signal itself,
        # as the interpreter ends then.
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        console.exit_without_teardown(code)

    # Requests arrive on stdin, one JSON line each; each is answered at once with the child's pid, and again
    # when the child has ended, with its exit status. Several children may run at once (a test may run a
    # command while it has started another).
    replies = os.fdopen(os.dup(1), "w")
    requests = os.dup(0)
    pending, children = b"", set()
    while True:
        ready, _, _ = select.select([requests], [], [], 0.05 if children else None)
        if ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                break
            pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            job = json.loads(line)
            sys.stdout.flush(); sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                replies.close(); os.close(requests)
                finish(exit_code(job))
            children.add(pid)
            replies.write(json.dumps({"pid": pid}) + "\n"); replies.flush()
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            children.discard(pid)
            replies.write(json.dumps({"ended": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n")
            replies.flush()
    for pid in children:
        os.waitpid(pid, 0)
""")


class ServedProcess:
    """A command running in a fork of the server, with what the tests use of subprocess.Popen: pid,
    poll(), wait(), send_signal(), kill(), communicate() and stdout / stderr to read (files, as text)."""

    def __init__(self, server: "ProgramServer", argv: list[str], pid: int, streams: dict):
        self.args, self.pid, self._server = argv, pid, server
        self.stdout, self.stderr = (open(streams[k], encoding="utf-8", errors="replace") for k in ("stdout", "stderr"))

    @property
    def returncode(self) -> int | None:
        return self._server._ended.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._server._wait_for(self.pid, timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int):
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()


class ProgramServer:
    """A running server (see the module's docstring). `start` is subprocess.Popen(argv, stdout=PIPE,
    stderr=PIPE, text=True) and `run` subprocess.run(argv, capture_output=True, text=True) for
    `[sys.executable, "-m", module, *args]` and `[sys.executable, "-c", code, *args]`; any other command, or
    one whose environment a fork cannot give, runs as itself."""

    def __init__(self, env: dict, cwd: str, modules: tuple[str, ...], log_path: str):
        self.env = dict(env)
        self._log = open(log_path, "a")
        self._streams = tempfile.mkdtemp(prefix="bertjax-program-streams-")
        self._proc = subprocess.Popen([sys.executable, "-c", SERVER, *modules], cwd=cwd, env=self.env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._lock, self._ended_changed = threading.Lock(), threading.Condition()
        self._pids: "queue.Queue[int | None]" = queue.Queue()
        self._ended: dict[int, int] = {}
        self._count = 0
        threading.Thread(target=self._read_replies, daemon=True).start()

    def forkable(self, argv: list[str], env: dict) -> bool:
        """Whether the command may run in a fork of the server."""
        if argv[0] != sys.executable or len(argv) < 3 or argv[1] not in ("-m", "-c") or self._proc.poll() is not None:
            return False
        names = set(env) | set(self.env)
        return all(env.get(n) == self.env.get(n) for n in names if n.startswith(IMPORT_TIME_PREFIXES))

    def start(self, argv: list, *, env: dict, cwd):
        argv = [str(a) for a in argv]
        if not self.forkable(argv, env):
            return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with self._lock:
            self._count += 1
            streams = {k: os.path.join(self._streams, f"{self._count}.{k}") for k in ("stdout", "stderr")}
            for path in streams.values():  # there to read before the child opens them
                open(path, "w").close()
            job = dict(module=argv[2] if argv[1] == "-m" else None, code=argv[2] if argv[1] == "-c" else None,
                       args=argv[3:], env=env, cwd=str(cwd), **streams)
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
            pid = self._pids.get()
            if pid is None:
                raise RuntimeError(f"the program server ended; its log: {self._log.name}")
        return ServedProcess(self, argv, pid, streams)

    def run(self, argv: list, *, env: dict, cwd, timeout: float | None) -> subprocess.CompletedProcess:
        proc = self.start(argv, env=env, cwd=cwd)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # stopped as subprocess.run stops it
            proc.kill()
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _read_replies(self):
        for line in self._proc.stdout:
            reply = json.loads(line)
            if "pid" in reply:
                self._pids.put(reply["pid"])
            else:
                with self._ended_changed:
                    self._ended[reply["ended"]] = reply["returncode"]
                    self._ended_changed.notify_all()
        self._pids.put(None)  # the server ended: no command waits for ever
        with self._ended_changed:
            self._closed = True
            self._ended_changed.notify_all()

    _closed = False

    def _wait_for(self, pid: int, timeout: float | None) -> bool:
        with self._ended_changed:
            self._ended_changed.wait_for(lambda: pid in self._ended or self._closed, timeout)
            if self._closed and pid not in self._ended:
                raise RuntimeError(f"the program server ended; its log: {self._log.name}")
            return pid in self._ended

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()
        shutil.rmtree(self._streams, ignore_errors=True)
        if self._proc.returncode == 0:  # what it printed matters only when it failed
            os.remove(self._log.name)
