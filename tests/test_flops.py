"""FLOPs per token against the reference figures, MFU arithmetic, peaks per device kind."""

import pytest

from bertjax.training import flops

VOCAB = 30522


# --- FLOPs and MFU ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, hidden, seq_len, predictions, expected",
    [
        (12, 768, 128, 20, 545e6),  # BERT-base, seq 128
        (24, 1024, 128, 20, 1.88e9),  # BERT-large, seq 128
        (24, 1024, 512, 80, 1.99e9),  # BERT-large, seq 512
    ],
)
def test_flops_per_token_matches_reference(layers, hidden, seq_len, predictions, expected):
    per_token = flops.train_flops_per_token(layers, hidden, seq_len, VOCAB, predictions / seq_len)
    assert per_token == pytest.approx(expected, rel=0.01)


def test_flops_per_token_terms():
    # Attention is linear in S per token; the head term is linear in p.
    base = flops.train_flops_per_token(12, 768, 128, VOCAB, 0.0)
    assert flops.train_flops_per_token(12, 768, 256, VOCAB, 0.0) - base == pytest.approx(12 * 12 * 128 * 768)
    head = flops.train_flops_per_token(12, 768, 128, VOCAB, 0.5) - base
    assert head == pytest.approx(6 * 0.5 * (768**2 + 768 * VOCAB))
    assert base == pytest.approx(72 * 12 * 768**2 + 12 * 12 * 128 * 768)
    with pytest.raises(ValueError, match="predicted_fraction"):
        flops.train_flops_per_token(12, 768, 128, VOCAB, 1.5)
    with pytest.raises(ValueError, match="positive"):
        flops.train_flops_per_token(0, 768, 128, VOCAB, 0.1)


def test_mfu_arithmetic():
    # 100k tokens/s * 500 MFLOP = 5e13 FLOP/s on 2 devices of 1e14 peak each: 25%.
    assert flops.mfu(1e5, 5e8, 2, 1e14) == pytest.approx(0.25)
    per_device_peak = flops.peak_flops_per_device("NVIDIA A100-SXM4-80GB")
    assert flops.mfu(312e12 / 545e6, 545e6, 1, per_device_peak) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="peak"):
        flops.mfu(1e5, 5e8, 1, None)
    with pytest.raises(ValueError, match="num_devices"):
        flops.mfu(1e5, 5e8, 0, 1e14)


@pytest.mark.parametrize(
    "device_kind, peak",
    [
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100", 989e12),
        ("nvidia h100 sxm", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5e", 197e12),
        ("TPU v5", 459e12),
        ("TPU v5p", 459e12),
        ("TPU v6 lite", 918e12),
        ("cpu", None),
        ("TPU v4 lite", None),
        ("NVIDIA A10G", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_peak_flops_per_device(device_kind, peak):
    assert flops.peak_flops_per_device(device_kind) == peak
