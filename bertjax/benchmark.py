"""python -m bertjax.benchmark: tokens/s of the full training step, beside Hugging Face on the same shapes.

    python -m bertjax.benchmark                                   # CPU: mini, small, base at 32 x 128, vs HF
    python -m bertjax.benchmark --sizes=base --steps=5 --no_torch # bertjax alone
    python -m bertjax.benchmark --sizes=roberta_base,albert_base,modernbert_base  # the families, vs HF
    python -m bertjax.benchmark --sizes=tiny,mini --packing       # packed rows against padded ones
    python -m bertjax.benchmark --accelerator                     # GPU/TPU: base and large, bf16, vs HF
    python -m bertjax.benchmark --accelerator --profile=/tmp/prof # and a trace, kernel time by category

What is timed is the whole optimizer step as the trainer runs it (training.step.train_step: forward, backward,
the config's clipping and optimizer, BERT's AdamW for BERT; state donated), built by pretraining.setup from
configs/<size>.py on a one-device mesh, on synthetic full-length batches. Every pretraining config under
configs/ is a size (BERT's and the RoBERTa, ALBERT and ModernBERT ones), all at the benchmark's
vocabulary (BERT's 30,522) and shapes (BERT's 15% of predictions, for ModernBERT's 30% too). The
platform's defaults apply (bert.PLATFORM_DEFAULTS: bf16 and cuDNN attention on GPUs, float32 and XLA
attention on CPUs) unless --dtype or --model_overrides say otherwise. The Hugging Face class the config
converts to (BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining, ModernBertForMaskedLM) runs
the same batches in PyTorch: on the CPU eager in float32; on a GPU eager and torch.compile'd, with sdpa
attention, bf16 autocast, fused AdamW and clipping 1.0. Printed: tokens/s, model TFLOP/s and MFU, the
step's memory (bertjax: the compiled step's memory_analysis(); HF: torch's peak allocation) and bertjax's
ratio to each HF variant.
docs/performance.md records the figures. No TensorFlow is imported here.
"""

import collections
import contextlib
import gzip
import json
import os
import pathlib
import re
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

import configs.albert_base
import configs.albert_tiny
import configs.base
import configs.large
import configs.medium
import configs.mini
import configs.modernbert_base
import configs.modernbert_large
import configs.modernbert_tiny
import configs.roberta_base
import configs.roberta_tiny
import configs.small
import configs.tiny

from bertjax.runs import console
from bertjax.interop import hf
from bertjax.training import flops
from bertjax.models import bert
from bertjax.training import sharding
from bertjax.training import pretraining
from bertjax.training import state as train_state
from bertjax.data import synthetic

def define_flags(argv: list[str]) -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        sizes=flags.DEFINE_list("sizes", None, "Model configs (configs/<size>.py: tiny ... large, roberta_base, "
                                "albert_tiny, modernbert_large, ...). Default: mini,small,base on the CPU, "
                                "base,large with --accelerator."),
        batch=flags.DEFINE_integer("batch_size", 32, "Sequences per step (CPU mode; with --accelerator it replaces "
                                   "the default shapes when given)."),
        seq=flags.DEFINE_integer("seq_len", 128, "Tokens per sequence (CPU mode; with --accelerator it replaces the "
                                 "default shapes when given)."),
        steps=flags.DEFINE_integer("steps", 10, "Timed steps per measurement."),
        warmup=flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first one compiles)."),
        dtype=flags.DEFINE_string("dtype", None, "Compute dtype of bertjax (default: the platform's, float32 on "
                                  "the CPU, bfloat16 on accelerators)."),
        no_torch=flags.DEFINE_bool("no_torch", False, "Time bertjax only (no PyTorch import)."),
        no_compile=flags.DEFINE_bool("no_torch_compile", False, "On a GPU, skip the torch.compile variant of HF."),
        accelerator=flags.DEFINE_bool("accelerator", None, "Accelerator mode: base and large, bf16, MFU. Default: on "
                                      "when jax.default_backend() is not 'cpu'."),
        # --model.scan_layers=false --model.remat_policy=full: ml_collections types and checks each value
        # against the model section (--model_overrides=scan_layers=false,remat_policy=full says the same).
        model=config_flags.DEFINE_config_dict("model", configs.base.get_config().model, "Overrides of the model "
                                              "config, e.g. --model.scan_layers=false (for performance "
                                              "investigations).", sys_argv=argv),
        overrides=flags.DEFINE_list("model_overrides", [], "key=value pairs for the model config, e.g. "
                                    "scan_layers=false,remat_policy=full: the same as --model.KEY=VALUE."),
        dropout_rng=flags.DEFINE_string("dropout_rng", "threefry", "train.dropout_rng: threefry | rbg."),
        profile=flags.DEFINE_string("profile", None, "Write a jax.profiler trace of a few bertjax steps under this "
                                    "directory and print the device time per step by kernel category."),
        packing=flags.DEFINE_bool("packing", False, "Time bertjax on packed rows against rows of one padded "
                                  "example each, both of the demo corpus's example lengths: real tokens/s."),
        memory_only=flags.DEFINE_bool("memory_only", False, "Compile bertjax's step and print its memory; run nothing "
                                       "(e.g. to choose a remat policy for a GPU on a CPU machine)."),
    )

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
         "modernbert_large": configs.modernbert_large}


def load_config(size: str):
    """configs/<size>.py's get_config(), as --config=configs/<size>.py would give it."""
    if size not in SIZES:
        raise ValueError(f"no config for size {size!r}: choose from {', '.join(SIZES)}")
    return SIZES[size].get_config()


def with_model_overrides(argv: list[str]) -> list[str]:
    """argv with --model_overrides=a=1,b=2 spelt as ml_collections' own --model.a=1 --model.b=2, which then
    types and checks each value against the model section."""
    out = []
    for arg in argv:
        name, _, value = arg.partition("=")
        if name not in ("--model_overrides", "-model_overrides"):
            out.append(arg)
            continue
        for pair in filter(None, (p.strip() for p in value.split(","))):
            if "=" not in pair:
                console.fail(f"--model_overrides entry {pair!r} is not key=value")
            out.append(f"--model.{pair}")
    return out


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
    bert.BertConfig.from_dict(config.model)
    return config


# ---------------------------------------------------------------------------------------------------
# bertjax
# ---------------------------------------------------------------------------------------------------


def make_batches(n: int, batch_size: int, seq_len: int, num_predictions: int) -> list:
    return [synthetic.synthetic_batch(i, batch_size=batch_size, max_seq_length=seq_len,
                                      max_predictions_per_seq=num_predictions, vocab_size=VOCAB_SIZE)
            for i in range(n)]


class BertjaxStep:
    """The trainer's state and step on one device, built by pretraining.setup as the training program builds
    them (shardings, donated state), compiled ahead of time so that its memory can be read."""

    name = "bertjax"

    def __init__(self, config, batches: list):
        self.mesh = sharding.make_mesh(dict.fromkeys(sharding.MESH_AXES, 1), jax.devices()[:1])
        rules = sharding.logical_rules(config.logical_axis_rules)
        init_key, self.dropout_key = train_state.root_keys(config.train.seed, config.train.dropout_rng)
        setup = pretraining.setup(config, self.mesh, rules, init_key)
        self.bert_config = setup.bert_config
        self.state = setup.init(init_key)
        self.params = bert.count_params(self.state.params)
        data_sharding = sharding.batch_sharding(self.mesh, rules)
        step_fn, _ = setup.compile_steps(data_sharding, grad_accum_steps=1)
        keys = pretraining.batch_keys(config.data.get("packing", False))
        self.batches = [sharding.global_batch({k: b[k] for k in keys}, data_sharding)
                        for b in batches]
        start = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.compiled = step_fn.lower(self.state, self.batches[0], self.dropout_key).compile()
        self.compile_seconds = time.perf_counter() - start
        self.memory_bytes = compiled_memory(self.compiled)
        self.count, self.sums = 0, None

    def step(self) -> float:
        """One step, waited for: its seconds."""
        batch = self.batches[self.count % len(self.batches)]
        start = time.perf_counter()
        self.state, self.sums = self.compiled(self.state, batch, self.dropout_key)
        jax.block_until_ready((self.state, self.sums))
        self.count += 1
        return time.perf_counter() - start

    def loss(self) -> float:
        return float(self.sums["loss_sum"])

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


# ---------------------------------------------------------------------------------------------------
# Hugging Face (PyTorch)
# ---------------------------------------------------------------------------------------------------


def torch_cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# The label of the sentence head, by the HF class that has one (the masked-LM classes have none).
HF_SENTENCE_LABELS = {"BertForPreTraining": "next_sentence_label", "AlbertForPreTraining": "sentence_order_label"}


def hf_peer_config(cfg: bert.BertConfig) -> dict:
    """The config.json dict of the Hugging Face class that computes `cfg`'s network (its architectures[0])."""
    try:
        return hf.config_to_hf(cfg)  # its family's (hf.family_of_config)
    except ValueError as e:
        raise ValueError(f"{e}; no Hugging Face class to time beside it: run with --no_torch") from e


class HFStep:
    """The Hugging Face class of the config (hf_peer_config) in train mode with torch.optim.AdamW, on the
    same batches: MLM labels at the masked positions, the sentence label where the class has a sentence
    head, token types where the model has more than one.

    On the CPU: eager, float32. On a GPU: sdpa attention, bf16 autocast, fused AdamW, global-norm
    clipping 1.0, eager or torch.compile'd."""

    def __init__(self, hf_config: dict, batches: list, device: str = "cpu", compile: bool = False):
        import torch
        import transformers

        self.torch, self.device, self.compiled = torch, device, compile
        self.name = "HF compiled" if compile else "HF eager"
        if device == "cpu":
            torch.set_num_threads(os.cpu_count())
        torch.manual_seed(0)
        fields = {k: v for k, v in hf_config.items() if k not in ("model_type", "dtype", "torch_dtype")}
        architecture = self.architecture = fields["architectures"][0]
        config = transformers.AutoConfig.for_model(hf_config["model_type"], **fields, attn_implementation="sdpa")
        net = getattr(transformers, architecture)(config).to(device).train()
        self.params = sum(p.numel() for p in net.parameters())
        self.attention = getattr(net.config, "_attn_implementation", None) or "eager"
        self.threads = torch.get_num_threads()
        self.versions = f"transformers {transformers.__version__}, torch {torch.__version__}"
        on_gpu = device != "cpu"
        self.opt = torch.optim.AdamW(net.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=on_gpu)
        self.params_list = list(net.parameters())
        self.net = torch.compile(net) if compile else net
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if on_gpu else contextlib.nullcontext
        sentence_label = HF_SENTENCE_LABELS.get(architecture)
        # RoBERTa's one segment and ModernBERT's none: bertjax reads no segment ids there either.
        token_types = hf_config.get("type_vocab_size", 0) > 1

        def to_torch(b):
            # MLM labels at every position, -100 (ignored) except at the masked ones.
            labels = np.full(b["input_ids"].shape, -100, np.int64)
            rows = np.arange(labels.shape[0])[:, None]
            labels[rows, b["masked_lm_positions"]] = np.where(b["masked_lm_weights"] > 0, b["masked_lm_ids"], -100)
            tensors = dict(input_ids=b["input_ids"], attention_mask=b["input_mask"], labels=labels)
            if token_types:
                tensors["token_type_ids"] = b["segment_ids"]
            if sentence_label:
                tensors[sentence_label] = b["next_sentence_labels"]
            return {k: torch.from_numpy(np.asarray(v).astype(np.int64)).to(device) for k, v in tensors.items()}

        self.batches = [to_torch(b) for b in batches]
        self.count, self._loss = 0, None
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()

    def _sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def step(self) -> float:
        batch = self.batches[self.count % len(self.batches)]
        self._sync()
        start = time.perf_counter()
        with self.autocast():
            loss = self.net(**batch).loss
        loss.backward()
        if self.device != "cpu":
            self.torch.nn.utils.clip_grad_norm_(self.params_list, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        self.count += 1
        self._loss = loss
        return time.perf_counter() - start

    def loss(self) -> float:
        return float(self._loss.detach().float())

    def peak_bytes(self) -> int | None:
        return int(self.torch.cuda.max_memory_allocated()) if self.device != "cpu" else None


def measure(runners: list, warmup: int, steps: int) -> list[dict]:
    """Warm every runner up (its first step compiles), then time `steps` steps of each, interleaved
    (one step of each in turn), so that a change in the machine's load falls on all of them alike.
    Per runner: seconds of the timed steps, the fastest step and the first step's seconds."""
    firsts = []
    for runner in runners:
        firsts.append(runner.step())
        for _ in range(warmup - 1):
            runner.step()
    times = [[] for _ in runners]
    for _ in range(steps):
        for runner, t in zip(runners, times):
            t.append(runner.step())
    out = []
    for runner, t, first in zip(runners, times, firsts):
        loss = runner.loss()
        if not np.isfinite(loss):
            raise FloatingPointError(f"{runner.name} loss is {loss} after {warmup + steps} steps")
        out.append(dict(seconds=sum(t), best=min(t), median=float(np.median(t)), first_step=first, loss=loss))
    return out


# ---------------------------------------------------------------------------------------------------
# Profile: device time by kernel category
# ---------------------------------------------------------------------------------------------------

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


def profile_steps(runner: BertjaxStep, directory: str, steps: int = 3) -> dict[str, float]:
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


# ---------------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------------


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def print_table(header, rows) -> None:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))), flush=True)
        if j == 0:
            print("  ".join("-" * w for w in widths), flush=True)


def run_shape(size: str, seq_len: int, batch_size: int, *, steps: int, warmup: int, dtype, overrides: dict,
              dropout_rng: str, hf_variants: list, profile: str | None, peak: float | None,
              memory_only: bool = False) -> list[dict]:
    """bertjax and the HF variants ((device, compile) pairs) on one shape; one result row per runner."""
    num_predictions = max_predictions(seq_len)
    config = benchmark_config(load_config(size), dtype, overrides, seq_len, num_predictions,
                              dropout_rng)
    batches = make_batches(min(warmup + steps, 8), batch_size, seq_len, num_predictions)
    runners = [BertjaxStep(config, batches)]
    cfg = runners[0].bert_config
    flops_per_token = flops.config_flops_per_token(cfg, seq_len, num_predictions / seq_len)
    print(f"  {size} {batch_size} x {seq_len}: bertjax {cfg.dtype}, {cfg.attention_impl} attention, "
          f"{cfg.word_embedding} embedding, remat {cfg.remat_policy}, scan {cfg.scan_layers}; compiled in "
          f"{runners[0].compile_seconds:.1f} s, step memory {_gib(runners[0].memory_bytes)}", flush=True)
    if memory_only:
        return []
    # HF is built from the config as the recipe writes it (platform "cpu": its own dropout rates; on a
    # GPU bertjax's cuDNN attention has no attention-probability dropout, HF's sdpa keeps it).
    hf_config = hf_peer_config(bert.BertConfig.from_dict(config.model, platform="cpu"))
    for device, compile in hf_variants:
        runners.append(HFStep(hf_config, batches, device=device, compile=compile))
    timings = measure(runners, warmup, steps)
    tokens = batch_size * seq_len
    rows = []
    for runner, t in zip(runners, timings):
        tps = steps * tokens / t["seconds"]
        memory = runner.memory_bytes if runner.name == "bertjax" else None
        rows.append(dict(size=size, seq_len=seq_len, batch_size=batch_size, runner=runner.name,
                         params=runner.params, tps=tps, best_tps=tokens / t["best"],
                         ms=1e3 * t["seconds"] / steps, tflops=flops_per_token * tps / 1e12, first=t["first_step"],
                         mfu=None if peak is None else flops.mfu(tps, flops_per_token, 1, peak), loss=t["loss"],
                         memory=memory, peak_memory=runner.peak_bytes()))
        label = runner.name + (f" ({runner.architecture})" if hasattr(runner, "architecture") else "")
        print(f"    {label}: {_si(tps)} tok/s ({rows[-1]['ms']:.1f} ms/step, fastest "
              f"{1e3 * t['best']:.1f}, first {t['first_step']:.1f} s, loss {t['loss']:.2f})", flush=True)
    if profile:
        print_profile(f"{size} {batch_size} x {seq_len} bertjax",
                      profile_steps(runners[0], os.path.join(profile, f"{size}_{batch_size}x{seq_len}")))
    for row in rows[1:]:
        row["ratio"] = rows[0]["tps"] / row["tps"]
    return rows


def run_packing(size: str, seq_len: int, batch_size: int, *, steps: int, warmup: int, dtype, overrides: dict,
                dropout_rng: str) -> list[dict]:
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
        rows.append(dict(size=size, seq_len=seq_len, batch_size=batch_size, rows=runner.name,
                         share=tokens / (batch_size * seq_len), real_tps=steps * tokens / t["seconds"],
                         ms=1e3 * t["seconds"] / steps))
    rows[1]["ratio"] = rows[1]["real_tps"] / rows[0]["real_tps"]
    return rows


def print_packing(rows: list[dict]) -> None:
    table = [[f"{r['size']} {r['batch_size']} x {r['seq_len']}", r["rows"], f"{100 * r['share']:.1f}%",
              f"{r['real_tps']:,.0f}", f"{r['ms']:.1f}", f"{r['ratio']:.2f}x" if "ratio" in r else "-"]
             for r in rows]
    print_table(["shape", "rows", "real tokens", "real tok/s", "ms/step", "packed / padded"], table)


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


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    accelerator = args.accelerator
    if accelerator is None:
        accelerator = jax.default_backend() != "cpu"
    try:
        overrides = config_flags.get_override_values(flags.FLAGS["model"])
        if args.steps < 1 or args.warmup < 1:
            raise ValueError("--steps and --warmup must be at least 1 (the first warmup step compiles)")
        device = jax.devices()[0]
        peak = flops.peak_flops_per_device(device.device_kind)
        if accelerator:
            sizes = args.sizes or ["base", "large"]
            shapes = ACCELERATOR_SHAPES
            if flags.FLAGS["seq_len"].present or flags.FLAGS["batch_size"].present:
                shapes = ((args.seq, args.batch),)
            cuda = not args.no_torch and torch_cuda_available()
            hf_variants = [("cuda", False)] + ([] if args.no_compile else [("cuda", True)]) if cuda else []
        else:
            sizes, shapes = args.sizes or ["mini", "small", "base"], ((args.seq, args.batch),)
            hf_variants = [] if args.no_torch else [("cpu", False)]
        print(f"backend {jax.default_backend()}: {device.device_kind}, {os.cpu_count()} CPUs, load "
              f"{load_average()}; peak bf16 {'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}; "
              f"{args.warmup} warmup + {args.steps} timed steps, interleaved; HF: "
              f"{', '.join(('compiled' if c else 'eager') + ' on ' + d for d, c in hf_variants) or 'not run'}"
              + (f"; overrides {overrides}" if overrides else ""), flush=True)
        if args.packing:
            packing_rows = []
            for size in args.sizes or ["tiny", "mini"]:
                for seq_len, batch_size in shapes:
                    packing_rows += run_packing(size, seq_len, batch_size, steps=args.steps, warmup=args.warmup,
                                                dtype=args.dtype, overrides=overrides, dropout_rng=args.dropout_rng)
            print_packing(packing_rows)
            return
        rows = []
        for size in sizes:
            for seq_len, batch_size in shapes:
                rows += run_shape(size, seq_len, batch_size, steps=args.steps, warmup=args.warmup,
                                  dtype=args.dtype, overrides=overrides, dropout_rng=args.dropout_rng,
                                  hf_variants=hf_variants, profile=args.profile, peak=peak,
                                  memory_only=args.memory_only)
        if rows:
            print_results(rows, peak)
        if hf_variants and rows:
            import torch
            import transformers

            print(f"HF: transformers {transformers.__version__}, torch {torch.__version__}, sdpa attention")
        print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average "
              f"{load_average()}", flush=True)
    except (ValueError, FileNotFoundError) as e:
        console.fail(str(e))
    assert "tensorflow" not in sys.modules, "TensorFlow was imported on the benchmark path"


def entry():
    argv = with_model_overrides(sys.argv)
    try:
        defined = define_flags(argv)  # the model overrides are checked here, against the model section
    except (AttributeError, KeyError) as e:
        while e.args and isinstance(e.args[0], BaseException):  # AttributeError(KeyError("'key'\nDid you..."))
            e = e.args[0]
        detail = "; ".join(line.strip("'\" ") for line in str(e.args[0] if e.args else e).splitlines())
        console.fail(f"unknown model config key in {' '.join(a for a in argv if a.startswith('--model.'))}: {detail}")
    console.run_program(main, lambda: defined, argv=argv)


if __name__ == "__main__":
    entry()
