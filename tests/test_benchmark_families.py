"""python -m bertjax.benchmark runs every family's config beside its Hugging Face class."""

import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from bertjax.runs import hf_peer, step_benchmark
from bertjax.models.config import BertConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILY_CLASSES = {"roberta_tiny": "RobertaForMaskedLM", "albert_tiny": "AlbertForPreTraining",
                  "modernbert_tiny": "ModernBertForMaskedLM", "tiny": "BertForPreTraining",
                  "roberta_base": "RobertaForMaskedLM", "albert_base": "AlbertForPreTraining",
                  "modernbert_base": "ModernBertForMaskedLM", "modernbert_large": "ModernBertForMaskedLM"}


def test_every_pretraining_config_is_a_size():
    configs = {p.stem for p in (ROOT / "configs").glob("*.py")} - {"__init__", "common"}
    assert set(step_benchmark.SIZES) == configs


@pytest.mark.parametrize("size", sorted(FAMILY_CLASSES))
def test_hf_peer_is_the_family_class(size):
    config = step_benchmark.benchmark_config(step_benchmark.load_config(size), None, {}, 512, 80)
    hf_config = hf_peer.hf_peer_config(BertConfig.from_dict(config.model, platform="cpu"))
    assert hf_config["architectures"] == [FAMILY_CLASSES[size]]
    # The position range is widened to the benchmark's sequence (roberta_tiny has 130 rows).
    assert config.model.max_position_embeddings >= 512 + config.model.position_offset


@pytest.mark.slow
def test_benchmark_runs_the_tiny_families_beside_hf():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    # One CPU device, as a user runs it. Compiling is most of this test's time, and it checks that every
    # row is there, not how fast: XLA's CPU backend skips its LLVM optimisations (half the CPU time).
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    sizes = ["roberta_tiny", "albert_tiny", "modernbert_tiny"]
    result = subprocess.run(
        [sys.executable, "-m", "bertjax.benchmark", f"--sizes={','.join(sizes)}", "--steps=1", "--warmup=1",
         "--batch_size=2", "--seq_len=32"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # Table rows: shape, runner, params, tok/s, ms/step, model TFLOP/s, MFU, memory, ratio; columns are
    # two or more spaces apart.
    rows = {}
    for line in result.stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 9 and cells[0].endswith(" 2 x 32"):
            rows[(cells[0].split()[0], cells[1])] = cells
    for size in sizes:
        for runner in ("bertjax", "HF eager"):
            cells = rows[(size, runner)]
            tokens_per_second = float(cells[3].replace(",", ""))
            assert math.isfinite(tokens_per_second) and tokens_per_second > 0, cells
            assert float(cells[5]) >= 0, cells
        assert f"HF eager ({FAMILY_CLASSES[size]})" in result.stdout
