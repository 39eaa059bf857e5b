"""Orbax checkpoints of a run: parameters, optimizer state, and what the data stream needs to resume.

Layout: WORKDIR/checkpoints/<step>/{params, opt_state, meta}. `params` alone is what `init_from` and
`bertjax.load` read; `meta` (JSON) holds the step, the model config and the data position.

The one restore order (train.py follows it):
  1. this workdir's latest readable checkpoint (a run that was stopped or preempted resumes);
  2. else config.train.init_from: parameters only, from a bertjax workdir/checkpoint or a Hugging
     Face directory (phase 2 of a two-phase recipe, or continued pretraining);
  3. else a fresh initialisation.
"""

import dataclasses
import os
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

ITEMS = ("params", "opt_state", "meta")
CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
    if "://" in workdir:  # gs://bucket/run, what pods share: abspath would make it a local ./gs:/ path
        return workdir.rstrip("/") + "/" + CHECKPOINT_DIR
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


@dataclasses.dataclass
class Restored:
    step: int
    params: Any
    opt_state: Any
    meta: dict


class Checkpointer:
    """Saves every `every_steps` steps (and when forced), keeps the last `keep`, asynchronously: the
    next training steps run while the arrays are written."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every_steps, max_to_keep=keep, enable_async_checkpointing=async_save, create=True
        )
        self.directory = checkpoint_dir(workdir)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def save(self, step: int, params, opt_state, meta: dict, force: bool = False) -> bool:
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta),
        )
        return self.manager.save(step, args=args, force=force)

    def restore_latest(self, abstract_params, abstract_opt_state) -> Restored | None:
        """The newest checkpoint that reads back whole, restored straight into the target shardings
        (the abstract trees are jax.ShapeDtypeStructs carrying them). An unreadable newer checkpoint
        is reported and moved aside (kept, for a post-mortem) and the one before it is used."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract_params),
                    opt_state=ocp.args.StandardRestore(abstract_opt_state),
                    meta=ocp.args.JsonRestore(),
                ))
            except Exception as e:  # noqa: BLE001 -- any failure to read means: use the previous one
                reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                logging.error("checkpoint %s/%d is unreadable (%s): falling back to the previous one",
                              self.directory, step, reason)
                print(f"warning: checkpoint at step {step} is unreadable ({reason}); using the previous one",
                      flush=True)
                self._set_aside(step)
                continue
            return Restored(step, restored.params, restored.opt_state, dict(restored.meta))
        return None

    def _set_aside(self, step: int) -> None:
        """Rename a broken checkpoint so that it is neither restored nor overwritten by a later save."""
        if jax.process_index() == 0:
            src = epath.Path(self.directory) / str(step)
            dst = epath.Path(self.directory) / f"unreadable-{step}-{int(time.time())}"
            if src.exists():
                src.rename(dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"bertjax-set-aside-{step}")
        self.manager.reload()

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def find_checkpoint(path: str) -> tuple[str, int]:
    """A workdir, its checkpoints directory, or one step's directory -> (checkpoints dir, step)."""
    p = epath.Path(path)
    if (p / CHECKPOINT_DIR).is_dir():
        p = p / CHECKPOINT_DIR
    if (p / "params").is_dir() and p.name.isdigit():
        return str(p.parent), int(p.name)
    steps = sorted(int(c.name) for c in p.iterdir() if c.name.isdigit()) if p.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"no bertjax checkpoint in {path}: expected a workdir, its checkpoints/ or a step directory")
    return str(p), steps[-1]


def is_checkpoint(path: str) -> bool:
    try:
        find_checkpoint(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def restore_params(path: str, abstract_params=None) -> tuple[Any, dict]:
    """Parameters and meta of the newest checkpoint under `path`. With abstract_params (ShapeDtypeStructs
    with shardings) they are restored straight into that layout; without, onto the default device."""
    directory, step = find_checkpoint(path)
    # Handlers named up front: with item_names alone, item_metadata() returns None for params (no
    # handler is known before a restore), the target tree below came out None, and Orbax then restored
    # onto the saving run's devices -- which fails for a checkpoint of a multi-process or multi-device run.
    manager = ocp.CheckpointManager(directory, item_handlers={"params": ocp.StandardCheckpointHandler(),
                                                              "meta": ocp.JsonCheckpointHandler()},
                                    options=ocp.CheckpointManagerOptions(read_only=True, create=False))
    if abstract_params is None:
        saved = manager.item_metadata(step)["params"]
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract_params = jax.tree_util.tree_map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
    restored = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()))
    manager.close()
    return restored.params, dict(restored.meta)
