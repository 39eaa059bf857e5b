"""`python -m bertjax.PROGRAM ...` for the tests, at the cost of a fork instead of an interpreter start.

A program a test starts spends most of its seconds importing (TensorFlow alone takes several on two cores),
and the suite starts dozens. One server per test worker imports TensorFlow, JAX and the programs once,
then runs each command a test asks for in a forked child of itself: the child takes the command's
environment, directory, arguments and streams, runs the module as `__main__` (as `python -m` does; or a
`-c` program as `python -c` does) and exits as the interpreter exits, so its exit code,
output and at-exit work are those of a fresh process (the teardown of every module, which takes longer
than most commands with TensorFlow and JAX loaded, is left out).

What a fork cannot give, a fresh interpreter still does (`run`'s fallback, with no option to ask for it):
a command whose environment differs from the server's in a variable read when a library is imported
(TensorFlow's, Python's, the loader's, the accelerators'; JAX's own are set again in the child). Tests of
what happens at import (which libraries a program imports, what a start-up prints) start their own
interpreter.
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

# Variables read when Python, TensorFlow or an accelerator runtime starts: a command that changes one of
# these gets a fresh interpreter. (JAX reads its JAX_* ones at import too; the child sets them again.)
IMPORT_TIME_PREFIXES = ("PYTHON", "TF_", "LD_", "CUDA", "TPU_", "OMP_", "MALLOC", "XLA_PYTHON")

SERVER = textwrap.dedent(r"""
    import atexit, json, os, runpy, signal, sys, tempfile, threading
    import jax
    import bertjax
    from bertjax import environment
    from bertjax.text import tf_cpu
    tf_cpu.import_tensorflow()
    for name in sys.argv[1:]:
        __import__(name)
    STARTED_WITH = dict(os.environ)
    TRUE = ("1", "t", "true", "y", "yes", "on")

    def jax_options_as_in(env):
        # JAX read its JAX_* variables when the server imported it: the command's own, set again.
        for var in set(env) | set(STARTED_WITH):
            if not var.startswith("JAX_") or env.get(var) == STARTED_WITH.get(var):
                continue
            holder = jax.config._value_holders.get(var.lower())
            if holder is None:
                continue
            text, default = env.get(var), holder.value
            if text is None:
                value = None if not isinstance(default, (bool, int, float)) else type(default)()
            elif isinstance(default, bool):
                value = text.lower() in TRUE
            elif isinstance(default, (int, float)):
                value = type(default)(text)
            else:
                value = text
            jax.config.update(var.lower(), value)

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
        jax_options_as_in(job["env"])
        if job["module"]:
            sys.argv = [job["module"], *job["args"]]
            sys.modules.pop(job["module"], None)  # run as __main__ alone, as in a fresh interpreter
            sys.path[0] = job["cwd"]
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *job["args"]]
            sys.path[0] = ""
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})

    def exit_code(job) -> int:
        # The command's exit status, as the interpreter would set it.
        try:
            child(job)
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                return stop.code or 0
            print(stop.code, file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return -signal.SIGINT
        except BaseException:
            sys.excepthook(*sys.exc_info())
            return 1
        return 0

    def finish(code: int):
        # The interpreter's exit (threads joined, at-exit functions, streams flushed) without its teardown
        # of every module, which with TensorFlow and JAX loaded takes longer than most commands.
        threading._shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)

    replies = os.fdopen(os.dup(1), "w")
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        job = json.loads(line)
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            finish(exit_code(job))
        replies.write(json.dumps({"pid": pid}) + "\n"); replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n"); replies.flush()
""")


class ProgramServer:
    """A running server (see the module's docstring); `run` is subprocess.run's capture_output=True,
    text=True for `[sys.executable, "-m", module, *args]` or `[sys.executable, "-c", code, *args]`."""

    def __init__(self, env: dict, cwd: str, modules: tuple[str, ...], log_path: str):
        self.env = dict(env)
        self._log = open(log_path, "a")
        self._proc = subprocess.Popen([sys.executable, "-c", SERVER, *modules], cwd=cwd, env=self.env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._lock = threading.Lock()
        self._replies, self._pending = self._proc.stdout.fileno(), b""

    def forkable(self, env: dict) -> bool:
        """Whether a command with this environment may run in a fork of the server."""
        names = set(env) | set(self.env)
        return all(env.get(n) == self.env.get(n) for n in names if n.startswith(IMPORT_TIME_PREFIXES))

    def run(self, argv: list[str], *, env: dict, cwd, timeout: float | None) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        if argv[0] != sys.executable or argv[1] not in ("-m", "-c") or not self.forkable(env) or \
                self._proc.poll() is not None:
            return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
        with self._lock, tempfile.TemporaryDirectory() as streams:
            job = dict(module=argv[2] if argv[1] == "-m" else None, code=argv[2] if argv[1] == "-c" else None,
                       args=argv[3:], env=env, cwd=str(cwd), stdout=os.path.join(streams, "out"),
                       stderr=os.path.join(streams, "err"))
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
            pid = self._reply(None)["pid"]
            reply = self._reply(timeout)
            if reply is None:  # past the timeout: stopped as subprocess.run stops it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._reply(None)
            out, err = (open(job[k], encoding="utf-8", errors="replace").read() for k in ("stdout", "stderr"))
            if reply is None:
                raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
            return subprocess.CompletedProcess(argv, reply["returncode"], out, err)

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next line, read from its pipe directly (a buffered reader would hide a line that
        has arrived from select); None past the timeout."""
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._replies], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._replies, 4096)
            if not chunk:
                raise RuntimeError(f"the program server ended; its log: {self._log.name}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()
        if self._proc.returncode == 0:  # what it printed matters only when it failed
            os.remove(self._log.name)
