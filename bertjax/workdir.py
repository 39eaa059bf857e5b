"""The workdir of a run: one run at a time in it.

WORKDIR/run.lock names the process that holds the workdir. On a local filesystem it is held with an
advisory lock (fcntl), which the operating system releases when the process dies, so the lock of a
killed run is taken over without asking. On object stores (gs://...) there is no such lock: the file
names the holder, and a holder on this host that is no longer running is recognised as stale.
"""

import fcntl
import json
import os
import socket
import time

from etils import epath

LOCK_FILE = "run.lock"


class WorkdirInUse(ValueError):
    """Another run holds the workdir: the second one stops with this one line."""


def _holder_line(holder: dict, workdir: str) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("time", 0)))
    return (f"workdir {workdir} is in use by process {holder.get('pid', '?')} on {holder.get('host', '?')} "
            f"(started {started}): wait for that run to end or stop it, or choose another workdir")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkdirLock:
    """Held by process 0 of a run from start to exit: `with WorkdirLock(workdir): ...`."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.remote = "://" in workdir
        self._file = None
        self._path = epath.Path(workdir) / LOCK_FILE

    def __enter__(self) -> "WorkdirLock":
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _me(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}

    def acquire(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self.remote:
            self._acquire_remote()
            return
        f = open(self._path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            try:
                holder = json.loads(f.read() or "{}")
            except ValueError:
                holder = {}
            f.close()
            raise WorkdirInUse(_holder_line(holder, self.workdir)) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps(self._me()))
        f.flush()
        self._file = f

    def _acquire_remote(self) -> None:
        if self._path.exists():
            try:
                holder = json.loads(self._path.read_text() or "{}")
            except ValueError:
                holder = {}
            stale = holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1)))
            if not stale:
                raise WorkdirInUse(_holder_line(holder, self.workdir)
                                   + f" (if no run uses it, delete {self._path})")
        self._path.write_text(json.dumps(self._me()))

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self.remote and self._path.exists():
            self._path.unlink()
