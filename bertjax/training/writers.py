"""Where the training program's figures go, and how fast it runs: metric writer, step timer, console line.

One `MetricWriter` takes each logged step to three places:
  - `workdir/metrics.jsonl`, one JSON object per call, for tools and for the README results table;
  - one compact console line on stdout;
  - TensorBoard event files (written with tensorboardX, so no TensorFlow on accelerator hosts, where it
    would claim device memory), `workdir/tensorboard/` for training and `workdir/tensorboard/<split>/`
    for an evaluation split, so TensorBoard overlays train and eval curves of the same tag as two runs.
    The run's config goes there too, as text and as hparams, and whole to `workdir/config.json`
    (`write_config`).

The workdir may be local or an object store (gs://...): files go through bertjax.training.workdir's paths. An
object store has no append, so there metrics.jsonl and each event file are kept in memory and the
whole object is rewritten, at most once a second (GCS's rate for one object) and when closed.
"""

import itertools
import json
import math
import os
import time
from typing import Any, Callable, Mapping

import numpy as np
from etils import epath

from bertjax.text import files
from bertjax.training import workdir as workdirs

# Object stores take about one write per second to the same object; rewrites wait at least this long.
REMOTE_REWRITE_SECONDS = 1.0

# ---------------------------------------------------------------------------------------------------
# Throughput
# ---------------------------------------------------------------------------------------------------


class StepTimer:
    """Tokens/s, steps/s and the time left, over the steps since the previous update.

    The rate is measured over the last logging interval, not since the start, so that compilation,
    evaluation or a change of sequence length do not linger in it. Call `update` after the step's
    metrics have been fetched from the device: JAX dispatches asynchronously, and only a fetch waits
    for the steps to finish. Call `restart` after work that should not count as training time (the
    first, compiling step; an evaluation; a checkpoint save).

        timer = StepTimer(total_steps=config.num_train_steps, start_step=step)
        ...
        rates = timer.update(step, real_tokens=tokens_since_last_log)
    """

    def __init__(self, total_steps: int, start_step: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.total_steps = int(total_steps)
        self._clock = clock
        self.restart(start_step)

    @property
    def last_step(self) -> int:
        """The step the current interval started at (the last update or restart)."""
        return self._last_step

    def restart(self, step: int) -> None:
        """Start a new interval at `step`, now."""
        self._last_step = int(step)
        self._last_time = self._clock()

    def update(self, step: int, real_tokens: float) -> dict[str, float]:
        """Rates over the interval since the last update or restart, which ends here.

        real_tokens: the non-padding tokens processed in that interval (all hosts together for a
        global rate, this host's for a per-host one).
        """
        now = self._clock()
        steps = int(step) - self._last_step
        seconds = now - self._last_time
        if steps <= 0:
            raise ValueError(f"StepTimer.update(step={step}): no steps since the last update at {self._last_step}")
        if seconds <= 0:
            raise ValueError(f"StepTimer.update(step={step}): the clock did not advance since the last update")
        self._last_step, self._last_time = int(step), now
        steps_per_second = steps / seconds
        return {
            "tokens_per_second": real_tokens / seconds,
            "steps_per_second": steps_per_second,
            "eta_seconds": max(self.total_steps - int(step), 0) / steps_per_second,
        }


def format_duration(seconds: float) -> str:
    """Hours:minutes:seconds, hours unbounded: 3731 -> "1:02:11", 59 -> "0:00:59", 90000 -> "25:00:00"."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"format_duration({seconds}): needs a finite, non-negative number of seconds")
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


# ---------------------------------------------------------------------------------------------------
# Console line
# ---------------------------------------------------------------------------------------------------


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.{1 if suffix == 'k' else 2}f}{suffix}"
    return f"{value:.0f}"


# Metrics the console line knows, in the order it shows them, with their short form. Any other metric
# follows in the order given, as "name value".
_CONSOLE_FORMATS = {
    "loss": lambda v: f"loss {v:.4g}",
    "mlm_loss": lambda v: f"mlm_loss {v:.4g}",
    "nsp_loss": lambda v: f"nsp_loss {v:.4g}",
    "mlm_accuracy": lambda v: f"mlm_acc {v:.3f}",
    "nsp_accuracy": lambda v: f"nsp_acc {v:.3f}",
    "sop_loss": lambda v: f"sop_loss {v:.4g}",
    "sop_accuracy": lambda v: f"sop_acc {v:.3f}",
    "learning_rate": lambda v: f"lr {v:.1e}",
    "batch": lambda v: f"batch {v}",  # sequences in the step, shown while a batch-size warmup runs
    "grad_norm": lambda v: f"grad_norm {v:.3g}",
    "tokens_per_second": lambda v: f"{_si(v)} tok/s",
    "steps_per_second": lambda v: f"{v:.3g} steps/s",
    "padding_efficiency": lambda v: f"real {100 * v:.1f}%",  # the share of positions that are not padding
    "mfu": lambda v: f"mfu {100 * v:.1f}%",
    "eta_seconds": lambda v: f"eta {format_duration(v)}",
}


def format_console_line(step: int, metrics: Mapping[str, float], split: str | None = None) -> str:
    """`step 1200 | loss 6.214 | mlm_acc 0.121 | ... | 41.2k tok/s | mfu 31.2% | eta 1:02:11`.

    An evaluation split is named after the step: `step 1200 [eval] | loss ...`. Non-finite values are
    shown as they are (nan, inf), whatever the metric.
    """
    values = {name: _plain_number(name, value) for name, value in metrics.items()}
    parts = [f"step {step}" + (f" [{split}]" if split is not None else "")]
    ordered = [n for n in _CONSOLE_FORMATS if n in values] + [n for n in values if n not in _CONSOLE_FORMATS]
    for name in ordered:
        value = values[name]
        if isinstance(value, float) and not math.isfinite(value):
            parts.append(f"{name} {value}")
        elif name in _CONSOLE_FORMATS:
            parts.append(_CONSOLE_FORMATS[name](value))
        elif isinstance(value, int):
            parts.append(f"{name} {value}")
        else:
            parts.append(f"{name} {value:.4g}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------------
# TensorBoard event files
# ---------------------------------------------------------------------------------------------------

_event_files = itertools.count()  # with the pid, a unique file name even for two writers in one second


class _RemoteFile:
    """A file on an object store written by appending: the bytes are kept here and the whole object is
    rewritten on flush (at most every REMOTE_REWRITE_SECONDS) and on close. Starts from the object's
    current contents when `keep_existing`."""

    def __init__(self, target: str, keep_existing: bool = False, clock: Callable[[], float] = time.monotonic):
        self.target = target
        self._path = epath.Path(target)
        self._data = bytearray(self._path.read_bytes() if keep_existing and self._path.exists() else b"")
        self._clock = clock
        self._written_at = None  # when the object was last rewritten
        self._dirty = True

    def write(self, data: bytes) -> None:
        self._data += data
        self._dirty = True

    def flush(self, force: bool = False) -> None:
        now = self._clock()
        if not self._dirty or (not force and self._written_at is not None
                               and now - self._written_at < REMOTE_REWRITE_SECONDS):
            return
        self._path.write_bytes(bytes(self._data))
        self._written_at, self._dirty = now, False

    def close(self) -> None:
        self.flush(force=True)


class _RemoteRecordWriterFactory:
    """tensorboardX's hook for event files on other file systems (record_writer.register_writer_factory),
    here through etils.epath: its own gs:// writer needs google-cloud-storage, which bertjax does not."""

    def open(self, path: str) -> _RemoteFile:
        return _RemoteFile(path)

    def directory_check(self, path: str) -> None:
        pass  # object stores have no directories to create


def _register_remote_event_files(directory: str) -> None:
    from tensorboardX import record_writer  # imports torch: at first use (EventFileWriter)

    record_writer.register_writer_factory(directory.split("://", 1)[0], _RemoteRecordWriterFactory())


class EventFileWriter:
    """Summaries in one TensorBoard event file, `events.out.tfevents.<time>.<host>.<pid>.<n>.bertjax`.

    Written with tensorboardX's synchronous writer, so each `add_scalars` is on disk when it returns
    and a killed run keeps every step it logged. tensorboardX is imported here, not with the module:
    it imports PyTorch when that is installed, which a run that logs no events should not pay for.
    """

    def __init__(self, directory: str):
        from tensorboardX.event_file_writer import EventsWriter  # imports torch: at first use (EventFileWriter)

        if files.is_remote(directory):
            _register_remote_event_files(directory)
        else:
            os.makedirs(directory, exist_ok=True)
        # TensorBoard reads a directory's files in name order, the order a resume's SessionLog START relies
        # on: the counter is zero-padded so that a process's 10th file sorts after its 9th in the same second.
        suffix = f".{os.getpid()}.{next(_event_files):06d}.bertjax"
        self._writer = EventsWriter(files.join(directory, "events"), filename_suffix=suffix)
        self._writer.flush()  # the file-version record: TensorBoard reads a file only after it
        (name,) = [p.name for p in epath.Path(directory).iterdir()
                   if p.name.startswith("events.out.tfevents.") and p.name.endswith(suffix)]
        self.path = files.join(directory, name)

    def add_summary(self, step: int, summary, wall_time: float | None = None) -> None:
        """Write one `Summary` protocol buffer (tensorboardX.proto.summary_pb2) as the event of `step`."""
        from tensorboardX.proto.event_pb2 import Event  # imports torch: at first use (EventFileWriter)

        wall_time = time.time() if wall_time is None else wall_time
        self._writer.write_event(Event(wall_time=wall_time, step=int(step), summary=summary))
        self._writer.flush()

    def add_session_start(self, step: int) -> None:
        """Mark a restart at `step`: TensorBoard drops what earlier files logged at this step and later,
        the steps a resumed run logs again."""
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # imports torch: at first use (EventFileWriter)

        self._writer.write_event(Event(wall_time=time.time(), step=int(step),
                                       session_log=SessionLog(status=SessionLog.START)))
        self._writer.flush()

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
        """All of a step's scalars in one event. Values beyond the float32 range become infinities."""
        from tensorboardX.proto.summary_pb2 import Summary  # imports torch: at first use (EventFileWriter)

        values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars.items()]
        self.add_summary(step, Summary(value=values), wall_time)

    def close(self) -> None:
        self._writer.close()


def _flat_config(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"data": {"seed": 0}} -> {"data.seed": 0}; values hparams cannot hold (lists, None) as text."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flat_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


# ---------------------------------------------------------------------------------------------------
# The writer the trainer calls
# ---------------------------------------------------------------------------------------------------

_RESERVED_FIELDS = ("step", "split", "wall_time", "resumed_from")


def _plain_number(name: str, value) -> int | float:
    """A Python int or float from a Python, NumPy or JAX scalar (a JAX array is fetched from the device)."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"metric {name!r} has shape {array.shape}: metrics must be scalars")
    if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        return int(array.reshape(()))
    return float(array.reshape(()))


def _json_number(value: int | float) -> int | float | None:
    # JSON has no NaN or infinity (json.dumps would write the invalid token NaN): they become null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricWriter:
    """Each logged step to metrics.jsonl, the console and TensorBoard; one per training run.

        with MetricWriter(workdir, enabled=jax.process_index() == 0) as writer:
            writer.write(step, {"loss": 6.2, "learning_rate": 1e-4, ...})
            writer.write(step, {"loss": 6.4, "mlm_accuracy": 0.12}, split="eval")

    metrics.jsonl gets one object per call: {"step", "split" (only when given), "wall_time" (Unix
    seconds), then the metrics as plain numbers, NaN and infinities as null}. Files are opened for
    appending, so a resumed run continues them. Each write is flushed, so a killed run loses nothing it
    wrote. `enabled=False` (every process but the first) writes nothing, not even the directories.
    """

    def __init__(self, workdir: str, *, enabled: bool = True, console: bool = True, tensorboard: bool = True):
        self.workdir = workdir
        self.enabled = enabled
        self.console = console
        self.tensorboard = tensorboard
        self._event_writers: dict[str | None, EventFileWriter] = {}  # by split; None is training
        self._jsonl = None
        self._closed = False
        self._resumed_at = None  # the step a resumed run restarted from
        self._resume_note = None  # put on the next training line, then cleared
        if enabled:
            files.path(workdir).mkdir(parents=True, exist_ok=True)
            self._jsonl = self._open_jsonl()

    def _open_jsonl(self):
        target = files.join(self.workdir, "metrics.jsonl")
        if files.is_remote(target):
            return _RemoteFile(target, keep_existing=True)
        return open(target, "ab")

    def write(self, step: int, metrics: Mapping[str, float], split: str | None = None) -> None:
        """Log `metrics` at `step`; `split` names an evaluation split (None for training)."""
        if self._closed:
            raise ValueError("MetricWriter.write after close()")
        if not self.enabled:
            return
        reserved = sorted(set(metrics) & set(_RESERVED_FIELDS))
        if reserved:
            raise ValueError(f"metric names {reserved} are reserved for metrics.jsonl's own fields")
        if split is not None:
            _check_split_name(split)
        step = int(step)
        values = {name: _plain_number(name, value) for name, value in metrics.items()}
        wall_time = time.time()

        record = {"step": step}
        if split is not None:
            record["split"] = split
        record["wall_time"] = round(wall_time, 3)
        if split is None and self._resume_note is not None:
            record["resumed_from"], self._resume_note = self._resume_note, None
        record.update({name: _json_number(value) for name, value in values.items()})
        self._jsonl.write((json.dumps(record, allow_nan=False) + "\n").encode("utf-8"))
        self._jsonl.flush()

        if self.console:
            # Printed, not logged: training runs keep library INFO logs (Orbax's are many) off by default.
            print(format_console_line(step, values, split), flush=True)
        if self.tensorboard and values:
            self._event_writer(split).add_scalars(step, values, wall_time)

    def resumed(self, step: int) -> None:
        """The run resumed from the checkpoint of `step`: metrics.jsonl keeps its lines up to that step,
        the next training line carries "resumed_from": step, and TensorBoard drops the later steps of
        the earlier run, so every step is logged once."""
        if not self.enabled:
            return
        self._jsonl.close()
        target = files.join(self.workdir, "metrics.jsonl")
        lines = epath.Path(target).read_bytes().decode("utf-8").split("\n")
        kept = "".join(line + "\n" for line in lines if line.strip() and json.loads(line).get("step", 0) <= step)
        files.write_bytes(target, kept.encode("utf-8"))
        self._jsonl = self._open_jsonl()
        self._resumed_at = self._resume_note = int(step)
        for writer in self._event_writers.values():
            writer.add_session_start(step + 1)

    def write_config(self, config: Mapping) -> None:
        """Record the run's config (a nested dict, e.g. `config.to_dict()`): whole in workdir/config.json,
        and in TensorBoard as one text summary (JSON, shown in the Text tab) and as hyperparameters (the
        HParams tab, keys flattened to "section.key"). Call once, at the start of a run."""
        if self._closed:
            raise ValueError("MetricWriter.write_config after close()")
        if not self.enabled:
            return
        workdirs.write_config(self.workdir, config)
        if not self.tensorboard:
            return
        from tensorboardX import summary  # imports torch: at first use (EventFileWriter)

        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        writer = self._event_writer(None)
        # Indented four spaces: TensorBoard renders text summaries as Markdown, and this keeps it verbatim.
        writer.add_summary(0, summary.text("config", "\n".join("    " + line for line in text.splitlines())))
        # The session-end record is left out: the run has only begun.
        experiment, start, _ = summary.hparams(_flat_config(config), {"loss": None, "mlm_accuracy": None})
        writer.add_summary(0, experiment)
        writer.add_summary(0, start)

    def _event_writer(self, split: str | None) -> EventFileWriter:
        if split not in self._event_writers:
            directory = files.join(self.workdir, "tensorboard", *([split] if split is not None else []))
            self._event_writers[split] = EventFileWriter(directory)
            if self._resumed_at is not None:
                self._event_writers[split].add_session_start(self._resumed_at + 1)
        return self._event_writers[split]

    def close(self) -> None:
        """Close every file; calling it twice is harmless."""
        if self._closed:
            return
        self._closed = True
        for writer in self._event_writers.values():
            writer.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _check_split_name(split: str) -> None:
    # The split becomes a directory under tensorboard/: one plain name, never a path.
    if not split or split in (".", "..") or "/" in split or os.sep in split:
        raise ValueError(f"split={split!r} must be a plain name such as 'eval' (it names a TensorBoard directory)")
