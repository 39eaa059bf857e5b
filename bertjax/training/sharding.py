"""Processes, devices, the mesh, and how arrays are laid out on it.

The mesh has three axes: data (pure data parallelism), fsdp (data parallelism with parameters and
optimizer state sharded too) and tensor (heads, feed-forward and vocabulary split across devices).
The model names the axes of every parameter and key activation; the config's logical_axis_rules map
those names onto mesh axes. This module turns the two into jax.sharding objects. No TensorFlow here.
"""

import os
import queue
import threading
from typing import Any, Iterable, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding

MESH_AXES = ("data", "fsdp", "tensor")

# Set by launch/local.py for each process it starts; explicit flags take precedence.
ENV_COORDINATOR = "BERTJAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "BERTJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "BERTJAX_PROCESS_ID"


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Join the other processes of this run, if there are any.

    Explicit arguments (or the BERTJAX_* variables the local launcher sets) name the coordinator;
    otherwise JAX's own cluster detection finds it (Cloud TPU, SLURM, Open MPI, mpi4py, Kubernetes,
    ...), and where it detects no cluster this is the one process of the run.
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR)
    if coordinator_address:
        num_processes = num_processes if num_processes is not None else int(os.environ[ENV_NUM_PROCESSES])
        process_id = process_id if process_id is not None else int(os.environ[ENV_PROCESS_ID])
        jax.distributed.initialize(coordinator_address, num_processes, process_id)
    else:
        try:
            jax.distributed.initialize()
        except ValueError as e:
            if "coordinator_address" not in str(e):  # a cluster was detected but is misconfigured
                raise
            return  # no cluster detected: a single process
    logging.info("process %d of %d, %d local devices of %d", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count())


def mesh_shape(mesh_config: dict, num_devices: int) -> tuple[int, ...]:
    """(data, fsdp, tensor) sizes; one axis may be -1 and takes the devices the others leave."""
    unknown = sorted(set(mesh_config) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown}: the mesh axes are {MESH_AXES}")
    sizes = [int(mesh_config.get(axis, 1)) for axis in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError("at most one mesh axis may be -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if num_devices % known:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} cannot be filled from {num_devices} devices: "
                             f"the fixed axes multiply to {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if int(np.prod(sizes)) != num_devices:
        raise ValueError(f"mesh data*fsdp*tensor = {'*'.join(map(str, sizes))} = {int(np.prod(sizes))} "
                         f"does not match the {num_devices} devices: set one of config.mesh.* to -1")
    return tuple(sizes)


def make_mesh(mesh_config: dict, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    """The device mesh. Axes are Auto: the model's logical constraints guide the partitioner (JAX's
    default Explicit axes would turn every constraint into an assertion)."""
    devices = list(devices) if devices is not None else jax.devices()
    shape = mesh_shape(mesh_config, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def logical_rules(rules: Sequence[Sequence[Any]]) -> tuple:
    """The config's rules table as flax expects it: ((logical name, mesh axis or axes or None), ...)."""
    out = []
    for rule in rules:
        name, target = rule
        target = tuple(target) if isinstance(target, (list, tuple)) else target
        for axis in (target if isinstance(target, tuple) else (target,)):
            if axis is not None and axis not in MESH_AXES:
                raise ValueError(f"logical_axis_rules maps {name!r} to unknown mesh axis {axis!r}")
        out.append((name, target))
    return tuple(out)


def tree_shardings(abstract_boxed_tree, mesh, rules) -> Any:
    """NamedShardings for a tree whose leaves carry logical axis names (nn.LogicallyPartitioned);
    leaves without names (step counters, optimizer counts) are replicated."""
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract_boxed_tree), mesh, rules)


def batch_sharding(mesh, rules) -> NamedSharding:
    """Batches are split over the mesh axes the rules give the logical "batch" axis."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def data_parallel_size(mesh, rules) -> int:
    spec = batch_sharding(mesh, rules).spec[0]
    axes = spec if isinstance(spec, tuple) else (spec,) if spec else ()
    return int(np.prod([mesh.shape[a] for a in axes]))


def check_batch_size(batch_size: int, grad_accum_steps: int, mesh, rules) -> None:
    """Fail early, with what to change, when the batch cannot be split as configured."""
    if batch_size < 1:
        raise ValueError(f"train.batch_size={batch_size} must be at least 1")
    if grad_accum_steps < 1:
        raise ValueError(f"train.grad_accum_steps={grad_accum_steps} must be at least 1")
    if batch_size % grad_accum_steps:
        raise ValueError(f"train.batch_size={batch_size} is not divisible by train.grad_accum_steps={grad_accum_steps}")
    micro = batch_size // grad_accum_steps
    dp = data_parallel_size(mesh, rules)
    if micro % dp:
        raise ValueError(
            f"the microbatch of {micro} sequences (train.batch_size={batch_size} / train.grad_accum_steps="
            f"{grad_accum_steps}) does not divide over the {dp} data-parallel devices of mesh {dict(mesh.shape)}: "
            f"make train.batch_size a multiple of {dp * grad_accum_steps}"
        )
    if batch_size % jax.process_count():
        raise ValueError(f"train.batch_size={batch_size} does not divide over {jax.process_count()} processes")


def global_batch(host_batch: dict, sharding: NamedSharding) -> dict:
    """This process's share of a batch (numpy, leading axis = B / process_count) -> global jax.Arrays
    sharded over the data axes. Every process passes its own share; none sees the others'."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in host_batch.items()}


class prefetch_to_devices:
    """Iterates global batches made from host batches by a background thread, `size` batches ahead.

    The thread builds each host batch (the input pipeline's work) and transfers it to the devices while
    the devices run earlier steps, so the step never waits for the host. The order is the host
    stream's. An error in the stream is raised by next() in the caller's thread. Use as a context
    manager: leaving it stops the thread.
    """

    _END = object()

    def __init__(self, host_batches: Iterable[dict], sharding: NamedSharding, size: int = 2):
        if size < 1:
            raise ValueError(f"train.prefetch_batches={size} must be at least 1")
        self._queue = queue.Queue(maxsize=size)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(iter(host_batches), sharding), daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, host_batches, sharding) -> None:
        try:
            for host_batch in host_batches:
                if not self._put(global_batch(host_batch, sharding)):
                    return
            self._put(self._END)
        except BaseException as e:  # handed to the caller's thread
            self._put(e)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5.0)
