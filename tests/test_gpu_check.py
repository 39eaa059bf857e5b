"""launch/gpu_check.py on the CPU with plans of its own: a part that measures (its row reaches the JSON lines
through the benchmark's --json as it is measured), a part cut off at its cap, one the budget leaves unstarted,
and the table built from the rows."""

import json
import pathlib
import subprocess
import sys

from conftest import REPO, program_env

TINY = ["--sizes=tiny", "--batch_size=4", "--seq_len=32", "--steps=1", "--warmup=1", "--no_torch", "--noembeddings"]


def gpu_check(tmp_path: pathlib.Path, plan: list[dict], *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The driver on `plan`, writing to a fresh folder: its result and the part statuses it wrote."""
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, "launch/gpu_check.py", f"--plan={tmp_path / 'plan.json'}", f"--out={out}",
                           *flags], cwd=REPO, env=program_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = [json.loads(line) for line in (out / "gpu_check_parts.jsonl").read_text().splitlines()]
    return done, {"out": out, **{p["part"]: p["status"] for p in parts}}


def test_gpu_check_records_each_row_a_cut_off_and_the_budget(tmp_path):
    done, parts = gpu_check(tmp_path, [dict(name="1.tiny", lever="default", args=[*TINY, "--hlo={out}/tiny.hlo.txt"],
                                            cap=240),
                                       dict(name="2.slow", lever="scan_layers=true", cap=1,
                                            args=[*TINY, "--model_overrides=scan_layers=true"])])
    assert parts["1.tiny"] == "done" and parts["2.slow"] == "cut off at 1 s"
    rows = [json.loads(line) for line in (parts["out"] / "gpu_check.jsonl").read_text().splitlines()]
    assert len(rows) == 1, rows  # the benchmark's --json: one row, labelled with its part
    row = rows[0]
    assert (row["label"], row["runner"], row["size"], row["shape"], row["overrides"]) == (
        "1.tiny", "bertjax", "tiny", "4x32", {})
    assert row["tps"] > 0 and row["ms"] > 0 and row["memory"] > 0 and row["mfu"] is None  # no CPU peak
    assert (parts["out"] / "tiny.hlo.txt").read_text().startswith("HloModule")  # the compiled step, in the out folder
    table = (parts["out"] / "gpu_check.txt").read_text()
    assert table in done.stdout
    lines = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert "tiny 4x32" in lines["1.tiny"] and "1.00x" in lines["1.tiny"] and lines["1.tiny"].endswith("done")
    assert lines["2.slow"].endswith("cut off at 1 s") and "scan_layers=true" in lines["2.slow"]

    # Past the budget nothing starts; the part running when it ends is cut off there.
    _, parts = gpu_check(tmp_path, [dict(name="a", lever="default", args=TINY, cap=60),
                                    dict(name="b", lever="default", args=TINY, cap=60)], "--budget=1")
    assert parts["a"] == "cut off at 1 s" and parts["b"] == "not started (budget of 1 s spent)"


def test_gpu_check_refuses_a_part_it_does_not_have(tmp_path):
    done = subprocess.run([sys.executable, "launch/gpu_check.py", f"--out={tmp_path}", "--parts=9"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "choose from 1.base" in done.stderr
