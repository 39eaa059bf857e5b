"""Training FLOPs per token of BERT-family pretraining, the peak FLOP/s of each accelerator kind, and MFU.

Imports nothing but the standard library: the figures are plain arithmetic, used by the training
program's log line, the benchmark and the planner. `config_flops_per_token` reads a model config
(bertjax.models.config.BertConfig or anything with its attribute names) so that callers pass it once, and
counts MobileBERT (model.block="mobilebert") by `mobilebert_flops_per_token`.
"""


def train_flops_per_token(
    num_layers: int,
    hidden_size: int,
    seq_len: int,
    vocab_size: int,
    predicted_fraction: float,
    *,
    intermediate_size: int | None = None,
    gated: bool = False,
    embedding_size: int | None = None,
    local_layers: int = 0,
    local_attention_window: int = 0,
    global_cls: bool = False,
) -> float:
    """Training FLOPs (forward + backward) per real token of BERT-family pretraining.

    With every keyword at its default (BERT: F = 4H, E = H, every layer global) this is

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

    The family options change the terms so:
    - intermediate_size F (default 4H): the feed-forward layer is H*F + F*H multiply-accumulates; with
      `gated` (GeGLU, ModernBERT) its input projection is H -> 2F, H*2F + F*H.
    - embedding_size E (ALBERT, E < H): the E -> H projection of the embeddings, E*H per token, and a
      head whose transform is H -> E and decoder E*V: 6*p*(H*E + E*V).
    - local_layers of the L layers attend within a sliding window of local_attention_window W in total
      (|query - key| <= W/2): each is charged min(S, W+1) keys instead of S, the span of a query away
      from the sequence's ends (not reduced for those near the ends), whatever the kernel computes.
      global_cls (Longformer's [CLS], seen by and seeing all S): min(S, W+3) keys, two more per query.
    Not counted: embedding lookups (gathers), the pooler and NSP head (once per sequence), softmax and
    other element-wise work. Attention is charged at the padded length S. ALBERT's shared layers are
    charged once per layer run: sharing saves parameters, not work.

    Reference values (tested within 1%): BERT-base at S=128, p=20/128: 546 MFLOP/token;
    BERT-large at S=128: 1.88 GFLOP/token; BERT-large at S=512, p=80/512: 1.99 GFLOP/token.
    """
    F = 4 * hidden_size if intermediate_size is None else intermediate_size
    E = hidden_size if embedding_size is None else embedding_size
    _check_arguments(dict(num_layers=num_layers, hidden_size=hidden_size, seq_len=seq_len, vocab_size=vocab_size,
                          intermediate_size=F, embedding_size=E), predicted_fraction, local_layers,
                     local_attention_window)
    L, H, S, V = num_layers, hidden_size, seq_len, vocab_size
    mlp = H * F * (2 if gated else 1) + F * H
    dense = 6 * L * (4 * H * H + mlp)
    projection = 6 * E * H if E != H else 0
    local_keys = min(S, local_attention_window + (3 if global_cls else 1))
    attention = 12 * H * ((L - local_layers) * S + local_layers * local_keys)
    mlm_head = 6 * predicted_fraction * (H * E + E * V)
    return float(dense + projection + attention + mlm_head)


def mobilebert_flops_per_token(
    num_layers: int,
    hidden_size: int,
    seq_len: int,
    vocab_size: int,
    predicted_fraction: float,
    *,
    intra_bottleneck_size: int,
    intermediate_size: int,
    num_feedforward_networks: int = 1,
    embedding_size: int | None = None,
    trigram_input: bool = False,
    key_query_shared_bottleneck: bool = False,
    gated: bool = False,
) -> float:
    """Training FLOPs (forward + backward) per real token of MobileBERT's pretraining (models/mobilebert.py),
    with train_flops_per_token's conventions: 6 FLOPs a multiply-accumulate of a dense layer, 12*S*(width)
    a layer's attention, the masked-LM head at the fraction p of the positions, and nothing else.

    Between layers the state is H wide, inside a layer W = intra_bottleneck_size (0: none, W = H). A
    token's multiply-accumulates, each layer:
    - the input bottleneck H*W (with one), and the shared query/key bottleneck H*W with
      key_query_shared_bottleneck;
    - queries and keys W*W each (from that shared bottleneck, from the input bottleneck with
      use_bottleneck_attention, or from the H = W wide input with neither); values H*W from the input with
      key_query_shared_bottleneck, else W*W (so use_bottleneck_attention needs no argument of its own);
      the attention's output W*W;
    - num_feedforward_networks feed-forward networks W -> F -> W, W*F + F*W each (gated: W*2F + F*W);
    - the output bottleneck W*H (with one);
    and attention over S keys at head size W / heads: 12*S*W per layer and token, as BERT's 12*S*H.
    Once per token: the words (trigram_input: [next, token, previous], 3E wide; else E, when E != H)
    projected to H, 3E*H or E*H. The masked-LM head at the predicted positions: a dense H*H, then the
    decoder, the word table's E columns widened by H - E of its own, H*V: 6*p*(H*H + H*V).
    Not counted, as for BERT: embedding lookups, the pooler and NSP head, norms and other element-wise work.

    configs/mobilebert.py (L=24, H=512, W=128, F=512, four feed-forward networks, E=128 as trigrams,
    V=30522) at S=128, p=20/128: 141,118,656 FLOPs a token.
    """
    W = intra_bottleneck_size or hidden_size
    E = hidden_size if embedding_size is None else embedding_size
    _check_arguments(dict(num_layers=num_layers, hidden_size=hidden_size, seq_len=seq_len, vocab_size=vocab_size,
                          intermediate_size=intermediate_size, embedding_size=E, intra_bottleneck_size=W,
                          num_feedforward_networks=num_feedforward_networks), predicted_fraction, 0, 0)
    L, H, S, V, F = num_layers, hidden_size, seq_len, vocab_size, intermediate_size
    bottlenecks = H * W * (2 * bool(intra_bottleneck_size) + bool(key_query_shared_bottleneck))
    value = H * W if key_query_shared_bottleneck else W * W
    attention_dense = 3 * W * W + value  # queries, keys, output; values
    mlp = num_feedforward_networks * (W * F * (2 if gated else 1) + F * W)
    dense = 6 * L * (bottlenecks + attention_dense + mlp)
    words = 3 * E if trigram_input else E
    projection = 6 * words * H if trigram_input or E != H else 0
    attention = 12 * L * S * W
    mlm_head = 6 * predicted_fraction * (H * H + H * V)
    return float(dense + projection + attention + mlm_head)


def _check_arguments(dimensions: dict, predicted_fraction: float, local_layers: int, local_attention_window: int):
    """train_flops_per_token's arguments, each problem one ValueError line."""
    if min(dimensions.values()) <= 0:
        raise ValueError("model dimensions must be positive: "
                         + ", ".join(f"{name}={value}" for name, value in dimensions.items()))
    if not 0.0 <= predicted_fraction <= 1.0:
        raise ValueError(f"predicted_fraction={predicted_fraction} must lie in [0, 1]")
    num_layers = dimensions["num_layers"]
    if not 0 <= local_layers <= num_layers or local_attention_window < 0:
        raise ValueError(f"local_layers={local_layers} must lie in [0, num_layers={num_layers}] and "
                         f"local_attention_window={local_attention_window} must be >= 0")
    if local_layers and not local_attention_window:
        raise ValueError(f"local_layers={local_layers} needs a local_attention_window > 0")


def config_flops_per_token(model, seq_len: int, predicted_fraction: float) -> float:
    """train_flops_per_token of a model config: any object with BertConfig's attribute names (num_layers,
    hidden_size, vocab_size, intermediate_size, activation, embedding_size, local_attention_window,
    global_attention_every); the family options it lacks are taken as BERT's. Layer i is local when
    local_attention_window > 0 and i % global_attention_every != 0, as the encoder builds it. A config
    with block="mobilebert" is counted by mobilebert_flops_per_token, from its MobileBERT options."""
    if getattr(model, "block", "bert") == "mobilebert":
        return mobilebert_flops_per_token(
            model.num_layers, model.hidden_size, seq_len, model.vocab_size, predicted_fraction,
            intra_bottleneck_size=model.intra_bottleneck_size,
            intermediate_size=model.intermediate_size,
            num_feedforward_networks=model.num_feedforward_networks,
            embedding_size=model.embedding_size or None,
            trigram_input=model.trigram_input,
            key_query_shared_bottleneck=model.key_query_shared_bottleneck,
            gated=getattr(model, "activation", "gelu") == "geglu",
        )
    window = getattr(model, "local_attention_window", 0)
    every = getattr(model, "global_attention_every", 1)
    local_layers = sum(1 for i in range(model.num_layers) if window and i % every != 0)
    return train_flops_per_token(
        model.num_layers, model.hidden_size, seq_len, model.vocab_size, predicted_fraction,
        intermediate_size=model.intermediate_size,
        gated=getattr(model, "activation", "gelu") == "geglu",
        embedding_size=getattr(model, "embedding_size", 0) or None,
        local_layers=local_layers,
        local_attention_window=window if local_layers else 0,
        global_cls=getattr(model, "global_cls", False),
    )


def electra_flops_per_token(discriminator, generator, seq_len: int, predicted_fraction: float) -> float:
    """An ELECTRA step: the generator's (its masked-LM head at the predicted positions) plus the
    discriminator's, whose head (dense H*H, then H -> 1) runs at every token. The sampling is not counted."""
    hidden = discriminator.hidden_size
    return (config_flops_per_token(generator, seq_len, predicted_fraction)
            + config_flops_per_token(discriminator, seq_len, 0.0) + 6 * (hidden * hidden + hidden))


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
