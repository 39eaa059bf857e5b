"""The process's environment, set before JAX or TensorFlow start: the one place third-party start-up noise
is turned off. `import bertjax` runs it, so every program and `bertjax.load` go through it; it imports
nothing heavy.

What it silences, and only that (a message the user can act on still shows):
  - libtpu's probe of a TPU VM's metadata on a machine with no TPU chips (libtpu comes with the test and
    tpu-plan extras): two error-level lines about worker hostnames and accelerator types. Where the
    machine has TPU chips, or the variables are set, nothing is changed.
  - TensorFlow's native INFO and WARNING logs (TF_CPP_MIN_LOG_LEVEL=2; the user's own setting wins); its
    errors still show, and its start-up lines that print whatever that says are dropped where TensorFlow
    is imported (bertjax/text/tf_cpu.py).
  - Orbax's warnings that a checkpoint holds items a restore did not ask for, and that a read-only manager
    is read-only: reading the parameters alone (bertjax.load, init_from, export) is what those mean to do.
"""

import glob
import logging
import os

from absl import logging as absl_logging  # light; and it must make the "absl" logger itself (its caller lookup)

# What the TPU planner (bench/tpu_plan.py) sets too: no metadata server, one local worker.
_NO_TPU_PROBE = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-8", "TPU_WORKER_HOSTNAMES": "localhost"}
_ORBAX_UNASKED = ("was found in the checkpoint, but could not be restored",
                  # bertjax's own read-only checkpoint managers (bertjax.load, init_from, export) say what they are
                  "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0",
                  "Given directory is read only=")


def _has_tpu_chips() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_start_up() -> None:
    """Set the variables above where the user has not, and drop Orbax's unasked-item warnings."""
    if not _has_tpu_chips() and not any(name in os.environ for name in _NO_TPU_PROBE):
        os.environ.update(_NO_TPU_PROBE)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    absl_logger = absl_logging.get_absl_logger()
    if not any(getattr(f, "drops_unasked_items", False) for f in absl_logger.filters):
        absl_logger.addFilter(_drop_unasked_items)


def _drop_unasked_items(record: logging.LogRecord) -> bool:
    return not any(text in record.getMessage() for text in _ORBAX_UNASKED)


_drop_unasked_items.drops_unasked_items = True
