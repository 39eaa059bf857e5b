"""Ahead-of-time plans of the train step for a Cloud TPU slice, compiled on this (CPU) machine with the
`libtpu` package: per chip, parameter, optimizer-state, batch and temporary memory against the chip's
HBM, whether it fits, the step's FLOPs (the compiler's count and the model formula), the collectives in
the compiled step, and an MFU bound. Nothing is allocated: the state and the batch are abstract (shapes
and shardings only). What `python -m bertjax.plan` runs.
"""

import dataclasses
import json
import os
import re
import time

import jax
import numpy as np
from absl import logging

from bertjax.data.settings import DataSettings
from bertjax.runs.start import make_layout
from bertjax.training import flops, sharding
from bertjax.training import pretraining_step
from bertjax.training import state as train_state


@dataclasses.dataclass(frozen=True)
class Generation:
    libtpu_name: str  # the generation as libtpu's topology names spell it
    hbm_bytes: int  # per chip
    hbm_bandwidth: float  # bytes/s per chip
    dims: int  # 3: a 3-D torus of chips (v4, v5p); 2: a 2-D one (v5e, v6e)
    cores_per_name_unit: int  # TensorCores per chip that the number in the name counts
    max_chips: int
    chip_config: str  # megacore: one JAX device per chip, its two TensorCores together


# libtpu, loaded only to compile, must not look for TPU hardware or a TPU VM's metadata server (slow
# and noisy on a CPU machine), nor lock out a second planner; the runtime stays on the CPU.
LIBTPU_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-8", "TPU_WORKER_HOSTNAMES": "localhost",
              "TPU_WORKER_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}

GiB = 2**30
# Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): HBM per chip and
# its bandwidth. Peak FLOP/s come from bertjax.training.flops, by the devices' device_kind.
GENERATIONS = {
    "v4": Generation("v4", 32 * GiB, 1.2e12, 3, 2, 4096, "megacore"),
    "v5p": Generation("v5p", 95 * GiB, 2.765e12, 3, 2, 8192, "megacore"),
    "v5e": Generation("v5e", 16 * GiB, 0.819e12, 2, 1, 256, "default"),
    "v6e": Generation("v6e", 32 * GiB, 1.64e12, 2, 1, 256, "default"),
}
ALIASES = {"v5litepod": "v5e"}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # as the user wrote it, e.g. v5p-128
    generation: Generation
    chips: int
    shape: tuple[int, ...]  # chips along each torus axis
    platform: str | None = "tpu"  # what the model's "auto" fields resolve for; None: the backend JAX runs on

    @property
    def libtpu_name(self) -> str:
        return f"{self.generation.libtpu_name}:{'x'.join(map(str, self.shape))}"


def chip_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The slice's shape in chips, as Cloud TPU builds it: from 2x2x1 (3-D) or 1x1 (2-D), the smallest
    axis doubled (the last of equals) until the count is reached: 64 -> 4x4x4, 128 -> 4x4x8, 256 -> 16x16."""
    shape = [2, 2, 1] if dims == 3 else [1, 1]
    while int(np.prod(shape)) < chips:
        smallest = min(shape)
        i = max(j for j, s in enumerate(shape) if s == smallest)
        shape[i] *= 2
    return tuple(shape)


def parse_topology(name: str) -> Topology:
    """v4-32 -> 16 chips of TPU v4 in 2x2x4; v5e-256 -> 16x16. ValueError says what names exist."""
    known = ", ".join(f"{g}-N" for g in [*GENERATIONS, *ALIASES])
    if not name:
        raise ValueError(f"--topology is required: one of {known}, e.g. --topology=v5p-128")
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", (name or "").strip().lower())
    if not match or ALIASES.get(match[1], match[1]) not in GENERATIONS:
        raise ValueError(f"unknown TPU topology {name!r}: use one of {known}, e.g. v4-32, v5e-256, v5p-128, v6e-64")
    gen = GENERATIONS[ALIASES.get(match[1], match[1])]
    count = int(match[2])
    chips, rest = divmod(count, gen.cores_per_name_unit)
    smallest = 4 if gen.dims == 3 else 1
    if rest or chips < smallest or chips > gen.max_chips or chips & (chips - 1):
        unit = "TensorCores (2 per chip)" if gen.cores_per_name_unit == 2 else "chips"
        raise ValueError(f"topology {name!r}: the number counts {unit} and must give a power of two from "
                         f"{smallest} to {gen.max_chips} chips, e.g. {match[1]}-{smallest * gen.cores_per_name_unit}")
    return Topology(name, gen, chips, chip_grid(chips, gen.dims))


def topology_devices(topology: Topology) -> list:
    """Compile-only devices of the slice (libtpu); nothing runs on them."""
    from jax.experimental import topologies  # the TPU planner's alone: compiles for libtpu's devices

    for name, value in LIBTPU_ENV.items():  # read by libtpu when it loads, just below
        os.environ.setdefault(name, value)
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")  # the state's shapes and keys are made on the CPU
    try:
        desc = topologies.get_topology_desc(topology_name=topology.libtpu_name, platform="tpu",
                                            chip_config_name=topology.generation.chip_config)
    except (RuntimeError, ImportError) as e:  # no libtpu, or one that does not know the generation
        raise ValueError(f"cannot describe {topology.name} ({topology.libtpu_name}) for compilation: "
                         f"{str(e).splitlines()[0]} (is libtpu installed? pip install 'bertjax[tpu-plan]')") from e
    return list(desc.devices)


# HBM bandwidth per device kind of the GPUs a local plan meets (vendors' data sheets), for the step's floor.
GPU_BANDWIDTH = {"h200": 4.8e12, "h100": 3.35e12, "a100": 2.0e12}


def local_topology(memory_gib: float | None = None) -> tuple[Topology, list]:
    """The devices this process runs on (a GPU machine's), as a Topology whose memory per device is the
    allocator's limit (memory_stats' bytes_limit), or memory_gib where given (a CPU has no such limit)."""
    devices = jax.local_devices()
    kind = devices[0].device_kind
    limit = int(memory_gib * GiB) if memory_gib else (devices[0].memory_stats() or {}).get("bytes_limit")
    if not limit:
        raise ValueError(f"--topology=local: the {kind} device reports no memory limit: give --memory_gib")
    bandwidth = next((b for name, b in GPU_BANDWIDTH.items() if name in kind.lower()), 0.0)
    generation = Generation(kind, int(limit), bandwidth, 1, 1, len(devices), "default")
    return Topology("local", generation, len(devices), (len(devices),), platform=None), devices


# Layouts of the stack from the fastest to the leanest (docs/performance.md): unrolled without remat
# recomputes nothing; a scanned stack copies its residuals into [L, ...] buffers; remat recomputes.
LAYOUTS = (dict(scan_layers=False, remat_policy="none"), dict(scan_layers=False, remat_policy="save_named"),
           dict(scan_layers=True, remat_policy="save_named"), dict(scan_layers=True, remat_policy="save_attention"),
           dict(scan_layers=True, remat_policy="full"))


def choose_layout(config, topology: Topology, devices, batch_size: int) -> tuple[dict | None, list[dict]]:
    """The first of LAYOUTS whose step fits the devices' memory at this batch (None when none does), and
    every plan compiled on the way, each with its `layout`."""
    tried = []
    for layout in LAYOUTS:
        trial = config.copy_and_resolve_references()
        trial.model.update(layout)
        tried.append(dict(compile_step(trial, topology, devices, batch_size), layout=layout))
        logging.info("%s: %.2f GiB of %.1f, %s", layout, tried[-1]["total_bytes"] / GiB,
                     topology.generation.hbm_bytes / GiB, "fits" if tried[-1]["fits"] else "does not fit")
        if tried[-1]["fits"]:
            return layout, tried
    return None, tried


def abstract_batch(config, batch_size: int, data_sharding) -> dict:
    """The train step's batch as shapes with the data sharding: [B, S] ids, [B, P] predictions, [B] labels;
    packed rows (data.packing): [B, S] sequence ids and positions, [B, K] labels, [CLS] positions, weights."""
    s, p = config.data.max_seq_length, config.data.max_predictions_per_seq
    data = DataSettings.from_config(config.data)
    packing, k = data.packing, data.max_sequences_per_row
    shapes = {"input_ids": (s,), "segment_ids": (s,), "input_mask": (s,), "masked_lm_positions": (p,),
              "masked_lm_ids": (p,), "masked_lm_weights": (p,), "next_sentence_labels": (k,) if packing else (),
              "sequence_ids": (s,), "position_ids": (s,), "sentence_positions": (k,), "sentence_weights": (k,)}
    floats = ("masked_lm_weights", "sentence_weights")
    return {key: jax.ShapeDtypeStruct((batch_size, *shapes[key]), np.float32 if key in floats else np.int32,
                                      sharding=data_sharding) for key in pretraining_step.batch_keys(packing)}


def bytes_per_device(tree) -> int:
    """Bytes of one device's shards of an abstract tree (shapes carrying their shardings)."""
    return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree_util.tree_leaves(tree)))


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective ops of a compiled HLO module by kind (an async pair counts once; an op inside a loop
    body, e.g. the scanned layers, counts once however many times it runs)."""
    found = re.findall(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", hlo_text)
    return {kind: found.count(kind) for kind in COLLECTIVES}


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0] if cost else {}
    return cost or {}


def compile_step(config, topology: Topology, devices, batch_size: int) -> dict:
    """Compile the train step for the slice at this global batch and measure it. Raises ValueError for
    a mesh or batch the slice cannot take."""
    grad_accum = config.train.grad_accum_steps
    layout = make_layout(config.mesh, config.logical_axis_rules, batch_size, grad_accum, devices)
    mesh, rules, data_sharding = layout.mesh, layout.rules, layout.data_sharding
    init_key, dropout_key = train_state.root_keys(config.train.seed, config.train.dropout_rng)
    setup = pretraining_step.setup(config, mesh, rules, init_key, platform=topology.platform)
    step_fn, _ = setup.compile_steps(data_sharding, grad_accum)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    key = jax.ShapeDtypeStruct(dropout_key.shape, dropout_key.dtype, sharding=replicated)
    batch = abstract_batch(config, batch_size, data_sharding)
    compiled, out_of_memory, compile_seconds = _compile(step_fn, setup.abstract_state, batch, key, mesh)

    params = bytes_per_device(setup.abstract_state.params)
    opt_state = bytes_per_device(setup.abstract_state.opt_state)
    batch_bytes = bytes_per_device(batch)
    hbm = topology.generation.hbm_bytes
    temp, total, cost, collectives = _memory(compiled, out_of_memory, params + opt_state + batch_bytes)

    chips = len(devices)
    cfg = setup.bert_config
    seq = config.data.max_seq_length
    model_flops, compiled_flops, bytes_accessed, peak, floor = _step_time_floor(
        config, cfg, topology, devices, batch_size, cost)
    return dict(
        topology=topology.name, libtpu_topology=topology.libtpu_name, device_kind=devices[0].device_kind,
        chips=chips, mesh=dict(mesh.shape), batch_size=batch_size, seq_len=seq, grad_accum_steps=grad_accum,
        batch_per_data_device=batch_size // sharding.data_parallel_size(mesh, rules),
        dtype=cfg.dtype, remat_policy=cfg.remat_policy, scan_layers=cfg.scan_layers,
        params_bytes=params, opt_state_bytes=opt_state, batch_bytes=batch_bytes, temp_bytes=temp,
        total_bytes=total, hbm_bytes=hbm, fits=out_of_memory is None and total <= hbm, compiler_error=out_of_memory,
        compiled_flops=compiled_flops, model_flops=model_flops, bytes_accessed=bytes_accessed,
        peak_flops=peak, hbm_bandwidth=topology.generation.hbm_bandwidth,
        step_time_floor=floor, mfu_bound=(model_flops / peak / floor) if floor and compiled else None,
        collectives=collectives, compile_seconds=compile_seconds,
    )


def _compile(step_fn, abstract_state, batch, key, mesh):
    """The compiled step (None when the compiler ran out of HBM), the compiler's out-of-memory line
    (None when it fit), and the seconds compiling took."""
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = step_fn.lower(abstract_state, batch, key).compile()
        out_of_memory = None
    except jax.errors.JaxRuntimeError as e:
        # The TPU compiler itself refuses a step whose temporaries exceed the chip's HBM.
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        compiled, out_of_memory = None, str(e).splitlines()[0]
    return compiled, out_of_memory, time.perf_counter() - start


def _memory(compiled, out_of_memory: str | None, argument_bytes: int):
    """Temporaries and total bytes per device, XLA's cost analysis and the collectives; for a step the
    compiler refused, the temporaries its error names on top of the arguments (no cost, no collectives)."""
    if compiled is not None:
        m = compiled.memory_analysis()
        temp = int(m.temp_size_in_bytes)
        # Arguments + outputs + temporaries, less what the donated state shares between arguments and outputs.
        total = int(m.argument_size_in_bytes + m.output_size_in_bytes + temp - m.alias_size_in_bytes)
        return temp, total, _cost(compiled), count_collectives(compiled.as_text())
    required = re.search(r"required for HLO temporaries \(([\d.]+)G\)", out_of_memory)
    temp = int(float(required[1]) * GiB) if required else 0
    return temp, argument_bytes + temp, {}, {}


def _step_time_floor(config, cfg, topology: Topology, devices, batch_size: int, cost: dict):
    """Model and compiled FLOPs and HBM bytes per chip per step, the chip's peak, and the least time the
    step can take."""
    chips = len(devices)
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
    per_token = flops.config_flops_per_token(cfg, seq, preds / seq)
    model_flops = per_token * batch_size * seq / chips  # per chip per step
    compiled_flops = float(cost.get("flops", 0.0))
    bytes_accessed = float(cost.get("bytes accessed", 0.0))
    peak = flops.peak_flops_per_device(devices[0].device_kind)
    # The step takes at least its FLOPs at peak and at least its HBM traffic at full bandwidth. XLA's
    # count takes a loop body once (the scanned layers of large), so the larger of the two counts is used.
    bandwidth = topology.generation.hbm_bandwidth
    floor = (max(max(compiled_flops, model_flops) / peak, bytes_accessed / bandwidth if bandwidth else 0.0)
             if peak else 0.0)
    return model_flops, compiled_flops, bytes_accessed, peak, floor


def find_max_batch(config, topology: Topology, devices, bisect_steps: int = 3, start: int = 1,
                   limit: int = 1 << 16) -> tuple[int, list[dict]]:
    """The largest batch per data-parallel device that fits: from `start`, doubling until a compile
    does not fit (or halving until one does), then `bisect_steps` bisections between the last fit and
    the first miss. Returns it (0 when not even 1 fits) and every compiled plan, in order."""
    dp = make_layout(config.mesh, config.logical_axis_rules, devices=devices).data_parallel_size
    unit = config.train.grad_accum_steps  # the batch per device must split into the microbatches
    tried = []

    def fits(per_device: int) -> bool:
        tried.append(compile_step(config, topology, devices, per_device * unit * dp))
        p = tried[-1]
        logging.info("%d per data-parallel device: %.2f GiB of %.0f, %s (compiled in %.0f s)", per_device,
                     p["total_bytes"] / GiB, p["hbm_bytes"] / GiB, "fits" if p["fits"] else "does not fit",
                     p["compile_seconds"])
        return p["fits"]

    if fits(start):
        lo, hi = start, start * 2
        while hi <= limit and fits(hi):
            lo, hi = hi, hi * 2
    else:
        lo, hi = start // 2, start
        while lo and not fits(lo):
            lo, hi = lo // 2, lo
    for _ in range(bisect_steps):
        if hi - lo <= 1 or lo == 0:
            break
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit, tried


def _gib(n: float) -> str:
    return f"{n / GiB:8.2f} GiB" if n >= GiB else f"{n / 2**20:8.1f} MiB"


def format_plan(plan: dict) -> str:
    """The plan as the console table."""
    hbm = plan["hbm_bytes"]
    mesh = " ".join(f"{k}={v}" for k, v in plan["mesh"].items())
    lines = [
        f"topology      {plan['topology']} ({plan['libtpu_topology']}): {plan['chips']} chips of "
        f"{plan['device_kind']}, {hbm / GiB:.0f} GiB HBM each",
        f"mesh          {mesh}",
        f"batch         {plan['batch_size']} x {plan['seq_len']} ({plan['batch_per_data_device']} per data-parallel "
        f"device, {plan['grad_accum_steps']} microbatch(es)), {plan['dtype']} compute, remat {plan['remat_policy']}"
        + (", scanned layers" if plan.get("scan_layers") else ", unrolled layers"),
        "memory per chip (the compiled step):",
        f"  parameters      {_gib(plan['params_bytes'])}",
        f"  optimizer state {_gib(plan['opt_state_bytes'])}",
        f"  batch           {_gib(plan['batch_bytes'])}",
        f"  temporaries     {_gib(plan['temp_bytes'])}",
        f"  total (peak)    {_gib(plan['total_bytes'])} of {hbm / GiB:.0f} GiB ({plan['total_bytes'] / hbm:.0%})",
        f"fits          {'yes' if plan['fits'] else 'NO: does not fit'}"
        + (f" (the TPU compiler: {plan['compiler_error']}; temporaries as it reports them)"
           if plan["compiler_error"] else ""),
    ]
    if plan["compiler_error"]:
        lines.append(f"FLOPs/step    {plan['model_flops'] / 1e12:.3f} TFLOP per chip by the model formula "
                     "(not compiled)")
    else:
        lines += [
            f"FLOPs/step    {plan['compiled_flops'] / 1e12:.3f} TFLOP per chip compiled (XLA's count; a loop body "
            f"counts once), {plan['model_flops'] / 1e12:.3f} TFLOP by the model formula",
            "collectives   " + (", ".join(f"{k} {v}" for k, v in plan["collectives"].items() if v) or "none")
            + " (ops in the compiled step; one in the layer loop counts once)",
        ]
    if plan["mfu_bound"] is not None:
        lines.append(
            f"MFU bound     {plan['mfu_bound']:.0%}: a bound, not a measurement. The step takes at least "
            f"{plan['step_time_floor'] * 1e3:.1f} ms per chip "
            f"(its {max(plan['compiled_flops'], plan['model_flops']) / 1e12:.2f} TFLOP at the "
            f"{plan['peak_flops'] / 1e12:.0f} TFLOP/s peak, or its {plan['bytes_accessed'] / GiB:.1f} GiB of HBM "
            f"traffic at {plan['hbm_bandwidth'] / 1e9:.0f} GB/s, whichever is longer); communication would lower it")
    lines.append(f"compile       {plan['compile_seconds']:.1f} s on this machine")
    return "\n".join(lines)


def plan(config, topology_name: str, *, search: bool = False, start_batch: int | None = None,
         bisect_steps: int = 3, layout: bool = False, memory_gib: float | None = None) -> tuple[int | None, list[dict]]:
    """(the largest batch per data-parallel device that fits, or None when not searched; every compiled
    plan, the config's batch last when not searched) for the slice named topology_name ("local": this
    process's devices, memory_gib each where they report none). layout: first choose_layout at the
    config's batch, then search (or plan) with the layout chosen."""
    if topology_name == "local":
        topology, devices = local_topology(memory_gib)
    else:
        topology = parse_topology(topology_name)
        devices = topology_devices(topology)
    sharding.mesh_shape(config.mesh, len(devices))
    chosen = []
    if layout:
        best_layout, chosen = choose_layout(config, topology, devices, config.train.batch_size)
        if best_layout is None or not search:
            return (0 if search else None), chosen
        config = config.copy_and_resolve_references()
        config.model.update(best_layout)
    if not search:
        return None, [compile_step(config, topology, devices, config.train.batch_size)]
    dp = make_layout(config.mesh, config.logical_axis_rules, devices=devices).data_parallel_size
    first = start_batch or max(1, config.train.batch_size // (dp * config.train.grad_accum_steps))
    best, tried = find_max_batch(config, topology, devices, bisect_steps, first)
    return best, chosen + tried


def print_plans(best: int | None, tried: list[dict], as_json: bool) -> bool:
    """The plans as the console table (or one JSON object); whether the step fits."""
    if as_json:
        out = dict(tried[-1], tried=tried, max_batch_per_data_device=best) if best is not None else tried[-1]
        print(json.dumps(out))
    else:
        for one in ([tried[-1]] if best is None else tried):
            print(format_plan(one) + "\n")
        layouts = [p for p in tried if "layout" in p]
        if layouts:
            print(describe_layouts(layouts))
        if best is not None:
            print(f"largest batch per data-parallel device that fits: {best} (searched: "
                  f"{', '.join(str(p['batch_per_data_device']) + (' fits' if p['fits'] else ' no') for p in tried)})")
    return (best > 0) if best is not None else tried[-1]["fits"]


def describe_layouts(plans: list[dict]) -> str:
    """The layout choose_layout found, as the config overrides that give it, and what each one tried needs."""
    fitting = [p["layout"] for p in plans if p["fits"]]
    tried = ", ".join(f"{'scanned' if p['layout']['scan_layers'] else 'unrolled'}/{p['layout']['remat_policy']} "
                      f"{p['total_bytes'] / GiB:.2f} GiB" for p in plans)
    if not fitting:
        return f"layout: none fits ({tried}): lower train.batch_size"
    overrides = " ".join(f"--config.model.{k}={str(v).lower()}" for k, v in fitting[0].items())
    return f"layout: {overrides} (the fastest that fits; tried {tried})"


def plan_and_print(config, topology_name: str, *, search: bool, start_batch: int | None, bisect_steps: int,
                   as_json: bool, layout: bool = False, memory_gib: float | None = None) -> bool:
    """plan, printed; whether the step fits. A topology or mesh the slice cannot take is one ValueError
    naming the topology."""
    try:
        best, tried = plan(config, topology_name, search=search, start_batch=start_batch, bisect_steps=bisect_steps,
                           layout=layout, memory_gib=memory_gib)
    except ValueError as e:
        if topology_name and not str(e).startswith(("unknown TPU", "topology", "--topology")):
            raise ValueError(f"{topology_name}: {e}") from None
        raise
    return print_plans(best, tried, as_json)
