"""SIGTERM and Ctrl-C as requests to save and stop, for any program's loop (loop.Hooks.preemption)."""

import os
import signal
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils


class Preemption:
    """SIGTERM (a preempted VM, a cancelled job) or Ctrl-C asks the loop to save and exit; it is not
    obeyed mid-step. A second Ctrl-C stops at once, without saving.

    A context manager: its handlers are installed on entry (the loop enters it for its duration) and
    the previous ones restored on exit, so that Ctrl-C outside the steps interrupts as usual.

    With several processes, all of them must stop at the same step. JAX's preemption service (started
    by jax.distributed.initialize) catches SIGTERM itself and agrees on that step through the
    coordination service, so asking costs no device synchronisation per step; Ctrl-C on any process is
    turned into that process's SIGTERM."""

    def __init__(self):
        self.requested = None  # the signal that asked this process, once one has
        self._synced = jax.process_count() > 1 and jax.config.jax_enable_preemption_service
        self._previous = {}

    def __enter__(self) -> "Preemption":
        signals = (signal.SIGINT,) if self._synced else (signal.SIGTERM, signal.SIGINT)
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handler(self, signum, frame):
        if signum == signal.SIGINT and self.requested == signal.SIGINT:
            print("second Ctrl-C: stopped without saving; the last checkpoint stays the one to resume from",
                  file=sys.stderr, flush=True)
            os._exit(130)
        if signum == signal.SIGINT:
            print("Ctrl-C: saving a checkpoint after this step, then stopping (Ctrl-C again stops at once)",
                  file=sys.stderr, flush=True)
        self.requested = signum
        if self._synced:
            signal.raise_signal(signal.SIGTERM)  # reaches the preemption service's own handler

    @property
    def interrupted(self) -> bool:
        return self.requested == signal.SIGINT

    @property
    def exit_code(self) -> int:
        """What the program exits with once it has saved: 130 after Ctrl-C, 0 after SIGTERM (the job
        was asked to stop and did so cleanly)."""
        return 130 if self.interrupted else 0

    @property
    def name(self) -> str:
        return "Ctrl-C" if self.interrupted else "SIGTERM"

    def should_stop(self, step: int) -> bool:
        """Called after every step, on every process, with the same step numbers."""
        if self._synced:
            return multihost_utils.reached_preemption_sync_point(step)
        if jax.process_count() == 1:
            return self.requested is not None
        # Several processes without the preemption service (jax_enable_preemption_service=False).
        return bool(np.any(multihost_utils.process_allgather(np.array(self.requested is not None))))
