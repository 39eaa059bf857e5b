"""python -m bertjax.benchmark: tokens/s of the full training step, against Hugging Face on the CPU.

    python -m bertjax.benchmark                                   # CPU: mini, small, base at 32 x 128, vs HF
    python -m bertjax.benchmark --sizes=base --steps=5 --no_torch # bertjax alone
    python -m bertjax.benchmark --accelerator                     # GPU/TPU: base, large, bf16, MFU

What is timed is the whole optimizer step as the trainer runs it: `train.train_step` (forward, backward,
global-norm clipping, BERT's AdamW update) jitted with the state donated, on `synthetic_batch` batches
(full-length sequences, max_predictions_per_seq masked positions: 20 at seq 128, 80 at seq 512). The
state and the jitted step come from `train.Setup`, as in bertjax.train, from configs/<size>.py on a
one-device mesh.

CPU mode (the default when jax.default_backend() == 'cpu') runs, in the same process and on the same
batches, Hugging Face `transformers.BertForPreTraining` in PyTorch (eager, train mode, fp32, dropout
0.1, exact GELU, torch.optim.AdamW(lr=1e-4, eps=1e-6, weight_decay=0.01), all CPU threads), and prints
tokens/s of both, their ratio, bertjax's ms/step and the model TFLOP/s achieved
(`flops.train_flops_per_token` x tokens/s). Compute is float32 on the CPU (bfloat16 matmuls are
emulated there), whatever the config says.

Accelerator mode (the default on a GPU or TPU) times base and large in bfloat16 compute at batch 64 x
seq 128 and batch 32 x seq 512 on one device, and prints tokens/s and MFU against
`flops.peak_flops_per_device(jax.devices()[0].device_kind)`. PyTorch is not imported there.

Variants for investigating performance: --model_overrides=scan_layers=false,remat_policy=full,...
(any BertConfig field), and the environment: XLA_FLAGS, JAX_DEFAULT_MATMUL_PRECISION. docs/performance.md
records the figures.

No TensorFlow is imported on this path (checked at the end): the benchmark runs on machines without it.
"""

import os
import pathlib
import runpy
import sys
import time

import jax
import numpy as np
from absl import app, flags

from bertjax import cli, model, sharding
from bertjax import flops as model_flops
from bertjax.data import synthetic
from bertjax.train import BATCH_KEYS, Setup

_SIZES = flags.DEFINE_list("sizes", None, "Model sizes (configs/<size>.py). Default: mini,small,base on the CPU, "
                           "base,large with --accelerator.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sequences per step (CPU mode; in accelerator mode it "
                              "replaces the 64/32 grid when given).")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per sequence (CPU mode; in accelerator mode it replaces "
                            "the 128/512 grid when given).")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per measurement.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first one compiles).")
_DTYPE = flags.DEFINE_string("dtype", None, "Compute dtype of bertjax: float32 on the CPU, bfloat16 with "
                             "--accelerator, unless given.")
_NO_TORCH = flags.DEFINE_bool("no_torch", False, "Time bertjax only (no PyTorch import).")
_ACCELERATOR = flags.DEFINE_bool("accelerator", None, "Accelerator mode: base and large, bf16, MFU. Default: on "
                                 "when jax.default_backend() is not 'cpu'.")
_OVERRIDES = flags.DEFINE_list("model_overrides", [], "key=value pairs for the model config, e.g. "
                               "scan_layers=false,remat_policy=full (for performance investigations).")
_CONFIG_DIR = flags.DEFINE_string("config_dir", None, "Where configs/<size>.py live (default: the repository's).")

VOCAB_SIZE = 30522
ACCELERATOR_SHAPES = ((128, 64), (512, 32))  # (seq_len, batch_size)


def max_predictions(seq_len: int) -> int:
    """BERT's max_predictions_per_seq: 20 at seq 128, 80 at seq 512 (0.15 x S rounded up to the recipe's)."""
    return {128: 20, 512: 80}.get(seq_len, max(1, round(0.15625 * seq_len)))


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


def load_config(size: str, config_dir: str | None = None):
    """configs/<size>.py's get_config(), as --config=configs/<size>.py would give it."""
    directory = pathlib.Path(config_dir) if config_dir else pathlib.Path(__file__).resolve().parents[1] / "configs"
    path = directory / f"{size}.py"
    if not path.exists():
        raise FileNotFoundError(f"no config file {path} for size {size!r}")
    return runpy.run_path(str(path))["get_config"]()


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_overrides(pairs) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--model_overrides entry {pair!r} is not key=value")
        key, value = pair.split("=", 1)
        out[key.strip()] = _parse_value(value.strip())
    return out


def benchmark_config(config, dtype: str, overrides: dict, seq_len: int, num_predictions: int):
    """The size's config with the benchmark's vocabulary, dtype, overrides and shapes; its model section
    is checked (an unknown override key is an error) by BertConfig.from_dict, here and in Setup."""
    config.model.update(vocab_size=VOCAB_SIZE, dtype=dtype, **overrides)
    config.data.update(max_seq_length=seq_len, max_predictions_per_seq=num_predictions)
    model.BertConfig.from_dict(config.model)
    return config


# ---------------------------------------------------------------------------------------------------
# bertjax
# ---------------------------------------------------------------------------------------------------


def make_batches(n: int, batch_size: int, seq_len: int, num_predictions: int) -> list:
    return [synthetic.synthetic_batch(i, batch_size=batch_size, max_seq_length=seq_len,
                                      max_predictions_per_seq=num_predictions, vocab_size=VOCAB_SIZE)
            for i in range(n)]


class BertjaxStep:
    """bertjax.train's state and jitted step on one device, built by train.Setup as the trainer builds
    them (shardings, donated state), on pre-generated batches."""

    name = "bertjax"

    def __init__(self, config, batches: list):
        self.mesh = sharding.make_mesh(dict.fromkeys(sharding.MESH_AXES, 1), jax.devices()[:1])
        rules = sharding.logical_rules(config.logical_axis_rules)
        init_key, self.dropout_key = jax.random.split(jax.random.key(config.train.seed))
        setup = Setup.create(config, self.mesh, rules, init_key)
        self.bert_config = setup.bert_config
        self.state = setup.init(init_key)
        self.params = model.count_params(self.state.params)
        data_sharding = sharding.batch_sharding(self.mesh, rules)
        self.step_fn, _ = setup.compile_steps(data_sharding, grad_accum_steps=1)
        self.batches = [sharding.global_batch({k: b[k] for k in BATCH_KEYS}, data_sharding) for b in batches]
        self.count, self.sums = 0, None

    def step(self) -> float:
        """One step, waited for: its seconds."""
        batch = self.batches[self.count % len(self.batches)]
        start = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.state, self.sums = self.step_fn(self.state, batch, self.dropout_key)
            jax.block_until_ready((self.state, self.sums))
        self.count += 1
        return time.perf_counter() - start

    def loss(self) -> float:
        return float(self.sums["loss_sum"])


# ---------------------------------------------------------------------------------------------------
# Hugging Face (PyTorch)
# ---------------------------------------------------------------------------------------------------


class HFStep:
    """transformers.BertForPreTraining, eager, train mode, fp32, torch.optim.AdamW, on the same batches."""

    name = "HF"

    def __init__(self, bert_config: model.BertConfig, batches: list):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count())
        torch.manual_seed(0)
        hf_config = transformers.BertConfig(
            vocab_size=bert_config.vocab_size, hidden_size=bert_config.hidden_size,
            num_hidden_layers=bert_config.num_layers, num_attention_heads=bert_config.num_heads,
            intermediate_size=bert_config.intermediate_size, hidden_act="gelu",
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            max_position_embeddings=bert_config.max_position_embeddings, type_vocab_size=bert_config.type_vocab_size,
            layer_norm_eps=bert_config.layer_norm_eps, initializer_range=bert_config.initializer_range,
        )
        self.net = transformers.BertForPreTraining(hf_config).train()
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)
        self.params = sum(p.numel() for p in self.net.parameters())
        self.attention = getattr(self.net.config, "_attn_implementation", None) or "eager"
        self.threads = torch.get_num_threads()
        self.versions = f"transformers {transformers.__version__}, torch {torch.__version__}"

        def to_torch(b):
            # MLM labels at every position, -100 (ignored) except at the masked ones.
            labels = np.full(b["input_ids"].shape, -100, np.int64)
            rows = np.arange(labels.shape[0])[:, None]
            labels[rows, b["masked_lm_positions"]] = np.where(b["masked_lm_weights"] > 0, b["masked_lm_ids"], -100)
            return dict(
                input_ids=torch.from_numpy(b["input_ids"].astype(np.int64)),
                token_type_ids=torch.from_numpy(b["segment_ids"].astype(np.int64)),
                attention_mask=torch.from_numpy(b["input_mask"].astype(np.int64)),
                labels=torch.from_numpy(labels),
                next_sentence_label=torch.from_numpy(b["next_sentence_labels"].astype(np.int64)),
            )

        self.batches = [to_torch(b) for b in batches]
        self.count, self._loss = 0, None

    def step(self) -> float:
        batch = self.batches[self.count % len(self.batches)]
        start = time.perf_counter()
        loss = self.net(**batch).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.count += 1
        seconds = time.perf_counter() - start
        self._loss = loss
        return seconds

    def loss(self) -> float:
        return float(self._loss.detach())


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
# Modes
# ---------------------------------------------------------------------------------------------------


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


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


def run_cpu(sizes, batch_size, seq_len, steps, warmup, dtype, compare, overrides) -> list:
    num_predictions = max_predictions(seq_len)
    tokens = batch_size * seq_len
    print(f"backend {jax.default_backend()}, {os.cpu_count()} CPUs, load {load_average()}; "
          f"batch {batch_size} x seq {seq_len}, {num_predictions} predictions/seq, {warmup} warmup + {steps} "
          f"timed steps{' (interleaved with HF)' if compare else ''}, bertjax {dtype}"
          + (f", overrides {overrides}" if overrides else ""), flush=True)
    batches = make_batches(min(warmup + steps, 8), batch_size, seq_len, num_predictions)
    results, hf_info = [], None
    for size in sizes:
        config = benchmark_config(load_config(size, _CONFIG_DIR.value), dtype, overrides, seq_len, num_predictions)
        runners = [BertjaxStep(config, batches)]
        bert_config = runners[0].bert_config
        flops = model_flops.train_flops_per_token(bert_config.num_layers, bert_config.hidden_size, seq_len,
                                              bert_config.vocab_size, num_predictions / seq_len)
        if compare:
            runners.append(HFStep(bert_config, batches))
            hf_info = runners[1]
        timings = measure(runners, warmup, steps)
        jx = timings[0]
        r = dict(size=size, params=runners[0].params, flops_per_token=flops, jax_tps=steps * tokens / jx["seconds"],
                 jax_ms=1e3 * jx["seconds"] / steps, jax_best_tps=tokens / jx["best"], load=load_average())
        line = (f"  {size}: bertjax {_si(r['jax_tps'])} tok/s ({r['jax_ms']:.0f} ms/step, fastest "
                f"{1e3 * jx['best']:.0f}, first {jx['first_step']:.1f} s, loss {jx['loss']:.2f})")
        if compare:
            hf = timings[1]
            r.update(hf_tps=steps * tokens / hf["seconds"], hf_ms=1e3 * hf["seconds"] / steps,
                     hf_best_tps=tokens / hf["best"])
            line += (f"; HF {_si(r['hf_tps'])} tok/s ({r['hf_ms']:.0f} ms/step, fastest {1e3 * hf['best']:.0f}, "
                     f"loss {hf['loss']:.2f})")
        print(line + f"; load {r['load']}", flush=True)
        results.append(r)
        del runners

    header = ["size", "params", "bertjax tok/s", "HF tok/s", "ratio", "bertjax ms/step", "HF ms/step",
              "model TFLOP/s", "ratio (fastest steps)"]
    rows = []
    for r in results:
        hf = "hf_tps" in r
        rows.append([r["size"], f"{r['params'] / 1e6:.1f}M", f"{r['jax_tps']:,.0f}",
                     f"{r['hf_tps']:,.0f}" if hf else "-", f"{r['jax_tps'] / r['hf_tps']:.2f}x" if hf else "-",
                     f"{r['jax_ms']:,.0f}", f"{r['hf_ms']:,.0f}" if hf else "-",
                     f"{r['flops_per_token'] * r['jax_tps'] / 1e12:.3f}",
                     f"{r['jax_best_tps'] / r['hf_best_tps']:.2f}x" if hf else "-"])
    print()
    print_table(header, rows)
    print(f"model TFLOP/s: bertjax tokens/s x flops.train_flops_per_token (MLM head at the "
          f"{num_predictions}/{seq_len} predicted positions)")
    if hf_info is not None:
        print(f"HF: {hf_info.versions}, attn_implementation {hf_info.attention}, {hf_info.threads} threads")
    print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average {load_average()}",
          flush=True)
    return results


def run_accelerator(sizes, shapes, steps, warmup, dtype, overrides) -> list:
    device = jax.devices()[0]
    peak = model_flops.peak_flops_per_device(device.device_kind)
    print(f"backend {jax.default_backend()}: {device.device_kind} (peak bf16 "
          f"{'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}), one device; bertjax {dtype}, "
          f"{warmup} warmup + {steps} timed steps" + (f", overrides {overrides}" if overrides else ""), flush=True)
    results = []
    for size in sizes:
        for seq_len, batch_size in shapes:
            num_predictions = max_predictions(seq_len)
            config = benchmark_config(load_config(size, _CONFIG_DIR.value), dtype, overrides, seq_len,
                                      num_predictions)
            batches = make_batches(min(warmup + steps, 8), batch_size, seq_len, num_predictions)
            runner = BertjaxStep(config, batches)
            bert_config = runner.bert_config
            flops = model_flops.train_flops_per_token(bert_config.num_layers, bert_config.hidden_size, seq_len,
                                                  bert_config.vocab_size, num_predictions / seq_len)
            (jx,) = measure([runner], warmup, steps)
            tps = steps * batch_size * seq_len / jx["seconds"]
            r = dict(size=size, seq_len=seq_len, batch_size=batch_size, params=runner.params, jax_tps=tps,
                     jax_ms=1e3 * jx["seconds"] / steps, tflops=flops * tps / 1e12,
                     mfu=None if peak is None else model_flops.mfu(tps, flops, 1, peak))
            print(f"  {size} {batch_size} x {seq_len}: {_si(tps)} tok/s, {r['jax_ms']:.1f} ms/step, "
                  f"first step {jx['first_step']:.1f} s", flush=True)
            results.append(r)
            del runner
    header = ["size", "params", "batch x seq", "tok/s", "ms/step", "model TFLOP/s", "MFU"]
    rows = [[r["size"], f"{r['params'] / 1e6:.0f}M", f"{r['batch_size']} x {r['seq_len']}", f"{r['jax_tps']:,.0f}",
             f"{r['jax_ms']:.1f}", f"{r['tflops']:.1f}", "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"]
            for r in results]
    print()
    print_table(header, rows)
    print(f"jax {jax.__version__}", flush=True)
    return results


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    accelerator = _ACCELERATOR.value
    if accelerator is None:
        accelerator = jax.default_backend() != "cpu"
    dtype = _DTYPE.value or ("bfloat16" if accelerator else "float32")
    try:
        overrides = parse_overrides(_OVERRIDES.value)
        if _STEPS.value < 1 or _WARMUP.value < 1:
            raise ValueError("--steps and --warmup must be at least 1 (the first warmup step compiles)")
        if accelerator:
            shapes = ACCELERATOR_SHAPES
            if flags.FLAGS["seq_len"].present or flags.FLAGS["batch_size"].present:
                shapes = ((_SEQ.value, _BATCH.value),)
            run_accelerator(_SIZES.value or ["base", "large"], shapes, _STEPS.value, _WARMUP.value, dtype, overrides)
        else:
            run_cpu(_SIZES.value or ["mini", "small", "base"], _BATCH.value, _SEQ.value, _STEPS.value,
                    _WARMUP.value, dtype, not _NO_TORCH.value, overrides)
    except (ValueError, FileNotFoundError) as e:
        cli.fail(str(e))
    assert "tensorflow" not in sys.modules, "TensorFlow was imported on the benchmark path"


if __name__ == "__main__":
    app.run(main)
