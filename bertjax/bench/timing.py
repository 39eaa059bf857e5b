"""What both benchmarks share (bertjax/bench/step_speed.py, bertjax/bench/embedding_speed.py): runners
timed in alternating blocks, the machine's load, and the printed tables."""

import os

import numpy as np


def measure(runners: list, warmup: int, steps: int) -> list[dict]:
    """Warm every runner up (its first step compiles), then time `steps` steps of each in two blocks per
    runner, the runners' order reversed in the second round, so that a change in the machine's load falls on
    all of them alike. Each block starts with one untimed step where another runner ran just before: on
    a CPU, XLA's first step after PyTorch's runs slower (docs/performance.md, "Fewer tokens a batch on
    CPUs"), which step-by-step interleaving would charge to every step.
    Per runner: seconds of the timed steps, the fastest step, the median, the first step's seconds and
    loss (the loss of the same batch at the same initial weights, where runners differ only in how they
    compute)."""
    firsts, first_losses = [], []
    for runner in runners:
        firsts.append(runner.step())
        first_losses.append(runner.loss())
        for _ in range(warmup - 1):
            runner.step()
    times = [[] for _ in runners]
    blocks = [(steps + 1) // 2, steps // 2]
    last = runners[-1]
    order = list(zip(runners, times))
    for round_, count in enumerate(b for b in blocks if b):
        for runner, t in (order if round_ == 0 else order[::-1]):
            if runner is not last:  # another runner ran just before
                runner.step()
            t.extend(runner.step() for _ in range(count))
            last = runner
    out = []
    for runner, t, first, first_loss in zip(runners, times, firsts, first_losses):
        loss = runner.loss()
        if not np.isfinite(loss):
            raise FloatingPointError(f"{runner.name} loss is {loss} after {warmup + steps} steps")
        out.append(dict(seconds=sum(t), best=min(t), median=float(np.median(t)), first_step=first, loss=loss,
                        first_loss=first_loss))
    return out


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def mib(n: int | None) -> str:
    """Bytes as MiB for a figure table; "-" where unknown."""
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def print_table(header, rows) -> None:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for j, r in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))), flush=True)
        if j == 0:
            print("  ".join("-" * w for w in widths), flush=True)
