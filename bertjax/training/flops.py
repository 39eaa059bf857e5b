"""Training FLOPs per token of BERT pretraining, the peak FLOP/s of each accelerator kind, and MFU.

Imports nothing but the standard library: the figures are plain arithmetic, used by the training
program's log line and by the benchmark.
"""

def train_flops_per_token(
    num_layers: int, hidden_size: int, seq_len: int, vocab_size: int, predicted_fraction: float
) -> float:
    """Training FLOPs (forward + backward) per real token of BERT pretraining.

        6 * 12*L*H^2  +  12*L*S*H  +  6*p*(H^2 + H*V)

    - 12*L*H^2 is the multiply-accumulate count of a token's dense layers: the q, k, v and output
      projections (4*H^2) and the feed-forward layer with F = 4H (8*H^2). Two FLOPs per
      multiply-accumulate forward and four backward make the factor 6.
    - 12*L*S*H is attention over S keys: Q.K^T and probabilities.V are 2*S*H FLOPs each per token and
      layer forward, 4*S*H, and three times that with the backward pass. The formula is read as written
      (not 6*L*S*H, the causal halving, nor 12*L*S^2*H, a per-sequence count): it is what reproduces
      the reference numbers below.
    - the masked-LM head (transform H*H, tied decoder H*V) runs only at the predicted positions, a
      fraction p = predictions per sequence / S of the positions: 20/128 and 80/512 in BERT's recipes.
      Pass the measured fraction where not every prediction slot is filled.
    Not counted: embedding lookups (gathers, not matmuls), the pooler and NSP head (once per sequence),
    softmax, LayerNorm and other element-wise work. Attention is charged at the padded length S.

    Reference values (tested within 1%): BERT-base at S=128, p=20/128: 546 MFLOP/token;
    BERT-large at S=128: 1.88 GFLOP/token; BERT-large at S=512, p=80/512: 1.99 GFLOP/token.
    """
    if min(num_layers, hidden_size, seq_len, vocab_size) <= 0:
        raise ValueError(
            f"model dimensions must be positive: num_layers={num_layers}, hidden_size={hidden_size}, "
            f"seq_len={seq_len}, vocab_size={vocab_size}"
        )
    if not 0.0 <= predicted_fraction <= 1.0:
        raise ValueError(f"predicted_fraction={predicted_fraction} must lie in [0, 1]")
    L, H, S, V = num_layers, hidden_size, seq_len, vocab_size
    dense = 6 * 12 * L * H * H
    attention = 12 * L * S * H
    mlm_head = 6 * predicted_fraction * (H * H + H * V)
    return float(dense + attention + mlm_head)


# Dense (no structured sparsity) bfloat16 peak FLOP/s of one JAX device, matched as a case-insensitive
# substring of `jax.Device.device_kind`. The first matching row wins, so the more specific names come
# first ("tpu v5 lite" before "tpu v5", "h100 pcie" before "h100"). A row with peak None names a device
# that would otherwise match a wrong row. NVIDIA datasheets quote bf16 "with sparsity"; the dense peak is
# half of that. On TPU v4 and v5p a JAX device is a whole chip (megacore), on v5e and v6e a chip has one
# TensorCore, so the per-chip figures are per-device figures.
PEAK_BF16_FLOPS = (
    # NVIDIA H100 datasheet: SXM 1,979, PCIe 1,513, NVL 1,671 TFLOPS bf16 with sparsity.
    # device_kind of the SXM part is "NVIDIA H100 80GB HBM3".
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),
    # NVIDIA H200 datasheet: SXM 1,979, NVL 1,671 TFLOPS bf16 with sparsity. Also matches GH200.
    ("h200 nvl", 835e12),
    ("h200", 989e12),
    # NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, SXM4 and PCIe, 40 and 80 GB alike.
    ("a100", 312e12),
    # Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e), bf16 per chip.
    ("tpu v4 lite", None),  # v4i, an inference chip; "tpu v4" below would claim it
    ("tpu v4", 275e12),
    ("tpu v5 lite", 197e12),  # v5e's device_kind
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),  # v5p's device_kind is plain "TPU v5"
    ("tpu v6 lite", 918e12),  # v6e (Trillium)
    ("tpu v6e", 918e12),
)


def peak_flops_per_device(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device of this `jax.Device.device_kind`, or None when unknown (CPU)."""
    kind = device_kind.lower()
    for pattern, peak in PEAK_BF16_FLOPS:
        if pattern in kind:
            return peak
    return None


def mfu(tokens_per_second: float, flops_per_token: float, num_devices: int, peak_per_device: float) -> float:
    """Model FLOPs utilisation: the fraction of the devices' dense peak that the model's FLOPs use.

    Counts the model's FLOPs (`train_flops_per_token` per real token), not the hardware's: work that
    rematerialisation recomputes or that padding wastes lowers MFU, as it should.
    """
    if num_devices <= 0:
        raise ValueError(f"num_devices={num_devices} must be positive")
    if peak_per_device is None or peak_per_device <= 0:
        raise ValueError(
            f"peak_per_device={peak_per_device}: MFU needs a known peak (peak_flops_per_device returned None?)"
        )
    return tokens_per_second * flops_per_token / (num_devices * peak_per_device)
