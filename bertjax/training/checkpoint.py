"""Orbax checkpoints of a run: parameters, optimizer state, and what the data stream needs to resume.

Layout: WORKDIR/checkpoints/<step>/{params, opt_state, meta}, and `fp8` in a model.matmul_dtype=fp8 run
(its scaling state: amax histories and scales). `params` alone is what `init_from` and `bertjax.load` read
(a new phase with train.init_from_optimizer reads `opt_state` too); `meta` (JSON) holds the step, the
model config, the data position and the run's config.

The one restore order (train.py follows it):
  1. this workdir's latest readable checkpoint (a run that was stopped or preempted resumes);
  2. else config.train.init_from: parameters (and with train.init_from_optimizer the optimizer state),
     from a bertjax workdir/checkpoint or a Hugging Face directory (a new phase of a recipe, or
     continued pretraining);
  3. else a fresh initialisation.
"""

import dataclasses
import os
import sys
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bertjax.text import files
from bertjax.training.checkpoint_meta import CheckpointMeta

ITEMS = ("params", "opt_state", "meta")
FP8_ITEM = "fp8"  # an fp8 run's scaling state (TrainState.fp8), beside the items every run saves
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"  # a fine-tuning run's best dev checkpoint: params and meta only


def checkpoint_dir(workdir: str) -> str:
    return files.join(workdir, CHECKPOINT_DIR)


class SaveFailed(ValueError):
    """A checkpoint could not be written: the run stops with this one line."""


class CheckpointMismatch(ValueError):
    """A readable checkpoint holds another model or optimizer than the config's: the run stops with this
    one line and every checkpoint stays where it is (only unreadable files are ever set aside)."""


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def remove_partial_saves(directory: str, quiet_seconds: float = 0.0, attempts: int = 40) -> list[str]:
    """Delete the temporary directories of saves that never finished (Orbax writes a step under a
    temporary name and renames it when complete). Process 0 only.

    After a failed save, tensorstore's writes that were already in flight go on in its own threads (Orbax
    cannot join them): a removal can meet a file created after its listing ("Directory not empty"), and a
    late write can re-create the directory. So each removal is retried until the directory is gone and
    stays gone for quiet_seconds; what cannot be removed in `attempts` tries raises OSError."""
    removed = []
    root = epath.Path(directory)
    if jax.process_index() != 0 or not root.exists():
        return removed

    def partial_saves():
        return [child for child in root.iterdir() if ".orbax-checkpoint-tmp" in child.name]

    for _ in range(attempts):
        failed = False
        for child in partial_saves():
            try:
                child.rmtree(missing_ok=True)
            except OSError:  # a writer added a file during the walk: the next attempt takes it
                failed = True
                continue
            if child.name not in removed:
                removed.append(child.name)
        if not failed:
            if quiet_seconds == 0:
                return removed
            time.sleep(quiet_seconds)  # a late write re-creates the directory within this
            if not partial_saves():
                return removed
        else:
            time.sleep(0.05)
    raise OSError(f"could not remove the partial checkpoint(s) {[c.name for c in partial_saves()]} in "
                  f"{directory}: delete them by hand")


@dataclasses.dataclass
class Restored:
    step: int
    params: Any
    opt_state: Any
    meta: CheckpointMeta
    fp8: Any = None  # the saved fp8 scaling state, where asked for and saved


class Checkpointer:
    """Saves every `every_steps` steps (and when forced), keeps the last `keep`, asynchronously: the
    next training steps run while the arrays are written."""

    def __init__(self, workdir: str, *, every_steps: int, keep: int, async_save: bool = True,
                 bytes_per_checkpoint: int | None = None):
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every_steps, max_to_keep=keep, enable_async_checkpointing=async_save, create=True
        )
        self.directory = checkpoint_dir(workdir)
        self.bytes_per_checkpoint = bytes_per_checkpoint  # for the message when a save fails
        remove_partial_saves(self.directory)  # of a run that died while saving
        _drop_closed_loop_reports()
        # Handlers named up front, so that item_metadata() describes the arrays before any restore.
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
            "params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(), FP8_ITEM: ocp.StandardCheckpointHandler()})

    def save(self, step: int, params, opt_state, meta: CheckpointMeta, force: bool = False, fp8=None) -> bool:
        """fp8: TrainState.fp8; None (every run but model.matmul_dtype=fp8's) saves no such item."""
        items = {} if fp8 is None else {FP8_ITEM: ocp.args.StandardSave(fp8)}
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta.replace(step=step).to_json()),
            **items,
        )
        try:
            return self.manager.save(step, args=args, force=force)
        except Exception as e:  # noqa: BLE001 -- a save that cannot be written stops the run
            raise self._save_failed(e) from None

    def restore_latest(self, abstract_params, abstract_opt_state,
                       check_meta: Callable[[int, CheckpointMeta], None] | None = None,
                       abstract_fp8=None) -> Restored | None:
        """The newest checkpoint that reads back whole, restored straight into the target shardings
        (the abstract trees are jax.ShapeDtypeStructs carrying them). Its meta is read first and given
        to check_meta(step, meta), which raises ValueError when the checkpoint does not fit the config:
        that stops the run and leaves every checkpoint as it is. Only a checkpoint that cannot be read
        is reported and moved aside (kept, for a post-mortem), and the one before it is used.

        abstract_fp8 (an fp8 run's): its saved scaling state is restored too, as Restored.fp8; a
        checkpoint saved without one (a run with model.matmul_dtype=default) gives None, and the run
        starts its scaling state afresh."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                meta = CheckpointMeta.from_json(
                    self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
            except Exception as e:  # noqa: BLE001 -- any failure to read means: use the previous one
                self._unreadable(step, e)
                continue
            if check_meta is not None:
                check_meta(step, meta)
            items = {"params": abstract_params, "opt_state": abstract_opt_state}
            if abstract_fp8 is not None and (epath.Path(self.directory) / str(step) / FP8_ITEM).is_dir():
                items[FP8_ITEM] = abstract_fp8
            try:
                saved = self.manager.item_metadata(step)
                saved_shapes = {item: leaf_shapes(getattr(saved[item], "tree", saved[item])) for item in items}
            except Exception as e:  # noqa: BLE001 -- array metadata that cannot be read: unreadable
                self._unreadable(step, e)
                continue
            # Readable but of other shapes: the config's model or optimizer is not the checkpoint's.
            check_same_arrays(step, saved_shapes, {item: leaf_shapes(tree) for item, tree in items.items()})
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    **{item: ocp.args.StandardRestore(tree) for item, tree in items.items()}))
            except Exception as e:  # noqa: BLE001
                self._unreadable(step, e)
                continue
            return Restored(step, restored.params, restored.opt_state, meta,
                            restored[FP8_ITEM] if FP8_ITEM in items else None)
        return None

    def _unreadable(self, step: int, error: Exception) -> None:
        """Files that cannot be read: reported, and the checkpoint moved aside for a post-mortem."""
        reason = first_line(error)
        logging.error("checkpoint %s/%d is unreadable (%s): falling back to the previous one",
                      self.directory, step, reason)
        print(f"warning: checkpoint at step {step} is unreadable ({reason}); using the previous one", flush=True)
        self._set_aside(step)

    def check_for_errors(self) -> None:
        """Raise SaveFailed, with what to do, if a background save has failed; its partial files are
        removed and the checkpoints before it stay usable."""
        try:
            self.manager.check_for_errors()
        except Exception as e:  # noqa: BLE001 -- whatever the storage said, the run must stop here
            raise self._save_failed(e) from None

    def _save_failed(self, error: Exception) -> "SaveFailed":
        try:  # let the save's other writer threads end before its partial files are removed
            self.manager.wait_until_finished()
        except Exception:  # noqa: BLE001 -- the same failure, already in hand
            pass
        try:
            removed, stuck = remove_partial_saves(self.directory, quiet_seconds=0.5), ""
        except OSError as e:
            removed, stuck = [], f"; {e}"
        good = [s for s in self.manager.all_steps() if (epath.Path(self.directory) / str(s)).exists()]
        size = ("" if self.bytes_per_checkpoint is None
                else f"; a checkpoint needs about {_size(self.bytes_per_checkpoint)}")
        last = f"the last good checkpoint is step {max(good)}" if good else "no checkpoint was completed"
        reason = "no space left on device" if "No space left on device" in str(error) else first_line(error)
        return SaveFailed(f"saving a checkpoint to {self.directory} failed ({reason}){size}; {last}"
                          f"{' (partial files removed)' if removed else ''}{stuck}: free space or choose another "
                          f"workdir, then re-run the same command to resume")

    def _set_aside(self, step: int) -> None:
        """Rename a broken checkpoint so that it is neither restored nor overwritten by a later save."""
        if jax.process_index() == 0:
            src = epath.Path(self.directory) / str(step)
            dst = epath.Path(self.directory) / f"unreadable-{step}-{int(time.time())}"
            if src.exists():
                src.rename(dst)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"bertjax-set-aside-{step}")
        self.manager.reload()

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._save_failed(e) from None

    def close(self) -> None:
        self.manager.close()


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey (named tuples), SequenceKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def leaf_shapes(tree) -> dict[str, tuple]:
    """{"bert/encoder/layers_0/...": shape} of the arrays of a tree (arrays, ShapeDtypeStructs or Orbax's
    array metadata): named tuples and dicts give the same names, so a saved tree compares with a live one."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in flat}


def check_same_arrays(step: int, saved: dict[str, dict], expected: dict[str, dict]) -> None:
    """CheckpointMismatch naming the first differing arrays when a checkpoint's items (params,
    opt_state) are not the shapes the config's model and optimizer make."""
    differences = []
    for item, want in expected.items():
        have = saved[item]
        differences += [f"{item} {name} is not in the checkpoint" for name in want if name not in have]
        differences += [f"the checkpoint's {item} has {name}, the config's model does not" for name in have
                        if name not in want]
        differences += [f"{item} {name} is {have[name]} in the checkpoint, {want[name]} in the config"
                        for name in want if name in have and have[name] != want[name]]
    if differences:
        more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
        raise CheckpointMismatch(
            f"the checkpoint at step {step} is of another model or optimizer than the config: "
            f"{'; '.join(differences[:3])}{more}: use a new workdir, or train.init_from=<this workdir> in a new "
            "one for the parameters only (every checkpoint is left as it was)")


def _is_closed_loop_report(exc_type, exc, tb) -> bool:
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (exc_type is RuntimeError and str(exc) == "Event loop is closed" and tb is not None
            and tb.tb_frame.f_code.co_name == "_check_closed")


def _is_abandoned_write_report(obj) -> bool:
    """A coroutine of Orbax's writers (write_fragment, ...) left unfinished by a failed save."""
    code = getattr(obj, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _drop_closed_loop_reports() -> None:
    """When a background save fails, tensorstore's writes that were still in flight complete into the
    event loop Orbax has already closed, and each reports a "RuntimeError: Event loop is closed"
    traceback through sys.unraisablehook, possibly before the run notices the failure; Orbax's own
    writer coroutines that the failure abandoned are reported the same way. The failure itself is
    reported in one line (SaveFailed): drop those reports, and only those."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_reports", False):
        return

    def hook(unraisable):
        if not (_is_closed_loop_report(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
                or _is_abandoned_write_report(unraisable.object)):
            previous(unraisable)

    hook.drops_closed_loop_reports = True
    sys.unraisablehook = hook


def save_params(workdir: str, subdir: str, step: int, params, meta: CheckpointMeta) -> None:
    """WORKDIR/subdir/<step>/{params, meta}, written now, replacing the one there before (the best dev
    checkpoint of a fine-tuning run). restore_params(WORKDIR/subdir) reads it back."""
    directory = files.join(workdir, subdir)
    options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True, enable_async_checkpointing=False)
    manager = ocp.CheckpointManager(directory, options=options, item_names=("params", "meta"))
    try:
        manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                   meta=ocp.args.JsonSave(meta.replace(step=step).to_json())),
                     force=True)
        manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 -- a save that cannot be written stops the run
        raise SaveFailed(f"saving the checkpoint of step {step} to {directory} failed ({first_line(e)}): free "
                         f"space or choose another workdir") from None
    finally:
        manager.close()


def find_checkpoint(path: str) -> tuple[str, int]:
    """A workdir, its checkpoints directory, or one step's directory -> (checkpoints dir, step); a local
    directory comes back absolute, as Orbax requires."""
    p = epath.Path(path if files.is_remote(str(path)) else os.path.abspath(path))
    if (p / CHECKPOINT_DIR).is_dir():
        p = p / CHECKPOINT_DIR
    if (p / "params").is_dir() and p.name.isdigit():
        return str(p.parent), int(p.name)
    steps = sorted(int(c.name) for c in p.iterdir() if c.name.isdigit()) if p.is_dir() else []
    if not steps:
        raise FileNotFoundError(f"no bertjax checkpoint in {path}: expected a workdir, its checkpoints/ "
                                "or a step directory")
    return str(p), steps[-1]


def read_meta(path: str) -> CheckpointMeta:
    """The meta (step, model, tokenizer, task, ...) of the newest checkpoint under `path`, without its arrays."""
    directory, step = find_checkpoint(path)
    manager = ocp.CheckpointManager(directory, item_handlers={"meta": ocp.JsonCheckpointHandler()},
                                    options=ocp.CheckpointManagerOptions(read_only=True, create=False))
    try:
        restored = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return CheckpointMeta.from_json(restored.meta)
    finally:
        manager.close()


def workdir_of(path: str) -> str:
    """The run's workdir of a checkpoint path: the parent of its checkpoints/ (or best/) directory,
    wherever the workdir is now."""
    return str(epath.Path(find_checkpoint(path)[0]).parent)


def is_checkpoint(path: str) -> bool:
    try:
        find_checkpoint(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False


def restore_opt_state(path: str, abstract_opt_state, what: str = "train.init_from") -> tuple[Any, int]:
    """(optimizer state, step) of the newest checkpoint under `path`, restored straight into the layout of
    abstract_opt_state (ShapeDtypeStructs with shardings): a new phase that carries its parent's moments.
    A saved state of other arrays (another optimizer, clipping on in one and off in the other) is an error
    naming the first differences; `what` names the setting in it."""
    directory, step = find_checkpoint(path)
    if not (epath.Path(directory) / str(step) / "opt_state").is_dir():
        raise ValueError(f"{what}={path}: its checkpoint of step {step} holds no optimizer state (a fine-tuning "
                         "run's best one?): give a pretraining workdir, or set train.init_from_optimizer=False")
    manager = ocp.CheckpointManager(directory, item_handlers={"opt_state": ocp.StandardCheckpointHandler()},
                                    options=ocp.CheckpointManagerOptions(read_only=True, create=False))
    try:
        saved = manager.item_metadata(step)["opt_state"]
        have, want = leaf_shapes(getattr(saved, "tree", saved)), leaf_shapes(abstract_opt_state)
        if have != want:
            differ = ([f"{name} is {have[name]} there, {want[name]} here" for name in want if name in have
                       and have[name] != want[name]] + [f"{name} is not there" for name in want if name not in have]
                      + [f"it has {name}" for name in have if name not in want])
            raise CheckpointMismatch(f"{what}={path}: its optimizer state is not this config's "
                                     f"({'; '.join(differ[:3])}): give the optimizer section the parent's "
                                     "optimizer.name and clip_norm, or set train.init_from_optimizer=False")
        restored = manager.restore(step, args=ocp.args.Composite(
            opt_state=ocp.args.StandardRestore(abstract_opt_state)))
        return restored.opt_state, step
    finally:
        manager.close()


def on_default_device(saved_metadata):
    """The arrays a checkpoint's metadata describes, as restore targets on this process's first device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved_metadata)


def restore_saved_part(path: str, item: str, key: str):
    """item[key] (e.g. a student's projections, kept in "opt_state" under their key) of the newest checkpoint
    under `path`, as it was saved, on the default device; None where that checkpoint has no such part."""
    directory, step = find_checkpoint(path)
    if not (epath.Path(directory) / str(step) / item).is_dir():
        return None
    manager = ocp.CheckpointManager(directory, item_handlers={item: ocp.PyTreeCheckpointHandler()},
                                    options=ocp.CheckpointManagerOptions(read_only=True, create=False))
    try:
        saved = manager.item_metadata(step)[item]
        part = getattr(saved, "tree", saved).get(key)
        if part is None:
            return None
        target = {key: on_default_device(part)}
        restore_args = jax.tree_util.tree_map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
        restored = manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.PyTreeRestore(
            target, restore_args=restore_args, partial_restore=True)}))
        return restored[item][key]
    finally:
        manager.close()


def restore_params(path: str, abstract_params=None) -> tuple[Any, CheckpointMeta]:
    """Parameters and meta of the newest readable checkpoint under `path` (an unreadable newer one is
    reported and skipped, as training does, but left in place). With abstract_params (ShapeDtypeStructs
    with shardings) they are restored straight into that layout; without, onto the default device."""
    directory, newest = find_checkpoint(path)
    p = epath.Path(directory)
    steps = sorted((int(c.name) for c in p.iterdir() if c.name.isdigit() and int(c.name) <= newest), reverse=True)
    # Handlers named up front: with item_names alone, item_metadata() returns None for params (no
    # handler is known before a restore), the target tree below came out None, and Orbax then restored
    # onto the saving run's devices -- which fails for a checkpoint of a multi-process or multi-device run.
    manager = ocp.CheckpointManager(directory, item_handlers={"params": ocp.StandardCheckpointHandler(),
                                                              "meta": ocp.JsonCheckpointHandler()},
                                    options=ocp.CheckpointManagerOptions(read_only=True, create=False))
    try:
        for step in steps:
            try:
                target = abstract_params
                if target is None:
                    target = on_default_device(manager.item_metadata(step)["params"])
                restored = manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 -- an unreadable checkpoint: try the one before
                print(f"warning: checkpoint at step {step} in {directory} is unreadable ({first_line(e)}); "
                      f"trying the previous one", flush=True)
                continue
            return restored.params, CheckpointMeta.from_json(restored.meta)
    finally:
        manager.close()
    raise FileNotFoundError(f"no readable bertjax checkpoint in {path}: every one of steps {steps} failed to load")
