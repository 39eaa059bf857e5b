"""The GPU check: main's step beside Hugging Face, each accelerator lever on and off, the shapes not yet
measured and rows of 8,192 tokens, in one run that fits the device time a session is lent (8 of its 15 minutes).

    python launch/gpu_check.py [--out=DIR] [--budget=480] [--parts=1,2.fp8] [--plan=FILE]

Through this workplace's device tool, from the repository root (python3 there has jax with CUDA, torch and
transformers, but not ml_collections or qwix, which python -m bertjax.benchmark imports; their wheels travel
in the ignored folder .whl), one call of `run` with carry [".whl"], timeout_s 540 and the command

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site || exit; python3 launch/gpu_check.py

with .whl filled once here (pure-Python wheels, any platform):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \\
        ml_collections==1.1.0 qwix==0.1.8

Each part is one `python -m bertjax.benchmark ...` process with its own time cap, killed there ("cut off at
N s"); the parts run in PLAN's order, which is their priority, and none starts once --budget seconds have
passed ("not started"), a part's cap shortened to what is left. Every figure is appended to gpu_check.jsonl
as it is measured (the benchmark's --json, labelled with the part), so a run cut off still reports; at the
end one table (part, shape, runner or lever, tok/s, MFU, ratio to HF torch.compile and to main's default
step) is printed and written beside it. Files, in $OUT when no --out is given: gpu_check.jsonl (rows),
gpu_check_parts.jsonl (each part's status), gpu_check.log (the parts' output), gpu_check.txt (the table),
base_256x128.hlo.txt (main's base step as the GPU compiler optimized it: the copies around cuDNN's call).

The parts share one persistent JAX compilation cache (and with it XLA's autotuning results), so a step
compiled once, main's base step say, loads in seconds in a later part. docs/performance.md ("The device
check") says what each part is for. Standard library only, as launch/local.py: it checks what the
benchmark needs before anything starts.
"""

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from local import parent_death_signal  # launch/local.py, beside this file: the kernel kills a part with the driver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = "launch/gpu_check.py"

STEP = ["--accelerator", "--noembeddings"]  # the step table only: the embedding figures need TensorFlow
ALONE = [*STEP, "--no_torch"]
BASE = ["--sizes=base", "--batch_size=256", "--seq_len=128"]
LARGE = ["--sizes=large", "--batch_size=256", "--seq_len=128"]
ALL_LEVERS = ["--model_overrides=fused_qkv=true,norm_kernel=pallas,mlm_loss=chunked,matmul_dtype=fp8",
              "--dropout_rng=rbg"]
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="  # an empty list of command types: every kernel launched
LOOP_IN_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"  # the default types and the loop


def part(name: str, lever: str, args: list[str], cap: float, xla_flags: str = "") -> dict:
    """One benchmark process: `lever` says what differs from main's default step ("default": nothing)."""
    return dict(name=name, lever=lever, args=args, cap=cap, xla_flags=xla_flags)


# In priority order; caps in seconds, each covering the process's start, its compiles and its steps.
PLAN = [
    # 1. Main's step against HF eager and torch.compile, at the shapes of the last figures.
    part("1.base", "default", [*STEP, *BASE, "--hlo={out}/base_256x128.hlo.txt"], 150),
    part("1.large", "default", [*STEP, *LARGE], 210),
    # 2. Each lever on, against main's default step (its compile cached by 1.base), at base 256 x 128.
    part("2.default", "default", [*ALONE, *BASE], 60),
    part("2.fused_qkv", "fused_qkv=true", [*ALONE, *BASE, "--model_overrides=fused_qkv=true"], 100),
    part("2.norm_kernel", "norm_kernel=pallas", [*ALONE, *BASE, "--model_overrides=norm_kernel=pallas"], 100),
    part("2.mlm_loss", "mlm_loss=chunked", [*ALONE, *BASE, "--model_overrides=mlm_loss=chunked"], 100),
    part("2.fp8", "matmul_dtype=fp8", [*ALONE, *BASE, "--model_overrides=matmul_dtype=fp8"], 100),
    part("2.rbg", "dropout_rng=rbg", [*ALONE, *BASE, "--dropout_rng=rbg"], 100),
    part("2.no_command_buffers", "command buffers off", [*ALONE, *BASE], 100, NO_COMMAND_BUFFERS),
    part("2.scan", "scan_layers=true", [*ALONE, *BASE, "--model_overrides=scan_layers=true"], 100),
    part("2.scan_loop", "scan_layers=true, loop in command buffers",
         [*ALONE, *BASE, "--model_overrides=scan_layers=true"], 100, LOOP_IN_COMMAND_BUFFERS),
    part("2.all_base", "all levers", [*ALONE, *BASE, *ALL_LEVERS], 100),
    part("2.all_large", "all levers", [*ALONE, *LARGE, *ALL_LEVERS], 150),
    # 3. Shapes not measured yet: large unrolled without remat; 32 x 512 against HF.
    part("3.large_unrolled", "scan_layers=false,remat_policy=none",
         [*ALONE, *LARGE, "--model_overrides=scan_layers=false,remat_policy=none"], 240),
    part("3.base_512", "default", [*STEP, "--sizes=base", "--batch_size=32", "--seq_len=512"], 150),
    part("3.large_512", "default", [*STEP, "--sizes=large", "--batch_size=32", "--seq_len=512"], 210),
    # 4. One packed row of 8,192 tokens through cuDNN attention, ModernBERT-base (the :extend recipe's shape).
    part("4.long_8192", "cudnn attention", ["--long_rows=8192", "--attention_impls=cudnn", "--sizes=modernbert_base",
                                            "--batch_size=1", "--steps=4", "--warmup=1", "--long_row_timeout=150"],
         170),
]

# What python -m bertjax.benchmark imports (ml_collections for its flags, qwix through bertjax.inference);
# the HF peer adds torch and transformers.
NEEDED = ("jax", "flax", "optax", "orbax", "numpy", "absl", "ml_collections", "qwix")
NEEDED_BY_HF = ("torch", "transformers")
MISSING_MODULE = re.compile(r"No module named '([^']+)'")
GRACE_SECONDS = 5.0
RUNNING: list[subprocess.Popen] = []  # the part running now, for a signal to the driver to stop it too


def fail(message: str):
    """One line on stderr that says what to change, then exit code 2 (as bertjax's programs)."""
    print(f"{PROGRAM}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def runs_hf(p: dict) -> bool:
    return "--no_torch" not in p["args"] and not any(a.startswith("--long_rows") for a in p["args"])


def check_modules(plan: list[dict]) -> None:
    """Every module the parts import, found by this interpreter (the one that runs them), before anything starts."""
    needed = NEEDED + (NEEDED_BY_HF if any(runs_hf(p) for p in plan) else ())
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"{sys.executable} lacks {', '.join(missing)}, which the parts import: install them (on the "
             f"device, carry their wheels in .whl as this file's docstring says)")


def load_plan(path: str | None, selected: list[str]) -> list[dict]:
    """PLAN, or the JSON list of parts in `path` (name, lever, args, cap, optional xla_flags), keeping those
    named in `selected` ("2" keeps 2.*)."""
    plan = PLAN
    if path:
        try:
            with open(path) as f:
                plan = [part(**entry) for entry in json.load(f)]
        except (OSError, ValueError, TypeError) as e:
            fail(f"--plan={path}: {e}; give a JSON list of {{name, lever, args, cap, xla_flags}}")
    if selected:
        kept = [p for p in plan if any(p["name"] == s or p["name"].startswith(s + ".") for s in selected)]
        if not kept:
            fail(f"--parts={','.join(selected)} names no part: choose from {', '.join(p['name'] for p in plan)}")
        plan = kept
    return plan


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's whole process group (its own long-row processes too), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def run_part(p: dict, cap: float, *, rows_path: str, log_path: str, env: dict) -> tuple[str, str]:
    """The part's benchmark, its output appended to the log: its status and what it printed."""
    # "{out}" in an argument is the output folder (1.base writes its compiled step's HLO there).
    args = [a.replace("{out}", os.path.dirname(os.path.abspath(rows_path))) for a in p["args"]]
    command = [sys.executable, "-m", "bertjax.benchmark", *args, f"--json={rows_path}", f"--json_label={p['name']}"]
    part_env = dict(env, XLA_FLAGS=" ".join(f"{env.get('XLA_FLAGS', '')} {p['xla_flags']}".split()))
    with open(log_path, "a") as log:
        log.write(f"\n=== {p['name']} (cap {cap:.0f} s): XLA_FLAGS={part_env['XLA_FLAGS']!r} {' '.join(command)}\n")
        log.flush()
        start = log.tell()
        proc = subprocess.Popen(command, cwd=ROOT, env=part_env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=parent_death_signal())
        RUNNING.append(proc)
        try:
            status = "done" if proc.wait(timeout=cap) == 0 else None
        except subprocess.TimeoutExpired:
            _kill(proc)
            status = f"cut off at {cap:.0f} s"
        finally:
            RUNNING.remove(proc)
    with open(log_path) as log:
        log.seek(start)
        output = log.read()
    if status is None:
        last = [line.strip() for line in output.splitlines() if line.strip()] or ["no output"]
        status = f"failed (exit status {proc.returncode}): {last[-1][-160:]}"
    return status, output


def _stop(signum, frame):
    """The driver stopped (a time limit, Ctrl-C): the part running goes with it."""
    for proc in list(RUNNING):
        _kill(proc)
    sys.exit(128 + signum)


def read_rows(path: str) -> list[dict]:
    """The rows the parts wrote; a line cut short by a kill is skipped."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return rows


def _ratio(x: float | None, y: float | None) -> str:
    return f"{x / y:.2f}x" if x and y else "-"


def table(plan: list[dict], statuses: dict, rows: list[dict]) -> list[list[str]]:
    """One line per measured row, in the plan's order, and one per part that measured nothing. Ratios are
    bertjax's tokens/s over HF torch.compile's on the same size and shape, and over main's default step's
    (the last default-part row of that size and shape measured up to this one)."""
    levers = {p["name"]: p["lever"] for p in plan}
    hf_compiled, default, reference = {}, {}, []
    for r in rows:  # in the order measured
        key = (r.get("size"), r.get("shape"))
        if r.get("runner") == "HF compiled" and r.get("tps"):
            hf_compiled[key] = r["tps"]
        if r.get("runner") == "bertjax" and levers.get(r.get("label")) == "default" and r.get("tps"):
            default[key] = r["tps"]
        reference.append(default.get(key))
    lines = []
    for p in plan:
        status = statuses.get(p["name"], "not started")
        mine = [(r, ref) for r, ref in zip(rows, reference) if r.get("label") == p["name"]]
        if not mine:
            lines.append([p["name"], "-", p["lever"], "-", "-", "-", "-", "-", "-", status])
        for r, ref in mine:
            bertjax = r.get("runner") == "bertjax"
            runner = ("bertjax" + ("" if p["lever"] == "default" else f" {p['lever']}")) if bertjax else r["runner"]
            memory = r.get("memory") or r.get("peak_memory")
            lines.append([p["name"], f"{r.get('size')} {r.get('shape')}", runner,
                          r["failed"] if "failed" in r else f"{r['tps']:,.0f}",
                          "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                          "-" if r.get("ms") is None else f"{r['ms']:,.1f}",
                          "-" if not memory else f"{memory / 2**30:.1f} GiB",
                          _ratio(r.get("tps"), hf_compiled.get((r.get("size"), r.get("shape")))) if bertjax else "-",
                          _ratio(r.get("tps"), ref) if bertjax else "-", status])
    return lines


def format_table(lines: list[list[str]]) -> str:
    header = ["part", "shape", "runner / lever", "tok/s", "MFU", "ms/step", "memory", "/ HF compiled",
              "/ main default", "part status"]
    cells = [header] + lines
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numbers = range(3, 9)  # tok/s to the ratios, right-aligned
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.rjust(w) if i in numbers else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"


def run(plan: list[dict], out: str, budget: float) -> int:
    """The parts in order within the budget, each one's status recorded as it ends; then the table."""
    os.makedirs(out, exist_ok=True)
    paths = {name: os.path.join(out, f"gpu_check{suffix}") for name, suffix in
             (("rows", ".jsonl"), ("parts", "_parts.jsonl"), ("log", ".log"), ("table", ".txt"))}
    for path in paths.values():
        open(path, "w").close()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="gpu_check_jax_cache_"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    began = time.monotonic()
    statuses = {}
    for p in plan:
        elapsed = time.monotonic() - began
        if elapsed >= budget:
            status, seconds, output = f"not started (budget of {budget:.0f} s spent)", 0.0, ""
        else:
            status, output = run_part(p, min(p["cap"], budget - elapsed), rows_path=paths["rows"],
                                      log_path=paths["log"], env=env)
            seconds = time.monotonic() - began - elapsed
        statuses[p["name"]] = status
        with open(paths["parts"], "a") as f:
            f.write(json.dumps(dict(part=p["name"], lever=p["lever"], status=status, seconds=round(seconds, 1))) + "\n")
        measured = sum(r.get("label") == p["name"] for r in read_rows(paths["rows"]))
        print(f"[{p['name']}] {status} ({seconds:.0f} s, {measured} rows; {time.monotonic() - began:.0f} s of "
              f"{budget:.0f})", flush=True)
        missing = MISSING_MODULE.search(output)
        if missing and "done" not in statuses.values():  # nothing ran: every part would fail alike
            fail(f"part {p['name']}: {sys.executable} lacks {missing.group(1)}: install it (on the device, carry its "
                 f"wheel in .whl as this file's docstring says); {paths['log']} has the output")
    text = format_table(table(plan, statuses, read_rows(paths["rows"])))
    with open(paths["table"], "w") as f:
        f.write(text)
    print(f"\n{text}rows: {paths['rows']}; output: {paths['log']}; {time.monotonic() - began:.0f} s in all",
          flush=True)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="Directory of the results (default: $OUT).")
    parser.add_argument("--budget", type=float, default=480.0, help="Seconds after which no part starts.")
    parser.add_argument("--parts", default="", help="Comma-separated part names to run ('2' runs 2.*); default all.")
    parser.add_argument("--plan", default=None, help="A JSON list of parts in place of the built-in plan.")
    args = parser.parse_args(argv)
    out = args.out or os.environ.get("OUT")
    if not out:
        fail("give --out=DIR (or set OUT): where the rows, the log and the table go")
    plan = load_plan(args.plan, [s for s in args.parts.split(",") if s])
    check_modules(plan)
    return run(plan, out, args.budget)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
