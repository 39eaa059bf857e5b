"""The workdir of a run: where its files are, and one run at a time in it.

A workdir is a local directory or an object-store URL (gs://bucket/run, or another scheme etils.epath
knows); everything a run writes there goes through the few functions below, so a remote workdir never
turns into a local directory named "gs:". Local paths behave as plain files (appends, renames).

WORKDIR/run.lock names the process that holds the workdir. On a local filesystem it is held with an
advisory lock (fcntl), which the operating system releases when the process dies, so the lock of a
killed run is taken over without asking. On object stores (gs://...) there is no such lock: the file
names the holder, and a holder on this host that is no longer running is recognised as stale.
"""

import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time

from etils import epath

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.json"  # the run's full resolved config, written as it starts


# ---------------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------------


def is_remote(path: str) -> bool:
    """gs://bucket/run and other URLs: no appends, no local file operations."""
    return "://" in str(path)


def join(workdir: str, *parts: str) -> str:
    """A path inside the workdir, as a string. A local workdir is made absolute (as Orbax needs); a URL
    is kept as it is (os.path.abspath would make gs://b a local ./gs:/b)."""
    if is_remote(workdir):
        return "/".join([str(workdir).rstrip("/"), *parts])
    return os.path.join(os.path.abspath(str(workdir)), *parts)


def path(workdir: str, *parts: str) -> epath.Path:
    """The same, as an etils.epath.Path (local files or the object store's client)."""
    return epath.Path(join(workdir, *parts))


def make(workdir: str) -> None:
    """Create the workdir; one line (ValueError) when it cannot be, e.g. an unknown scheme or no access."""
    try:
        path(workdir).mkdir(parents=True, exist_ok=True)
        if is_remote(workdir):
            # Object stores have no directories, so mkdir proves nothing: write and remove a probe file.
            probe = path(workdir, f".write-test-{os.getpid()}")
            probe.write_text("")
            probe.unlink()
    except Exception as e:  # noqa: BLE001 -- whatever the filesystem said, the run cannot start
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if isinstance(e, KeyError):  # epath's answer to a scheme it has no backend for
            reason = f"unknown scheme {reason}"
        raise ValueError(f"cannot write to the workdir {workdir} ({reason}): give a local directory or a "
                         f"gs:// URL this machine can write to") from None


def write_bytes(target: str, data: bytes) -> None:
    """Write a whole file so that no reader sees half of it: beside and renamed for a local file; an
    object store replaces an object in one piece anyway."""
    if not is_remote(target):
        temporary = f"{target}.tmp-{os.getpid()}"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, target)
        return
    epath.Path(target).write_bytes(data)


def write_config(workdir: str, config: dict) -> None:
    """WORKDIR/config.json: the full resolved config of the run (config.to_dict()), for people and tools."""
    text = json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"
    write_bytes(join(workdir, CONFIG_FILE), text.encode("utf-8"))


def local_copy(source: str) -> str:
    """A local file with the contents of `source`: the path itself when local, else a copy in a
    per-content cache directory (tokenizer libraries read local files only)."""
    if not is_remote(source):
        return source
    data = epath.Path(source).read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), "bertjax-remote-files", digest)
    local = os.path.join(directory, source.rstrip("/").rsplit("/", 1)[-1])
    if not os.path.exists(local):
        os.makedirs(directory, exist_ok=True)
        write_bytes(local, data)
    return local


# ---------------------------------------------------------------------------------------------------
# The vocabulary of a run
# ---------------------------------------------------------------------------------------------------

VOCAB_FILES = {"wordpiece": "vocab.txt", "sentencepiece": "sentencepiece.model"}


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
