"""Device time of the benchmarked step by kernel category, read from a jax.profiler trace (GPU streams,
TPU "XLA Ops" lines): where the step's time goes on an accelerator."""

import collections
import gzip
import json
import os
import pathlib
import re

import jax


# The first pattern that a kernel's lower-cased name contains decides its category.
KERNEL_CATEGORIES = (
    ("collective", ("nccl", "all-reduce", "all_reduce", "allreduce", "all-gather", "all_gather",
                    "reduce-scatter", "reduce_scatter", "collective", "all-to-all")),
    ("attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
    ("matmul", ("gemm", "cublas", "cutlass", "xmma", "nvjet", "wgmma", "matmul", "convolution", "dot")),
    ("scatter/gather", ("scatter", "gather")),
    ("copy", ("memcpy", "memset", "copy", "dynamic-update-slice", "dynamic_update_slice", "transpose")),
    ("reduction", ("reduce", "reduction")),
    ("element-wise", ("fusion", "loop", "elementwise", "kernel", "rng", "threefry")),
)


def kernel_category(name: str) -> str:
    lowered = name.lower()
    for category, patterns in KERNEL_CATEGORIES:
        if any(p in lowered for p in patterns):
            return category
    return "other"


def device_kernel_seconds(trace: dict) -> dict[str, float]:
    """Seconds of device kernels by category, from a Chrome/Perfetto trace ({"traceEvents": [...]}).

    Device processes are those named like /device:GPU:0 or /device:TPU:0. On a GPU the kernels are the
    events of its stream threads; on a TPU those of its "XLA Ops" line (other lines of the same device
    repeat them at coarser grain)."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    process_names, thread_names = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process_names[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    devices = {pid for pid, name in process_names.items() if re.search(r"/device:(gpu|tpu)", name, re.I)}

    def is_kernel_line(pid, tid) -> bool:
        name = thread_names.get((pid, tid), "").lower()
        if re.search(r"/device:gpu", process_names[pid], re.I):
            return "stream" in name
        return name == "xla ops"

    totals = collections.Counter()
    for e in events:
        pid = e.get("pid")
        if e.get("ph") == "X" and pid in devices and is_kernel_line(pid, e.get("tid")):
            totals[kernel_category(str(e.get("name", "")))] += float(e.get("dur", 0.0)) * 1e-6
    return dict(totals)


def profile_steps(runner, directory: str, steps: int = 3) -> dict[str, float]:
    """Traces `steps` steps into `directory`; returns device seconds per step by category."""
    os.makedirs(directory, exist_ok=True)
    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for _ in range(steps):
            runner.step()
    traces = sorted(pathlib.Path(directory).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return {}
    with gzip.open(traces[-1], "rt") as f:
        seconds = device_kernel_seconds(json.load(f))
    return {k: v / steps for k, v in seconds.items()}


def print_profile(label: str, per_step: dict[str, float]) -> None:
    if not per_step:
        print(f"  {label}: no device kernels in the trace (a CPU run has none; the trace is still written)",
              flush=True)
        return
    total = sum(per_step.values())
    parts = ", ".join(f"{k} {1e3 * v:.1f} ms ({100 * v / total:.0f}%)"
                      for k, v in sorted(per_step.items(), key=lambda kv: -kv[1]))
    print(f"  {label}: device kernel time {1e3 * total:.1f} ms/step: {parts}", flush=True)
