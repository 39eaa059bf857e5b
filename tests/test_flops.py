"""FLOPs per token against the reference figures and against the matmuls of the actual model's traced forward
pass (BERT, MobileBERT), MFU arithmetic, peaks per device kind."""

import math

import jax
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



def test_flops_per_token_albert_shape():
    # ALBERT-base at S=128, p=20/128: L=12, H=768, F=3072, E=128, V=30000.
    #   dense layers   6 * 12 * (4*768^2 + 2*768*3072) = 6 * 12 * 7,077,888     = 509,607,936
    #   E->H projection 6 * 128 * 768                                            =     589,824
    #   attention      12 * 12 * 128 * 768                                       =  14,155,776
    #   MLM head       6 * (20/128) * (768*128 + 128*30000) = 0.9375 * 3,938,304 =   3,692,160
    #   total                                                                       528,045,696
    per_token = flops.train_flops_per_token(12, 768, 128, 30000, 20 / 128, intermediate_size=3072, embedding_size=128)
    assert per_token == 528_045_696
    # E = H is BERT: no projection, the same head.
    assert flops.train_flops_per_token(12, 768, 128, VOCAB, 0.1, embedding_size=768) == \
        flops.train_flops_per_token(12, 768, 128, VOCAB, 0.1)


def test_flops_per_token_geglu():
    # ModernBERT-base's shape with every layer global, S=1024, p=320/1024: L=22, H=768, F=1152, V=50368.
    #   dense layers   6 * 22 * (4*768^2 + 768*2*1152 + 1152*768) = 6 * 22 * 5,013,504 = 661,782,528
    #   attention      12 * 22 * 1024 * 768                                           = 207,618,048
    #   MLM head       6 * (320/1024) * (768^2 + 768*50368) = 1.875 * 39,272,448     =  73,635,840
    #   total                                                                            943,036,416
    per_token = flops.train_flops_per_token(22, 768, 1024, 50368, 320 / 1024, intermediate_size=1152, gated=True)
    assert per_token == 943_036_416
    # Gating adds the H*F of the second half of the input projection per layer.
    ungated = flops.train_flops_per_token(22, 768, 1024, 50368, 320 / 1024, intermediate_size=1152)
    assert per_token - ungated == 6 * 22 * 768 * 1152


def test_flops_per_token_local_window():
    # As above, with ModernBERT-base's attention: of 22 layers, 0, 3, ..., 21 are global (8) and 14 are
    # local with a window of 128 in total, |query - key| <= 64: 129 keys.
    #   attention      12 * 768 * (8*1024 + 14*129) = 12 * 768 * 9,998 = 92,141,568
    #   total          661,782,528 + 92,141,568 + 73,635,840           = 827,559,936
    per_token = flops.train_flops_per_token(22, 768, 1024, 50368, 320 / 1024, intermediate_size=1152, gated=True,
                                            local_layers=14, local_attention_window=128)
    assert per_token == 827_559_936
    # With a global [CLS] each local query also sees [CLS], and [CLS] sees all S keys: 131 keys, 2 more
    # on each of the 14 local layers, 12 * 768 * 14 * 2 = 258,048.
    assert flops.train_flops_per_token(22, 768, 1024, 50368, 320 / 1024, intermediate_size=1152, gated=True,
                                       local_layers=14, local_attention_window=128, global_cls=True) == \
        827_559_936 + 258_048
    # A window wider than the sequence is global attention: min(S, W+1) = S keys.
    assert flops.train_flops_per_token(3, 128, 128, 8192, 0.3, local_layers=2, local_attention_window=128) == \
        flops.train_flops_per_token(3, 128, 128, 8192, 0.3)
    with pytest.raises(ValueError, match="local_attention_window"):
        flops.train_flops_per_token(3, 128, 128, 8192, 0.3, local_layers=2)
    with pytest.raises(ValueError, match="local_layers"):
        flops.train_flops_per_token(3, 128, 128, 8192, 0.3, local_layers=4, local_attention_window=8)


def test_config_flops_per_token_reads_the_family_options():
    from types import SimpleNamespace

    from configs import albert_base, base, modernbert_base

    # A BERT config, and an object with only BERT's attributes: the formula with its defaults.
    bert_base = base.get_config().model
    assert flops.config_flops_per_token(bert_base, 128, 20 / 128) == \
        flops.train_flops_per_token(12, 768, 128, 30522, 20 / 128)
    plain = SimpleNamespace(num_layers=12, hidden_size=768, vocab_size=VOCAB, intermediate_size=3072)
    assert flops.config_flops_per_token(plain, 128, 20 / 128) == \
        flops.train_flops_per_token(12, 768, 128, VOCAB, 20 / 128)
    assert flops.config_flops_per_token(albert_base.get_config().model, 128, 20 / 128) == 528_045_696
    # ModernBERT-base: GeGLU, and 14 local layers of 22 (i % 3 != 0).
    assert flops.config_flops_per_token(modernbert_base.get_config().model, 1024, 320 / 1024) == 827_559_936
    with_cls = modernbert_base.get_config().model
    with_cls.global_cls = True
    assert flops.config_flops_per_token(with_cls, 1024, 320 / 1024) == 827_559_936 + 258_048


# --- against the model's own matmuls -----------------------------------------------------------------


def _dot_flops(jaxpr) -> int:
    """FLOPs of every dot_general in a jaxpr and the jaxprs inside it (jit, remat, custom derivatives; a scan's
    body times its length): 2 * (output elements) * (contracted elements) each."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            contracted = math.prod(eqn.invars[0].aval.shape[d] for d in lhs_contract)
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * contracted
        assert eqn.primitive.name not in ("while", "cond"), f"{eqn.primitive.name}: a trip count unknown here"
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's, or a Jaxpr
                if hasattr(inner, "eqns"):
                    total += times * _dot_flops(inner)
    return total


def traced_flops_per_token(cfg, batch_size: int, seq_len: int, predictions: int) -> float:
    """An independent count: the matmul FLOPs of BertForPreTraining's forward pass as traced (shapes only:
    nothing is initialised or run), the last layer at every position as train_flops_per_token charges it,
    times 3 for the backward pass (two matmuls of the same size per forward one), per token. Less the
    pooler dense (if any) and the NSP head, once per sequence, which the formulas leave out."""
    from bertjax.models import bert as bert_model

    model = bert_model.BertForPreTraining(cfg)
    batch = bert_model.dummy_batch(batch_size, seq_len, predictions)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), **batch)["params"])
    forward = jax.make_jaxpr(lambda p, b: model.apply({"params": p}, **b))(params, batch)
    hidden = cfg.hidden_size
    per_sequence = 2 * (2 * hidden + (0 if cfg.pooler == "first" else hidden * hidden))
    return 3 * (_dot_flops(forward.jaxpr) - batch_size * per_sequence) / (batch_size * seq_len)


def _tiny(**fields):
    from bertjax.models.config import BertConfig

    shape = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=24,
                 max_position_embeddings=24, attention_impl="xla", dtype="float32")
    return BertConfig.from_dict({**shape, **fields}, platform="cpu")


# The two MobileBERT variants: the published model's options (NoNorm, ReLU, trigrams, the shared query/key
# bottleneck whose values come from the H-wide input, stacked feed-forward networks), and the bottleneck as
# every attention input with E-wide words and no trigrams (tests/test_mobilebert.py's two).
MOBILEBERT = dict(block="mobilebert", embedding_size=16, intra_bottleneck_size=16, pooler="first")
MOBILEBERT_VARIANTS = {
    "shared_bottleneck": dict(MOBILEBERT, norm="no_norm", activation="relu", trigram_input=True,
                              key_query_shared_bottleneck=True, num_feedforward_networks=3),
    "bottleneck_attention": dict(MOBILEBERT, norm="layernorm", activation="gelu", trigram_input=False,
                                 use_bottleneck_attention=True, num_feedforward_networks=2),
}


def test_traced_count_reproduces_the_bert_formula():
    # The reference's conventions are the formula's: a tiny BERT (tanh pooler) and ALBERT-shaped embeddings.
    for fields in (dict(), dict(embedding_size=16, num_hidden_groups=1)):
        cfg = _tiny(**fields)
        assert traced_flops_per_token(cfg, 2, 16, 4) == flops.config_flops_per_token(cfg, 16, 4 / 16)


@pytest.mark.parametrize("variant", sorted(MOBILEBERT_VARIANTS))
def test_mobilebert_flops_match_the_traced_model(variant):
    cfg = _tiny(**MOBILEBERT_VARIANTS[variant])
    per_token = flops.config_flops_per_token(cfg, 16, 4 / 16)
    assert per_token == traced_flops_per_token(cfg, 2, 16, 4)
    # and not BERT's count of the same shapes, which charges H-wide layers and an E-wide decoder.
    assert per_token != flops.train_flops_per_token(2, 32, 16, 97, 4 / 16, intermediate_size=24, embedding_size=16)


def test_mobilebert_configs():
    from bertjax.models.config import BertConfig
    from configs import mobilebert, mobilebert_tiny

    # configs/mobilebert.py at S=128, p=20/128: L=24, H=512, W=128, F=512, four feed-forward networks,
    # trigrams of E=128, V=30522. Multiply-accumulates of a token, each layer:
    #   bottlenecks: input, shared query/key, output   3 * 512*128             =   196,608
    #   queries, keys, attention output                3 * 128*128             =    49,152
    #   values from the H-wide input                   512*128                 =    65,536
    #   feed-forward networks                          4 * 2 * 128*512         =   524,288
    #                                                                               835,584
    #   dense layers   6 * 24 * 835,584                                          = 120,324,096
    #   attention      12 * 24 * 128 * 128                                       =   4,718,592
    #   trigram projection 6 * 3*128 * 512                                       =   1,179,648
    #   MLM head       6 * (20/128) * (512^2 + 512*30522) = 0.9375 * 15,889,408  =  14,896,320
    #   total                                                                      141,118,656
    assert flops.config_flops_per_token(mobilebert.get_config().model, 128, 20 / 128) == 141_118_656
    # configs/mobilebert_tiny.py: L=4, H=128, W=64, F=128, two feed-forward networks, E=64, V=8192.
    #   dense layers   6 * 4 * (3*128*64 + 3*64^2 + 128*64 + 2*2*64*128)         =   1,867,776
    #   attention      12 * 4 * 128 * 64                                         =     393,216
    #   trigram projection 6 * 3*64 * 128                                        =     147,456
    #   MLM head       6 * (20/128) * (128^2 + 128*8192)                          =     998,400
    #   total                                                                        3,406,848
    tiny = BertConfig.from_dict(mobilebert_tiny.get_config().model, platform="cpu")
    assert flops.config_flops_per_token(tiny, 128, 20 / 128) == 3_406_848
    assert traced_flops_per_token(tiny, 1, 128, 20) == 3_406_848


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
