"""python -m bertjax.benchmark runs every family's config beside its Hugging Face class, and --embeddings
times embedding and contrastive training beside sentence-transformers on one exported model; --student_speed
times BiLSTM-soft's forward against BERT's."""

import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import FAST_COMPILE_FLAGS, run_program  # tests/ is on sys.path under pytest

from bertjax.bench import hf_peer, step_speed
from bertjax.models.config import BertConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILY_CLASSES = {"roberta_tiny": "RobertaForMaskedLM", "albert_tiny": "AlbertForPreTraining",
                  "modernbert_tiny": "ModernBertForMaskedLM", "tiny": "BertForPreTraining",
                  "roberta_base": "RobertaForMaskedLM", "albert_base": "AlbertForPreTraining",
                  "modernbert_base": "ModernBertForMaskedLM", "modernbert_large": "ModernBertForMaskedLM",
                  "mobilebert_tiny": "MobileBertForPreTraining", "mobilebert": "MobileBertForPreTraining"}


def test_every_pretraining_config_is_a_size():
    configs = {p.stem for p in (ROOT / "configs").glob("*.py")} - {"__init__", "common"}
    assert set(step_speed.SIZES) == configs


@pytest.mark.parametrize("size", sorted(FAMILY_CLASSES))
def test_hf_peer_is_the_family_class(size):
    config = step_speed.benchmark_config(step_speed.load_config(size), None, {}, 512, 80)
    hf_config = hf_peer.hf_peer_config(BertConfig.from_dict(config.model, platform="cpu"))
    assert hf_config["architectures"] == [FAMILY_CLASSES[size]]
    # The position range is widened to the benchmark's sequence (roberta_tiny has 130 rows).
    assert config.model.max_position_embeddings >= 512 + config.model.position_offset


@pytest.mark.slow
def test_benchmark_runs_the_tiny_families_beside_hf():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    # One CPU device, as a user runs it. Compiling is most of this test's time, and it checks that every
    # row is there, not how fast: the tests' quick compiles.
    env["XLA_FLAGS"] = FAST_COMPILE_FLAGS
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


def test_long_rows_give_each_attention_the_same_first_loss(monkeypatch, capsys):
    """--long_rows: each implementation in a fresh process on the same packed rows; the loss of its first
    step (the same batch at the same initial weights) is the check that they compute the same thing."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE_FLAGS)
    rows = step_speed.run_long_rows("modernbert_tiny", [512], 1, ["xla", "blockwise"], timeout=300, steps=1,
                                        warmup=1, dtype=None, overrides={"attention_block_size": 128},
                                        dropout_rng="threefry")
    assert [r.get("failed") for r in rows] == [None, None], rows
    xla, blockwise = rows
    assert (xla["attention"], blockwise["attention"], blockwise["block"]) == ("xla", "blockwise", 128)
    assert xla["sequences"] > 1  # packed: several documents to keep apart
    np.testing.assert_allclose(blockwise["first_loss"], xla["first_loss"], rtol=1e-5)
    step_speed.print_long_rows(rows)
    assert f"{xla['first_loss']:.5f}" in capsys.readouterr().out


# A MiniLM-shaped embedder at toy sizes (--model.KEY=VALUE overrides of embedding_speed.MINILM_L6).
TINY_EMBEDDER = dict(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=512)


@pytest.mark.slow
def test_embedding_figures_beside_sentence_transformers(capsys):
    """--embeddings at toy sizes: both sides load the one exported directory and embed the same texts to the
    same vectors; the contrastive step of each trains the same loss; the figures are printed."""
    result = step_speed.benchmark(
        sizes=None, seq_len=128, batch_size=4, shape_given=False, steps=1, warmup=1, dtype=None,
        overrides=TINY_EMBEDDER, dropout_rng="threefry", accelerator=False, no_torch=False, no_torch_compile=True,
        profile=None, packing=False, memory_only=False, embeddings=True, texts=12, max_length=48, embed_passes=1)
    printed = capsys.readouterr().out
    ours, theirs = result["embed"]
    assert (ours["side"], theirs["side"]) == ("bertjax", "sentence-transformers")
    a, b = ours["embeddings"], theirs["embeddings"]
    assert a.shape == b.shape == (12, 32)
    difference = float(np.abs(a - b).max())
    assert difference < 1e-5
    assert a.std(axis=0).mean() > 1e-3  # twelve different texts, twelve different vectors
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), 1.0, atol=1e-5)  # the record's Normalize
    assert f"max |bertjax - sentence-transformers| over the 12 embeddings: {difference:.2e}" in printed
    for row in (ours, theirs):
        assert math.isfinite(row["texts_per_s"]) and row["texts_per_s"] > 0 and row["tokens_per_s"] > row["texts_per_s"]
    assert theirs["ratio"] == pytest.approx(ours["texts_per_s"] / theirs["texts_per_s"])
    packed_step, unpacked_step, st_step = result["contrastive"]
    assert [r["side"] for r in result["contrastive"]] == ["bertjax", "bertjax unpacked", "sentence-transformers"]
    # In-batch MNRL of 4 pairs from nearly equal random-init embeddings: each near log(4), the three alike.
    for row in (packed_step, unpacked_step):
        assert row["loss"] == pytest.approx(st_step["loss"], rel=0.1)
        assert row["ratio"] == pytest.approx(row["tokens_per_s"] / st_step["tokens_per_s"])
    # The positions each computes: packed rows of 128; the columns at their full widths (4 x (32 + 128)),
    # or cut to their longest text.
    assert packed_step["computed"] % 128 == 0 and st_step["computed"] <= unpacked_step["computed"] == 4 * (32 + 128)
    lines = printed.splitlines()
    assert any(line.startswith("embed") and line.rstrip().endswith("bertjax / this") for line in lines)
    assert any(line.startswith("contrastive step") and line.rstrip().endswith("this / sentence-transformers")
               for line in lines)
    assert f"{theirs['ratio']:.2f}x" in printed and f"{packed_step['ratio']:.2f}x" in printed


def test_student_speed_prints_speed_ups_of_its_own_figures():
    """--student_speed: one table, BERT-tiny and both student forms; each speed-up is the BERT row's printed
    ms over the student's (to the rounding of the printed figures)."""
    result = run_program("bertjax.benchmark", "--student_speed=tiny", "--student_repeats=2",
                         "--student_seq_length=16")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("model "))
    header = re.split(r"\s{2,}", lines[first].strip())
    assert header[:4] == ["model", "parameters", "batch 1 ms", "batch 32 ms"]
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[first + 2:first + 5])}
    assert list(rows) == ["BERT-tiny", "BiLSTM-soft", "BiLSTM-soft pairs"]
    assert header[4:] == [f"{student} speed-up {b}" for student in list(rows)[1:] for b in (1, 32)]
    # The student's parameters: the 30,522 x 300 table, two LSTMs of 150 units, the MLP, the classifier.
    lstm, mlp = 2 * 4 * (300 * 150 + 150 * 150 + 150), 200 + 2 * 200 + 2
    assert rows["BiLSTM-soft"][1] == f"{30_522 * 300 + lstm + 300 * 200 + mlp:,}"
    assert rows["BiLSTM-soft pairs"][1] == f"{30_522 * 300 + lstm + 1200 * 200 + mlp:,}"
    bert = rows["BERT-tiny"]
    for column, (student, b) in enumerate([(s, b) for s in list(rows)[1:] for b in (1, 32)], start=4):
        ms = 2 if b == 1 else 3
        teacher, theirs = float(bert[ms]), float(rows[student][ms])
        assert teacher > 0 and theirs > 0 and rows[student][column] == "-"
        low, high = (teacher - 0.005) / (theirs + 0.005), (teacher + 0.005) / (theirs - 0.005)
        assert low - 0.005 <= float(bert[column].rstrip("x")) <= high + 0.005, (bert, rows[student])
    result = run_program("bertjax.benchmark", "--student_speed=huge")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "give sizes of ['tiny'" in lines[0]
