"""The step benchmark: tokens/s of the full training step, beside Hugging Face on the same shapes; what
`python -m bertjax.benchmark` runs (its docstring says what is timed and printed)."""

import functools
import json
import os
import resource
import subprocess
import sys
import time
from typing import Callable

import jax
import numpy as np

import configs.albert_base
import configs.albert_tiny
import configs.base
import configs.electra_base
import configs.electra_small
import configs.electra_tiny
import configs.ibbert
import configs.ibbert_tiny
import configs.large
import configs.medium
import configs.mini
import configs.mobilebert
import configs.mobilebert_tiny
import configs.modernbert_base
import configs.modernbert_large
import configs.modernbert_tiny
import configs.roberta_base
import configs.roberta_tiny
import configs.small
import configs.tiny

from bertjax.bench import embedding_speed
from bertjax.bench.hf_peer import HFStep, hf_peer_config, torch_cuda_available
from bertjax.bench.step_profile import print_profile, profile_steps
from bertjax.bench.timing import load_average, measure, print_table
from bertjax.data import synthetic
from bertjax.data.settings import DataSettings
from bertjax.models import bert
from bertjax.models.config import BertConfig
from bertjax.runs import start
from bertjax.training import flops, pretraining_step, sharding
from bertjax.training import state as train_state

VOCAB_SIZE = 30522
ACCELERATOR_SHAPES = ((128, 256), (512, 32))  # (seq_len, batch_size)


def max_predictions(seq_len: int) -> int:
    """BERT's max_predictions_per_seq: 20 at seq 128, 80 at seq 512 (0.15 x S rounded up to the recipe's)."""
    return {128: 20, 512: 80}.get(seq_len, max(1, round(0.15625 * seq_len)))


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


# The pretraining configs (the configs package), by the names --sizes takes: BERT's sizes, then the families.
SIZES = {"tiny": configs.tiny, "mini": configs.mini, "small": configs.small, "medium": configs.medium,
         "base": configs.base, "large": configs.large,
         "roberta_tiny": configs.roberta_tiny, "roberta_base": configs.roberta_base,
         "albert_tiny": configs.albert_tiny, "albert_base": configs.albert_base,
         "modernbert_tiny": configs.modernbert_tiny, "modernbert_base": configs.modernbert_base,
         "modernbert_large": configs.modernbert_large, "electra_tiny": configs.electra_tiny,
         "electra_small": configs.electra_small, "electra_base": configs.electra_base,
         "mobilebert_tiny": configs.mobilebert_tiny, "mobilebert": configs.mobilebert,
         "ibbert_tiny": configs.ibbert_tiny, "ibbert": configs.ibbert}


def load_config(size: str):
    """configs/<size>.py's get_config(), as --config=configs/<size>.py would give it."""
    if size not in SIZES:
        raise ValueError(f"no config for size {size!r}: choose from {', '.join(SIZES)}")
    return SIZES[size].get_config()


def benchmark_config(config, dtype: str | None, overrides: dict, seq_len: int, num_predictions: int,
                     dropout_rng: str = "threefry"):
    """The size's config with the benchmark's vocabulary, dtype, overrides and shapes; its model section
    is checked (an unknown override key is an error) by BertConfig.from_dict, here and in Setup. A
    position range shorter than the sequence (roberta_tiny's, modernbert_tiny's) is widened to it."""
    config.model.update(vocab_size=VOCAB_SIZE, **({"dtype": dtype} if dtype else {}))
    config.model.update_from_flattened_dict(overrides)
    needed = seq_len + config.model.position_offset
    config.model.max_position_embeddings = max(config.model.max_position_embeddings, needed)
    # Full-length rows of one sequence, as the peer computes them (--packing times packed rows on its own).
    config.data.update(max_seq_length=seq_len, max_predictions_per_seq=num_predictions, packing=False)
    config.train.dropout_rng = dropout_rng
    BertConfig.from_dict(config.model)
    return config


# ---------------------------------------------------------------------------------------------------
# bertjax
# ---------------------------------------------------------------------------------------------------


def make_batches(n: int, batch_size: int, seq_len: int, num_predictions: int) -> list:
    return [synthetic.synthetic_batch(i, batch_size=batch_size, max_seq_length=seq_len,
                                      max_predictions_per_seq=num_predictions, vocab_size=VOCAB_SIZE)
            for i in range(n)]


class BertjaxStep:
    """The trainer's state and step on one device, built by pretraining_step.setup as the training program builds
    them (shardings, donated state), compiled ahead of time so that its memory can be read."""

    name = "bertjax"

    def __init__(self, config, batches: list):
        layout = start.make_layout(dict.fromkeys(sharding.MESH_AXES, 1), config.logical_axis_rules,
                                   devices=jax.devices()[:1])
        self.mesh = layout.mesh
        init_key, self.dropout_key = train_state.root_keys(config.train.seed, config.train.dropout_rng)
        setup = pretraining_step.setup(config, layout.mesh, layout.rules, init_key)
        self.bert_config = setup.bert_config
        self.state = setup.init(init_key)
        self.params = bert.count_params(self.state.params)
        step_fn, _ = setup.compile_steps(layout.data_sharding, grad_accum_steps=1)
        keys = pretraining_step.batch_keys(DataSettings.from_config(config.data).packing)
        self.batches = [sharding.global_batch({k: b[k] for k in keys}, layout.data_sharding) for b in batches]
        began = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.compiled = step_fn.lower(self.state, self.batches[0], self.dropout_key).compile()
        self.compile_seconds = time.perf_counter() - began
        self.memory_bytes = compiled_memory(self.compiled)
        self.count, self.sums = 0, None

    def step(self) -> float:
        """One step, waited for: its seconds."""
        batch = self.batches[self.count % len(self.batches)]
        began = time.perf_counter()
        self.state, self.sums = self.compiled(self.state, batch, self.dropout_key)
        jax.block_until_ready((self.state, self.sums))
        self.count += 1
        return time.perf_counter() - began

    def loss(self) -> float:
        return float(self.sums["loss_sum"])

    def reset_peak(self) -> None:
        """Nothing: JAX's peak is the process's; the compiled step's own memory is memory_bytes."""

    def release(self) -> None:
        """Nothing: the state stays on the device for the profile that may follow."""

    def peak_bytes(self) -> int | None:
        stats = jax.devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")


def compiled_memory(compiled) -> int | None:
    """Bytes the compiled step holds at its peak: arguments + outputs + temporaries, less what the
    donated state shares between arguments and outputs."""
    try:
        m = compiled.memory_analysis()
    except (NotImplementedError, AttributeError):
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def row_writer(path: str | None, **context) -> Callable[[dict], None]:
    """A function that appends a measured row, with `context` (what every row of this run shares), to the
    JSON-lines file `path` and closes it at once, so that a run cut off later still leaves what it measured;
    one that does nothing without a path."""
    def write(row: dict) -> None:
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({**context, **row}, default=_plain) + "\n")
    return write


def _plain(value):
    """numpy scalars as the Python numbers json writes."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} in a benchmark row is not JSON")


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def hf_on_gpu(hf_variants: list) -> bool:
    """Whether the HF peers ((device, compile) pairs) share a GPU with bertjax: then runners take turns."""
    return any(device != "cpu" for device, _ in hf_variants)


def measure_runners(runners: list, warmup: int, steps: int, one_at_a_time: bool,
                    done: Callable[[int, dict, int | None], None] = lambda i, timing, peak: None) -> tuple[list, list]:
    """timing.measure's figures and each runner's peak memory. On a GPU the runners take turns, the HF
    ones first, each releasing its cached memory after: large's bertjax and two HF peers would not fit
    in one device's memory together, and a device that runs one program has no load to share out.
    done(i, timing, peak) is called as each runner's figures are known, the HF ones first, so that a
    run cut off later still reports them."""
    order = [*range(1, len(runners)), 0]
    if not one_at_a_time:
        timings = measure(runners, warmup, steps)
        peaks = [runner.peak_bytes() for runner in runners]
        for i in order:
            done(i, timings[i], peaks[i])
        return timings, peaks
    timings, peaks = [None] * len(runners), [None] * len(runners)
    for i in order:
        runner = runners[i]
        runner.reset_peak()
        timings[i] = measure([runner], warmup, steps)[0]
        peaks[i] = runner.peak_bytes()
        runner.release()
        done(i, timings[i], peaks[i])
    return timings, peaks


def run_shape(size: str, seq_len: int, batch_size: int, *, steps: int, warmup: int, dtype, overrides: dict,
              dropout_rng: str, hf_variants: list, profile: str | None, peak: float | None,
              memory_only: bool = False, record: Callable[[dict], None] = lambda row: None,
              hlo_path: str | None = None) -> list[dict]:
    """bertjax and the HF variants ((device, compile) pairs) on one shape; one result row per runner, each
    passed to `record` as soon as it is measured. hlo_path: where bertjax's compiled step is written as
    optimized HLO text (the layouts around the attention kernel are read there)."""
    num_predictions = max_predictions(seq_len)
    config = benchmark_config(load_config(size), dtype, overrides, seq_len, num_predictions,
                              dropout_rng)
    batches = make_batches(min(warmup + steps, 8), batch_size, seq_len, num_predictions)
    runners = [BertjaxStep(config, batches)]
    if hlo_path:
        with open(hlo_path, "w") as f:
            f.write(runners[0].compiled.as_text())
    cfg = runners[0].bert_config
    flops_per_token = flops.config_flops_per_token(cfg, seq_len, num_predictions / seq_len)
    print(f"  {size} {batch_size} x {seq_len}: bertjax {cfg.dtype}, {cfg.attention_impl} attention, "
          f"{cfg.word_embedding} embedding, remat {cfg.remat_policy}, scan {cfg.scan_layers}; compiled in "
          f"{runners[0].compile_seconds:.1f} s, step memory {_gib(runners[0].memory_bytes)}", flush=True)
    if memory_only:
        return []
    # HF is built from the config as the recipe writes it (platform "cpu": its own dropout rates; on a
    # GPU bertjax's cuDNN attention has no attention-probability dropout, HF's sdpa keeps it).
    hf_config = hf_peer_config(BertConfig.from_dict(config.model, platform="cpu"))
    for device, compile in hf_variants:
        runners.append(HFStep(hf_config, batches, device=device, compile=compile))
    tokens = batch_size * seq_len
    rows = [None] * len(runners)

    def done(i: int, t: dict, peak_memory: int | None) -> None:
        runner = runners[i]
        tps = steps * tokens / t["seconds"]
        memory = runner.memory_bytes if runner.name == "bertjax" else None
        rows[i] = dict(kind="step", size=size, seq_len=seq_len, batch_size=batch_size,
                       shape=f"{batch_size}x{seq_len}", runner=runner.name, params=runner.params, tps=tps,
                       best_tps=tokens / t["best"], ms=1e3 * t["seconds"] / steps,
                       tflops=flops_per_token * tps / 1e12, first=t["first_step"],
                       mfu=None if peak is None else flops.mfu(tps, flops_per_token, 1, peak), loss=t["loss"],
                       memory=memory, peak_memory=peak_memory, versions=getattr(runner, "versions", None))
        if i == 0:  # measured last: bertjax's tokens/s over each HF runner's, and what its step was
            rows[0].update(ratios={r["runner"]: tps / r["tps"] for r in rows[1:]}, dtype=cfg.dtype,
                           attention=cfg.attention_impl, remat_policy=cfg.remat_policy, scan_layers=cfg.scan_layers,
                           compile_seconds=runner.compile_seconds)
        record(rows[i])
        label = runner.name + (f" ({runner.architecture})" if hasattr(runner, "architecture") else "")
        print(f"    {label}: {_si(tps)} tok/s ({rows[i]['ms']:.1f} ms/step, fastest "
              f"{1e3 * t['best']:.1f}, first {t['first_step']:.1f} s, loss {t['loss']:.2f})", flush=True)

    measure_runners(runners, warmup, steps, one_at_a_time=hf_on_gpu(hf_variants), done=done)
    if profile:
        print_profile(f"{size} {batch_size} x {seq_len} bertjax",
                      profile_steps(runners[0], os.path.join(profile, f"{size}_{batch_size}x{seq_len}")))
    for row in rows[1:]:
        row["ratio"] = rows[0]["tps"] / row["tps"]
    return rows


def run_packing(size: str, seq_len: int, batch_size: int, *, steps: int, warmup: int, dtype, overrides: dict,
                dropout_rng: str, record: Callable[[dict], None] = lambda row: None) -> list[dict]:
    """bertjax on rows of one example each, padded at the right, and on packed rows, the examples of
    both drawn with the demo corpus's lengths (synthetic.synthetic_lengths): real tokens/s of each."""
    num_predictions = max_predictions(seq_len)
    sequences = 16 if seq_len > 256 else 8  # data.max_sequences_per_row of the seq-128 and seq-512 recipes
    runners, real = [], []
    for packed in (False, True):
        config = benchmark_config(load_config(size), dtype, overrides, seq_len, num_predictions, dropout_rng)
        config.data.update(packing=packed, max_sequences_per_row=sequences)
        batches = [synthetic.synthetic_batch(i, batch_size=batch_size, max_seq_length=seq_len,
                                             max_predictions_per_seq=num_predictions, vocab_size=VOCAB_SIZE,
                                             packed=packed, padded=not packed, max_sequences_per_row=sequences)
                   for i in range(min(warmup + steps, 8))]
        runner = BertjaxStep(config, batches)
        runner.name = "packed" if packed else "padded"
        runners.append(runner)
        real.append(float(np.mean([b["input_mask"].sum() for b in batches])))  # real tokens of a batch
    timings = measure(runners, warmup, steps)
    rows = []
    for runner, t, tokens in zip(runners, timings, real):
        rows.append(dict(kind="packing", size=size, seq_len=seq_len, batch_size=batch_size,
                         shape=f"{batch_size}x{seq_len}", rows=runner.name, share=tokens / (batch_size * seq_len),
                         real_tps=steps * tokens / t["seconds"], ms=1e3 * t["seconds"] / steps))
    rows[1]["ratio"] = rows[1]["real_tps"] / rows[0]["real_tps"]
    for row in rows:
        record(row)
    return rows


def print_packing(rows: list[dict]) -> None:
    table = [[f"{r['size']} {r['batch_size']} x {r['seq_len']}", r["rows"], f"{100 * r['share']:.1f}%",
              f"{r['real_tps']:,.0f}", f"{r['ms']:.1f}", f"{r['ratio']:.2f}x" if "ratio" in r else "-"]
             for r in rows]
    print_table(["shape", "rows", "real tokens", "real tok/s", "ms/step", "packed / padded"], table)


LONG_ROW_SEQUENCES = 16  # K of a long packed row: its documents are S / 50 to S long (the seq-512 quantiles)


def long_row_measurement(size: str, seq_len: int, batch_size: int, attention_impl: str, *, steps: int, warmup: int,
                         dtype, overrides: dict, dropout_rng: str) -> dict:
    """One attention implementation's train step on packed rows of seq_len tokens, in this process (which
    run_long_rows starts fresh for it, so that its peak resident memory is the step's alone): tokens/s,
    the compiled step's temporaries and memory, this process's peak RSS."""
    num_predictions = max_predictions(seq_len)
    config = benchmark_config(load_config(size), dtype, overrides, seq_len, num_predictions, dropout_rng)
    config.model.update(attention_impl=attention_impl, attention_dropout_rate=0.0)
    config.data.update(packing=True, max_sequences_per_row=LONG_ROW_SEQUENCES)
    batches = [synthetic.synthetic_batch(i, batch_size=batch_size, max_seq_length=seq_len,
                                         max_predictions_per_seq=num_predictions, vocab_size=VOCAB_SIZE,
                                         packed=True, max_sequences_per_row=LONG_ROW_SEQUENCES)
               for i in range(min(warmup + steps, 4))]
    runner = BertjaxStep(config, batches)
    t = measure([runner], warmup, steps)[0]
    analysis = runner.compiled.memory_analysis()
    tps = steps * batch_size * seq_len / t["seconds"]
    flops_per_token = flops.config_flops_per_token(runner.bert_config, seq_len, num_predictions / seq_len)
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
    return dict(kind="long_rows", size=size, seq_len=seq_len, batch_size=batch_size,
                shape=f"{batch_size}x{seq_len}", runner="bertjax", attention=attention_impl,
                block=runner.bert_config.attention_block_size, ms=1e3 * t["seconds"] / steps, tps=tps,
                tflops=flops_per_token * tps / 1e12,
                mfu=None if peak is None else flops.mfu(tps, flops_per_token, 1, peak), first=t["first_step"],
                loss=t["loss"], first_loss=t["first_loss"],
                compile=runner.compile_seconds, temp=None if analysis is None else int(analysis.temp_size_in_bytes),
                memory=runner.memory_bytes, max_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                sequences=float(np.mean([b["sentence_weights"].sum(axis=1).mean() for b in batches])))


def run_long_rows(size: str, seq_lens: list[int], batch_size: int, attention_impls: list[str], *, timeout: float,
                  record: Callable[[dict], None] = lambda row: None, **common) -> list[dict]:
    """long_row_measurement of each length and implementation, each in a fresh Python process; one that
    runs out of memory or past `timeout` seconds is a row saying so. Each row goes to `record` as it comes."""
    rows = []
    for seq_len in seq_lens:
        for impl in attention_impls:
            args = dict(size=size, seq_len=seq_len, batch_size=batch_size, attention_impl=impl, **common)
            code = ("import json, sys; from bertjax.bench import step_speed as b; "
                    "print('RESULT', json.dumps(b.long_row_measurement(**json.loads(sys.argv[1]))))")
            row = dict(kind="long_rows", size=size, seq_len=seq_len, batch_size=batch_size,
                       shape=f"{batch_size}x{seq_len}", runner="bertjax", attention=impl)
            try:
                done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                row["failed"] = f"not done in {timeout:.0f} s"
            else:
                results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if results:
                    row = json.loads(results[-1][len("RESULT "):])
                else:
                    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                    row["failed"] = f"exit status {done.returncode}: {last[-160:]}"
            rows.append(row)
            record(row)
            print(f"    {size} {batch_size} x {seq_len} {impl}: "
                  + (row["failed"] if "failed" in row else f"{_si(row['tps'])} tok/s, temporaries "
                     f"{_mib(row['temp'])}, peak RSS {_mib(row['max_rss'])}, loss at step 1 {row['first_loss']:.5f}"),
                  flush=True)
    return rows


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def print_long_rows(rows: list[dict]) -> None:
    table = []
    for r in rows:
        shape = f"{r['size']} {r['batch_size']} x {r['seq_len']}"
        if "failed" in r:
            table.append([shape, r["attention"], r["failed"]] + ["-"] * 7)
            continue
        attention = r["attention"] + (f" ({r['block']})" if r["attention"] == "blockwise" else "")
        table.append([shape, attention, f"{r['tps']:,.0f}", f"{r['ms']:,.0f}", _mib(r["temp"]), _mib(r["memory"]),
                      _mib(r["max_rss"]), f"{r['compile']:.1f}", f"{r['sequences']:.1f}", f"{r['first_loss']:.5f}"])
    print()
    print_table(["shape", "attention (block)", "tok/s", "ms/step", "temporaries", "step memory", "peak RSS",
                 "compile s", "sequences/row", "loss, step 1"], table)
    print("packed rows of synthetic documents (the seq-512 length quantiles scaled to the row); temporaries: "
          "the compiled step's memory_analysis(); step memory: arguments + outputs + temporaries - donated; "
          "peak RSS: the fresh process's whole, JAX and compilation included; loss, step 1: the same batch at the "
          "same initial weights, which every implementation should give alike")


def print_results(rows: list[dict], peak: float | None) -> None:
    header = ["shape", "runner", "params", "tok/s", "ms/step", "model TFLOP/s", "MFU", "memory", "bertjax / this"]
    table = []
    for r in rows:
        memory = r["memory"] if r["memory"] is not None else r["peak_memory"]
        table.append([f"{r['size']} {r['batch_size']} x {r['seq_len']}", r["runner"], f"{r['params'] / 1e6:.1f}M",
                      f"{r['tps']:,.0f}", f"{r['ms']:,.1f}", f"{r['tflops']:.3f}",
                      "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%", _gib(memory),
                      f"{r['ratio']:.2f}x" if "ratio" in r else "-"])
    print()
    print_table(header, table)
    print("model TFLOP/s: tokens/s x flops.config_flops_per_token (the MLM head at the predicted positions); "
          "memory: bertjax's compiled step (arguments + outputs + temporaries - donated), HF's peak allocation"
          + ("" if peak else "; MFU needs a known accelerator peak"))


def what_to_run(accelerator: bool, sizes: list[str] | None, shape: tuple[int, int], shape_given: bool,
                no_torch: bool, no_torch_compile: bool, long_rows: bool) -> tuple[list[str], tuple, list]:
    """(sizes, (seq_len, batch_size) shapes, HF variants as (device, compiled)): on an accelerator base and
    large at ACCELERATOR_SHAPES beside HF eager and compiled on CUDA; on a CPU mini, small and base beside
    HF eager."""
    if accelerator:
        cuda = not no_torch and torch_cuda_available()
        hf_variants = [("cuda", False)] + ([] if no_torch_compile else [("cuda", True)]) if cuda else []
        return sizes or ["base", "large"], ((shape,) if shape_given else ACCELERATOR_SHAPES), hf_variants
    return sizes or ["mini", "small", "base"], (shape,), [] if no_torch or long_rows else [("cpu", False)]


def benchmark(*, sizes: list[str] | None, seq_len: int, batch_size: int, shape_given: bool, steps: int, warmup: int,
              dtype: str | None, overrides: dict, dropout_rng: str, accelerator: bool | None, no_torch: bool,
              no_torch_compile: bool, profile: str | None, packing: bool, memory_only: bool,
              embeddings: bool | None = False, texts: int = 2048, max_length: int = 256,
              embed_passes: int = 3, long_rows: list[int] = (), attention_impls: list[str] = ("xla", "blockwise"),
              long_row_timeout: float = 1200.0, json_path: str | None = None,
              json_label: str | None = None, hlo_path: str | None = None) -> dict | None:
    """The benchmark the flags ask for (python -m bertjax.benchmark --help), printed; each measured row
    of the step, --packing and --long_rows also appended to `json_path` as it is measured (row_writer);
    --embeddings' rows returned (embedding_speed.benchmark's)."""
    if steps < 1 or warmup < 1:
        raise ValueError("--steps and --warmup must be at least 1 (the first warmup step compiles)")
    if accelerator is None:
        accelerator = jax.default_backend() != "cpu"
    embedding_figures = functools.partial(
        embedding_speed.benchmark, overrides=overrides, num_texts=texts, max_length=max_length,
        batch_size=batch_size, passes=embed_passes, steps=steps, warmup=warmup, no_torch=no_torch)
    if embeddings:
        return embedding_figures()
    device = jax.devices()[0]
    peak = flops.peak_flops_per_device(device.device_kind)
    requested = sizes
    sizes, shapes, hf_variants = what_to_run(accelerator, sizes, (seq_len, batch_size), shape_given, no_torch,
                                             no_torch_compile, bool(long_rows))
    turns = "one runner at a time" if hf_on_gpu(hf_variants) else "alternating blocks"
    print(f"backend {jax.default_backend()}: {device.device_kind}, {os.cpu_count()} CPUs, load "
          f"{load_average()}; peak bf16 {'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}; "
          f"{warmup} warmup + {steps} timed steps, {turns}; HF: "
          f"{', '.join(('compiled' if c else 'eager') + ' on ' + d for d, c in hf_variants) or 'not run'}"
          + (f"; overrides {overrides}" if overrides else ""), flush=True)
    record = row_writer(json_path, label=json_label, device=device.device_kind, jax=jax.__version__,
                        xla_flags=os.environ.get("XLA_FLAGS", ""), overrides=overrides,
                        dropout_rng=dropout_rng, steps=steps, warmup=warmup)
    common = dict(steps=steps, warmup=warmup, dtype=dtype, overrides=overrides, dropout_rng=dropout_rng,
                  record=record)
    if long_rows:
        print_long_rows([row for size in requested or ["modernbert_tiny"]
                         for row in run_long_rows(size, long_rows, batch_size if shape_given else 1, attention_impls,
                                                  timeout=long_row_timeout, **common)])
        return
    if packing:
        print_packing([row for size in requested or ["tiny", "mini"] for seq, batch in shapes
                       for row in run_packing(size, seq, batch, **common)])
        return
    rows = [row for size in sizes for seq, batch in shapes
            for row in run_shape(size, seq, batch, hf_variants=hf_variants, profile=profile, peak=peak,
                                 hlo_path=hlo_path, memory_only=memory_only, **common)]
    if rows:
        print_results(rows, peak)
    versions = {row["versions"] for row in rows if row.get("versions")}
    if versions:
        print(f"HF: {', '.join(sorted(versions))}, sdpa attention")
    print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average "
          f"{load_average()}", flush=True)
    assert "tensorflow" not in sys.modules, "TensorFlow was imported on the benchmark path"
    if accelerator and embeddings is None and not memory_only:
        embedding_figures()
