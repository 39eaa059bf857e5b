"""What the training program logs, and how fast it runs: metric writer, throughput, FLOPs and MFU.

One `MetricWriter` takes each logged step to three places:
  - `workdir/metrics.jsonl`, one JSON object per call, for tools and for the README results table;
  - one compact console line (absl logging, so it sits in order with the trainer's other messages);
  - TensorBoard event files, `workdir/tensorboard/` for training and `workdir/tensorboard/<split>/` for
    an evaluation split, so TensorBoard overlays train and eval curves of the same tag as two runs.

This module imports only the standard library, numpy and absl. The event files are written here
byte by byte (TFRecord framing around hand-encoded `Event` protocol buffers) rather than through
TensorFlow or tensorboard, because the synthetic-data benchmark runs on accelerator machines that have
no TensorFlow, and because TensorFlow on an accelerator host would claim its memory. The tests read the
files back with TensorFlow's own reader.

Paths are local (or mounted) file system paths: writing to gs:// would need TensorFlow's gfile.
"""

import json
import math
import os
import socket
import struct
import time
from typing import Callable, Mapping

import numpy as np

# ---------------------------------------------------------------------------------------------------
# FLOPs and MFU
# ---------------------------------------------------------------------------------------------------


def train_flops_per_token(
    num_layers: int, hidden_size: int, seq_len: int, vocab_size: int, predicted_fraction: float
) -> float:
    """Training FLOPs (forward + backward) per real token of BERT pretraining.

        6 * 12*L*H^2  +  12*L*S*H  +  6*p*(H^2 + H*V)

    - 12*L*H^2 is the multiply-accumulate count of a token's dense layers: the q, k, v and output
      projections (4*H^2) and the feed-forward layer with F = 4H (8*H^2). Two FLOPs per
      multiply-accumulate forward and four backward make the factor 6.
    - 12*L*S*H is attention over S keys: Q.K^T and probabilities.V are 2*S*H FLOPs each per token and
      layer forward, 4*S*H, and three times that with the backward pass. The formula is read as written
      (not 6*L*S*H, the causal halving, nor 12*L*S^2*H, a per-sequence count): it is what reproduces
      the reference numbers below.
    - the masked-LM head (transform H*H, tied decoder H*V) runs only at the predicted positions, a
      fraction p = predictions per sequence / S of the positions: 20/128 and 80/512 in BERT's recipes.
      Pass the measured fraction where not every prediction slot is filled.
    Not counted: embedding lookups (gathers, not matmuls), the pooler and NSP head (once per sequence),
    softmax, LayerNorm and other element-wise work. Attention is charged at the padded length S.

    Reference values (tested within 1%): BERT-base at S=128, p=20/128: 546 MFLOP/token;
    BERT-large at S=128: 1.88 GFLOP/token; BERT-large at S=512, p=80/512: 1.99 GFLOP/token.
    """
    if min(num_layers, hidden_size, seq_len, vocab_size) <= 0:
        raise ValueError(
            f"model dimensions must be positive: num_layers={num_layers}, hidden_size={hidden_size}, "
            f"seq_len={seq_len}, vocab_size={vocab_size}"
        )
    if not 0.0 <= predicted_fraction <= 1.0:
        raise ValueError(f"predicted_fraction={predicted_fraction} must lie in [0, 1]")
    L, H, S, V = num_layers, hidden_size, seq_len, vocab_size
    dense = 6 * 12 * L * H * H
    attention = 12 * L * S * H
    mlm_head = 6 * predicted_fraction * (H * H + H * V)
    return float(dense + attention + mlm_head)


# Dense (no structured sparsity) bfloat16 peak FLOP/s of one JAX device, matched as a case-insensitive
# substring of `jax.Device.device_kind`. The first matching row wins, so the more specific names come
# first ("tpu v5 lite" before "tpu v5", "h100 pcie" before "h100"). A row with peak None names a device
# that would otherwise match a wrong row. NVIDIA datasheets quote bf16 "with sparsity"; the dense peak is
# half of that. On TPU v4 and v5p a JAX device is a whole chip (megacore), on v5e and v6e a chip has one
# TensorCore, so the per-chip figures are per-device figures.
PEAK_BF16_FLOPS = (
    # NVIDIA H100 datasheet: SXM 1,979, PCIe 1,513, NVL 1,671 TFLOPS bf16 with sparsity.
    # device_kind of the SXM part is "NVIDIA H100 80GB HBM3".
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),
    # NVIDIA H200 datasheet: SXM 1,979, NVL 1,671 TFLOPS bf16 with sparsity. Also matches GH200.
    ("h200 nvl", 835e12),
    ("h200", 989e12),
    # NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, SXM4 and PCIe, 40 and 80 GB alike.
    ("a100", 312e12),
    # Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e), bf16 per chip.
    ("tpu v4 lite", None),  # v4i, an inference chip; "tpu v4" below would claim it
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),  # v5e's device_kind
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),  # v5p's device_kind is plain "TPU v5"
    ("tpu v6 lite", 918e12),  # v6e (Trillium)
    ("tpu v6e", 918e12),
)


def peak_flops_per_device(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device of this `jax.Device.device_kind`, or None when unknown (CPU)."""
    kind = device_kind.lower()
    for pattern, peak in PEAK_BF16_FLOPS:
        if pattern in kind:
            return peak
    return None


def mfu(tokens_per_second: float, flops_per_token: float, num_devices: int, peak_per_device: float) -> float:
    """Model FLOPs utilisation: the fraction of the devices' dense peak that the model's FLOPs use.

    Counts the model's FLOPs (`train_flops_per_token` per real token), not the hardware's: work that
    rematerialisation recomputes or that padding wastes lowers MFU, as it should.
    """
    if num_devices <= 0:
        raise ValueError(f"num_devices={num_devices} must be positive")
    if peak_per_device is None or peak_per_device <= 0:
        raise ValueError(
            f"peak_per_device={peak_per_device}: MFU needs a known peak (peak_flops_per_device returned None?)"
        )
    return tokens_per_second * flops_per_token / (num_devices * peak_per_device)


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
    "learning_rate": lambda v: f"lr {v:.1e}",
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
# TensorBoard event files, without TensorFlow
# ---------------------------------------------------------------------------------------------------


def _crc32c_table() -> tuple[int, ...]:
    # CRC-32C (Castagnoli), reflected: the polynomial 0x1EDC6F41 bit-reversed is 0x82F63B78.
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of `data`, the checksum TFRecord files use. crc32c(b"123456789") == 0xE3069283."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC as TFRecord stores it: rotated and offset, so that CRCs of data holding CRCs stay strong."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: uint64 length, masked CRC of the length, the data, masked CRC of the data (little-endian)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


# Protocol buffer wire format: a field is a varint key (field number << 3 | wire type) and a value.
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are encoded as their 64-bit two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == _LENGTH_DELIMITED:
        return key + _varint(len(payload)) + payload
    return key + payload


def _float32(value: float) -> bytes:
    # struct refuses finite values beyond the float32 range; they round to infinity, as in a cast.
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        value = math.copysign(math.inf, value)
    return struct.pack("<f", value)


def _summary_value(tag: str, value: float) -> bytes:
    # tensorflow/core/framework/summary.proto, Summary.Value: tag = 1, simple_value = 2.
    return _field(1, _LENGTH_DELIMITED, tag.encode("utf-8")) + _field(2, _FIXED32, _float32(value))


def _event(wall_time: float, step: int, *, file_version: str | None = None, scalars=None) -> bytes:
    """tensorflow/core/util/event.proto, Event: wall_time = 1, step = 2, file_version = 3, summary = 5."""
    out = _field(1, _FIXED64, struct.pack("<d", wall_time)) + _field(2, _VARINT, _varint(step))
    if file_version is not None:
        out += _field(3, _LENGTH_DELIMITED, file_version.encode("utf-8"))
    if scalars is not None:
        # Summary: repeated Summary.Value value = 1. All of a step's scalars travel in one event.
        summary = b"".join(_field(1, _LENGTH_DELIMITED, _summary_value(tag, v)) for tag, v in scalars.items())
        out += _field(5, _LENGTH_DELIMITED, summary)
    return out


class EventFileWriter:
    """Scalar summaries in one TensorBoard event file, `events.out.tfevents.<time>.<host>.bertjax`.

    The first record is the file version, as TensorFlow writes it; TensorBoard reads a file only
    after it. Each `add_scalars` is flushed, so a killed run keeps every step it logged.
    """

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        now = time.time()
        self.path = os.path.join(directory, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.bertjax")
        # Append: a writer created in the same second (a quick restart) continues the file; a second
        # file-version record in the middle of a file is read as a harmless event.
        self._file = open(self.path, "ab")
        self._file.write(tfrecord(_event(now, 0, file_version="brain.Event:2")))
        self._file.flush()

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
        wall_time = time.time() if wall_time is None else wall_time
        self._file.write(tfrecord(_event(wall_time, step, scalars=scalars)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------------
# The writer the trainer calls
# ---------------------------------------------------------------------------------------------------

_RESERVED_FIELDS = ("step", "split", "wall_time")


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
        if enabled:
            os.makedirs(workdir, exist_ok=True)
            self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")

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
        record.update({name: _json_number(value) for name, value in values.items()})
        self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
        self._jsonl.flush()

        if self.console:
            # Printed, not logged: training runs keep library INFO logs (Orbax's are many) off by default.
            print(format_console_line(step, values, split), flush=True)
        if self.tensorboard and values:
            self._event_writer(split).add_scalars(step, values, wall_time)

    def _event_writer(self, split: str | None) -> EventFileWriter:
        if split not in self._event_writers:
            directory = os.path.join(self.workdir, "tensorboard", *([split] if split is not None else []))
            self._event_writers[split] = EventFileWriter(directory)
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
