"""What every run does before its own story, written once: joining the other processes, the workdir and
its lock, the mesh with its logical rules and the batches' sharding (the batch checked against it); and
how a run says it was stopped.

    with start.session(workdir, distributed):            # processes joined, workdir made, lock held
        layout = start.make_layout(config.mesh, config.logical_axis_rules, batch_size, grad_accum_steps)
        with layout.active():                            # the mesh and its rules in force
            ...
"""

import contextlib
import dataclasses
import os
from typing import Iterator, Sequence

import flax.linen as nn
import jax

from bertjax.text import files
from bertjax.training import sharding
from bertjax.training import workdir as workdirs


class Stopped(Exception):
    """SIGTERM or Ctrl-C stopped a run after its checkpoint was saved (the run has said so): its program
    exits with exit_code, 0 after SIGTERM (asked to stop, and did), 130 after Ctrl-C; a sweep stops too."""

    def __init__(self, step: int, exit_code: int):
        super().__init__(f"stopped at step {step}")
        self.step, self.exit_code = step, exit_code


@dataclasses.dataclass(frozen=True)
class Distributed:
    """Where the other processes of a run are: explicit flags, else the BERTJAX_* variables launch/local.py
    sets, else JAX's own cluster detection (Cloud TPU, SLURM, ...); none found: a single process."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def join(self) -> None:
        if jax.distributed.is_initialized():  # a second run in the same process (a sweep, the tests)
            return
        try:
            sharding.initialize_distributed(self.coordinator_address, self.num_processes, self.process_id)
        except RuntimeError as e:
            # JAX already runs in this process (a notebook, the tests): with no coordinator named it is
            # the one process of the run; a named one it can no longer join.
            named = self.coordinator_address or os.environ.get(sharding.ENV_COORDINATOR)
            if "must be called before" not in str(e) or named:
                raise ValueError(f"cannot join the other processes: {str(e).splitlines()[0]}") from None


@contextlib.contextmanager
def session(workdir: str, distributed: Distributed | None = None) -> Iterator[None]:
    """The processes joined, the workdir made and locked by process 0 for the run's duration. A run that
    fails leaves nothing it made behind but what it wrote: a workdir it created and left empty (no
    checkpoint, log or vocabulary in it) is removed, and the lock always goes."""
    if not workdir:
        raise ValueError("--workdir is required (checkpoints and metrics go there)")
    (distributed or Distributed()).join()
    created = not files.is_remote(workdir) and not os.path.exists(workdir)
    files.make(workdir)
    primary = jax.process_index() == 0
    try:
        with workdirs.WorkdirLock(workdir) if primary else contextlib.nullcontext():
            yield
    except BaseException:
        if primary and created:
            remove_if_empty(workdir)
        raise


def remove_if_empty(workdir: str) -> None:
    """Remove the empty directories under a local workdir, and the workdir itself when nothing is left."""
    if files.is_remote(workdir) or not os.path.isdir(workdir):
        return
    for directory, _, _ in os.walk(workdir, topdown=False):
        if not os.listdir(directory):
            os.rmdir(directory)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The mesh of a run, its logical axis rules and the sharding of its batches."""

    mesh: jax.sharding.Mesh
    rules: tuple
    data_sharding: jax.sharding.NamedSharding

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The mesh and the rules in force: what the run creates inside is sharded by them."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield

    @property
    def data_parallel_size(self) -> int:
        return sharding.data_parallel_size(self.mesh, self.rules)

    def check_batch(self, batch_size: int, grad_accum_steps: int) -> None:
        sharding.check_batch_size(batch_size, grad_accum_steps, self.mesh, self.rules)

    def describe(self) -> str:
        return (f"{jax.process_count()} process(es), {len(self.mesh.devices.flat)} "
                f"{self.mesh.devices.flat[0].device_kind} device(s), mesh {dict(self.mesh.shape)}")


def make_layout(mesh_config, rules_config, batch_size: int | None = None, grad_accum_steps: int = 1,
                devices: Sequence | None = None) -> Layout:
    """The Layout of config.mesh and config.logical_axis_rules over `devices` (default: all of them),
    batch_size (when given) checked to split over its data-parallel devices and microbatches."""
    mesh = sharding.make_mesh(mesh_config, devices)
    rules = sharding.logical_rules(rules_config)
    layout = Layout(mesh, rules, sharding.batch_sharding(mesh, rules))
    if batch_size is not None:
        layout.check_batch(batch_size, grad_accum_steps)
    return layout
