"""The workdir of a run: its config.json, its vocabulary, and one run at a time in it.

A workdir is a local directory or an object-store URL (gs://bucket/run, or another scheme etils.epath
knows); its paths go through bertjax.text.files (is_remote, join, path, make, write_bytes, local_copy),
so a remote workdir never turns into a local directory named "gs:".

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

from bertjax.text.files import VOCAB_FILES, is_remote, join, path, write_bytes

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.json"  # the run's full resolved config, written as it starts


# ---------------------------------------------------------------------------------------------------
# The run's config
# ---------------------------------------------------------------------------------------------------


def write_config(workdir: str, config: dict) -> None:
    """WORKDIR/config.json: the full resolved config of the run (config.to_dict()), for people and tools."""
    text = json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"
    write_bytes(join(workdir, CONFIG_FILE), text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------------
# The vocabulary of a run
# ---------------------------------------------------------------------------------------------------


def keep_vocabulary(workdir: str, source: str, kind: str) -> str:
    """Copy the run's vocabulary into the workdir (if it is not there already) and return its name
    there, which checkpoints record: a workdir copied elsewhere then still has its tokenizer."""
    name = VOCAB_FILES[kind]
    target = join(workdir, name)
    if not is_remote(source):
        source = os.path.abspath(source)
    if source == target:  # learned into the workdir
        return name
    data = epath.Path(source).read_bytes()
    existing = epath.Path(target)
    if existing.exists():
        if existing.read_bytes() != data:
            raise ValueError(f"the workdir's {name} differs from the vocabulary {source}: a workdir keeps the "
                             f"vocabulary its checkpoints were trained with; use a new workdir, or that one")
        return name
    write_bytes(target, data)
    return name


def resolve_vocabulary(recorded: str, workdir: str) -> str:
    """The vocabulary a checkpoint recorded: a name relative to its workdir, or (checkpoints written
    before vocabularies were kept in the workdir) an absolute path."""
    if is_remote(recorded) or os.path.isabs(recorded):
        return recorded
    return join(workdir, recorded)


# ---------------------------------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------------------------------


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
        self.remote = is_remote(workdir)
        self._file = None
        self._path = path(workdir, LOCK_FILE)

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
        while True:
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
            # The holder before us removes the file as it releases it: a lock taken on a file no longer
            # at the path guards nothing, so take the one there now.
            if os.path.exists(self._path) and os.stat(self._path).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
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
        """The lock file goes with the lock (removed while still held, so no other run holds it then)."""
        if self._file is not None:
            self._path.unlink(missing_ok=True)
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self.remote and self._path.exists():
            self._path.unlink()
