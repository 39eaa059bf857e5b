"""The model families (RoBERTa, ALBERT, ModernBERT; MobileBERT's parity: tests/test_mobilebert.py) as options
of the one encoder, against transformers: random small weights in float32, logits within 1e-5 of the
reference, and HF -> bertjax -> HF bit-exact.

As in tests/test_hf.py, every reference parameter (norms and biases included) is overwritten with
noise, so that a wrong name, transpose or reshape in a family's table shows up in the outputs.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bertjax import init_from
from bertjax.interop import hf
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models import attention

ATOL = 1e-5


def randomize(hf_model, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            is_scale = name.endswith("weight") and p.ndim == 1  # a norm's scale
            p.copy_(1.0 + 0.1 * noise if is_scale else 0.05 * noise)
    return hf_model.eval()


def make_batch(vocab: int, pad: int, seq: int = 12, seed: int = 0) -> dict:
    """Three right-padded rows (padding = the family's pad id), three predictions per row, the last
    row's third a padding prediction at position 0. Real ids avoid the special ids 0..3."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq, 7, 4])
    input_mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    input_ids = np.where(input_mask == 1, rng.integers(4, vocab, size=(3, seq)), pad).astype(np.int32)
    segment_ids = np.zeros_like(input_ids)
    positions = np.stack([np.sort(rng.choice(np.arange(1, n), size=3, replace=False)) for n in lengths])
    positions[2, 2] = 0
    return dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask,
                masked_lm_positions=positions.astype(np.int32))


@functools.lru_cache(maxsize=None)
def _forward(cfg: BertConfig):
    def forward(params, batch):
        out = bert_model.BertForPreTraining(cfg).apply({"params": params}, **batch, heads_only=True)
        inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
        full = bert_model.BertModel(cfg).apply({"params": params["bert"]}, **inputs, output_hidden_states=True)
        return {"mlm_logits": out["mlm_logits"], "nsp_logits": out["nsp_logits"], **full}

    return jax.jit(forward)


def hf_reference(hf_model, batch: dict, **kwargs) -> dict:
    ids = torch.as_tensor(batch["input_ids"], dtype=torch.long)
    mask = torch.as_tensor(batch["input_mask"], dtype=torch.long)
    with torch.no_grad():
        out = hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kwargs)
    logits = out.logits if hasattr(out, "logits") else out.prediction_logits
    return {"mlm_logits": np.take_along_axis(logits.numpy(), batch["masked_lm_positions"][..., None], axis=1),
            "hidden_states": [h.numpy() for h in out.hidden_states], "out": out}


def check_parity(family: str, cfg, params, batch, ref) -> float:
    """Every hidden state but the last, and the MLM logits, within ATOL of transformers' (the largest
    logit difference printed under -s)."""
    ours = jax.device_get(_forward(cfg)(params, batch))
    real = batch["input_mask"].astype(bool)
    assert len(ours["hidden_states"]) == len(ref["hidden_states"])
    for a, b in zip(ours["hidden_states"][:-1], ref["hidden_states"][:-1]):
        np.testing.assert_allclose(a[real], b[real], rtol=0, atol=ATOL)
    difference = float(np.abs(ours["mlm_logits"] - ref["mlm_logits"]).max())
    np.testing.assert_allclose(ours["mlm_logits"], ref["mlm_logits"], rtol=0, atol=ATOL)
    print(f"{family}: max |logit difference| vs transformers {difference:.2e}")
    return difference


def check_round_trip(hf_model, cfg, params, model_type: str, tmp_path):
    """bertjax -> HF gives the reference's own tensors (tied copies aside), bit for bit, and a directory
    the transformers class loads with nothing missing."""
    family = hf.family_of_config(cfg)  # how bertjax.export finds the family
    assert family is hf.FAMILIES[model_type]
    state = hf.params_to_hf(params, cfg)
    reference = {k: v.numpy() for k, v in hf_model.state_dict().items() if k not in family.tied}
    reference = {k: v for k, v in reference.items() if not k.endswith("_ids")}
    assert sorted(state) == sorted(reference)
    for name, x in state.items():
        np.testing.assert_array_equal(x, reference[name], err_msg=name)
    hf.save_hf_checkpoint(tmp_path / "out", cfg, params)
    loaded, info = type(hf_model).from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    for name, x in loaded.state_dict().items():
        if name in reference:
            np.testing.assert_array_equal(x.numpy(), reference[name], err_msg=name)


# --------------------------------------------------------------------------------------------------
# RoBERTa
# --------------------------------------------------------------------------------------------------

ROBERTA = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
               max_position_embeddings=20, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    config = transformers.RobertaConfig(**ROBERTA, attn_implementation="eager")
    torch.manual_seed(0)
    hf_model = randomize(transformers.RobertaForMaskedLM(config))
    directory = tmp_path_factory.mktemp("roberta")
    hf_model.save_pretrained(directory)
    return hf_model, directory


def test_roberta_parity_with_transformers(roberta):
    hf_model, directory = roberta
    loaded = init_from.load(init_from.resolve(str(directory), tokenizer=False))
    cfg, params = loaded.config, loaded.params
    assert (cfg.position_offset, cfg.type_vocab_size, cfg.max_position_embeddings) == (2, 1, 20)
    assert sorted(loaded.missing) == ["bert/pooler/bias", "bert/pooler/kernel", "nsp_head/bias", "nsp_head/kernel"]
    batch = make_batch(ROBERTA["vocab_size"], pad=1, seq=18)  # 18 + offset 2 = the whole position table
    check_parity("roberta", cfg, params, batch, hf_reference(hf_model, batch))


def test_roberta_round_trip(roberta, tmp_path):
    hf_model, directory = roberta
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    check_round_trip(hf_model, cfg, params, "roberta", tmp_path)


# --------------------------------------------------------------------------------------------------
# ALBERT: E != H, 4 layers in 2 shared groups, tanh GELU, SOP head
# --------------------------------------------------------------------------------------------------

ALBERT = dict(vocab_size=97, embedding_size=24, hidden_size=64, num_hidden_layers=4, num_hidden_groups=2,
              num_attention_heads=4, intermediate_size=80, max_position_embeddings=16, hidden_act="gelu_new",
              pad_token_id=0)


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    config = transformers.AlbertConfig(**ALBERT, attn_implementation="eager")
    torch.manual_seed(0)
    hf_model = randomize(transformers.AlbertForPreTraining(config), seed=1)
    directory = tmp_path_factory.mktemp("albert")
    hf_model.save_pretrained(directory)
    return hf_model, directory


def test_albert_parity_with_transformers(albert):
    hf_model, directory = albert
    loaded = init_from.load(init_from.resolve(str(directory), tokenizer=False))
    cfg, params = loaded.config, loaded.params
    assert loaded.missing == []
    assert (cfg.embedding_width, cfg.num_groups, cfg.activation) == (24, 2, "gelu_tanh")
    assert sorted(k for k in params["bert"]["encoder"]) == ["layers_0", "layers_1"]  # two groups of parameters
    batch = make_batch(ALBERT["vocab_size"], pad=0, seq=16, seed=1)
    batch["segment_ids"] = (np.arange(16)[None, :] >= 5).astype(np.int32) * batch["input_mask"]
    ref = hf_reference(hf_model, batch, token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long))
    check_parity("albert", cfg, params, batch, ref)
    ours = jax.device_get(_forward(cfg)(params, batch))
    np.testing.assert_allclose(ours["nsp_logits"], ref["out"].sop_logits.numpy(), rtol=0, atol=ATOL)


def test_albert_round_trip(albert, tmp_path):
    hf_model, directory = albert
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    check_round_trip(hf_model, cfg, params, "albert", tmp_path)
    # Its masked-LM class alone (bertjax.export --hf_class=masked_lm): no pooler, no sentence-order head.
    hf.save_hf_checkpoint(tmp_path / "mlm", cfg, params, masked_lm_only=True)
    loaded, info = transformers.AlbertForMaskedLM.from_pretrained(tmp_path / "mlm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.architectures == ["AlbertForMaskedLM"]


# --------------------------------------------------------------------------------------------------
# ModernBERT: pre-norm without biases, RoPE (two bases), GeGLU, global every 2nd layer, window 4 (+-2)
# --------------------------------------------------------------------------------------------------

MODERNBERT = dict(vocab_size=103, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2,
                  global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=0, bos_token_id=1,
                  cls_token_id=1, eos_token_id=2, sep_token_id=2)


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    config = transformers.ModernBertConfig(**MODERNBERT, attn_implementation="eager")
    torch.manual_seed(0)
    hf_model = randomize(transformers.ModernBertForMaskedLM(config), seed=2)
    directory = tmp_path_factory.mktemp("modernbert")
    hf_model.save_pretrained(directory)
    return hf_model, directory


def test_modernbert_parity_with_transformers(modernbert):
    hf_model, directory = modernbert
    loaded = init_from.load(init_from.resolve(str(directory), tokenizer=False))
    cfg, params = loaded.config, loaded.params
    assert (cfg.local_attention_window, cfg.global_attention_every, cfg.global_rotary_theta) == (4, 2, 160000.0)
    assert "attention_layer_norm" not in params["bert"]["encoder"]["layers_0"]  # HF's Identity
    batch = make_batch(MODERNBERT["vocab_size"], pad=0, seq=12, seed=2)
    check_parity("modernbert", cfg, params, batch, hf_reference(hf_model, batch))


def test_modernbert_round_trip(modernbert, tmp_path):
    hf_model, directory = modernbert
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    check_round_trip(hf_model, cfg, params, "modernbert", tmp_path)


# --------------------------------------------------------------------------------------------------
# The options themselves: validation, scan and remat, and that the parity tests would see a mistake
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, keys", [
    (dict(num_layers=4, num_hidden_groups=3), "model.num_hidden_groups=3 must divide model.num_layers=4"),
    (dict(hidden_size=30, num_heads=2, position_embedding="rotary"), "model.position_embedding='rotary' needs"),
    (dict(norm_placement="pre", pre_layer_norm=True), "model.pre_layer_norm=True and model.norm_placement='pre'"),
    (dict(activation="swiglu"), "model.activation='swiglu': choose one of"),
    (dict(position_embedding="rotary", position_offset=2), "model.position_offset is set but"),
    (dict(global_cls=True), "model.global_cls=True opens the local layers' window to [CLS]: it needs"),
    (dict(global_cls=True, local_attention_window=4, attention_impl="splash", attention_dropout_rate=0.0),
     "model.global_cls=True needs model.attention_impl"),
    # MobileBERT's options: its own, with a bottleneck to read, one attention input, its own post-norm block.
    (dict(block="transformer"), "model.block='transformer': choose one of"),
    (dict(trigram_input=True, num_feedforward_networks=2),
     "model options ['trigram_input', 'num_feedforward_networks'] are MobileBERT's: set model.block='mobilebert'"),
    (dict(block="mobilebert", key_query_shared_bottleneck=True), "need model.intra_bottleneck_size > 0"),
    (dict(block="mobilebert", intra_bottleneck_size=16, key_query_shared_bottleneck=True,
          use_bottleneck_attention=True), "are two inputs of the attention: set one"),
    (dict(block="mobilebert", intra_bottleneck_size=16), "attends over the H-wide input only where it is"),
    (dict(block="mobilebert", num_feedforward_networks=0), "model.num_feedforward_networks=0 >= 1"),
    (dict(block="mobilebert", embedding_size=64), "model.embedding_size=64 is wider than model.hidden_size=32"),
    (dict(block="mobilebert", intra_bottleneck_size=15, use_bottleneck_attention=True),
     "model.intra_bottleneck_size=15 is not divisible by model.num_heads=2"),
    (dict(block="mobilebert", norm_placement="pre", activation="geglu"),
     "model.block='mobilebert' has post-norm blocks of its own, learned positions, global attention, no shared "
     "or pruned layers and no gated activation: unset ['norm_placement', 'activation']"),
])
def test_incompatible_options_are_one_line_naming_the_keys(fields, keys):
    with pytest.raises(ValueError) as error:
        BertConfig(**{"hidden_size": 32, "num_heads": 2, "intermediate_size": 48, **fields})
    message = str(error.value)
    assert keys in message and "\n" not in message, message


def _small(**fields):
    fields = {"num_layers": 3, **fields}
    return BertConfig(vocab_size=50, hidden_size=32, num_heads=4, intermediate_size=40,
                                 max_position_embeddings=20, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
                                 **fields)


SCANNABLE = dict(position_embedding="rotary", rotary_theta=500.0, activation="geglu", norm="rmsnorm", use_bias=False,
                 type_vocab_size=0)

# Networks whose scanned layout differs from BERT's (scanned_layout), at 4 layers: ALBERT's groups
# stacked [G, ...], each run L/G times; ModernBERT's layer 0 unrolled and layers 1..3 stacked, local
# (window 4 < seq 16, rotary base 500) or global (base 20,000) by a flag scanned over. And MobileBERT's
# block, stacked as BERT's: bottlenecks of 16, the shared query/key one, three FFNs, NoNorm, ReLU.
MOBILEBERT = dict(block="mobilebert", embedding_size=16, trigram_input=True, intra_bottleneck_size=16,
                  key_query_shared_bottleneck=True, num_feedforward_networks=3, norm="no_norm", activation="relu",
                  pooler="first")
SCANNED_FAMILIES = {
    "albert_one_group": dict(num_layers=4, num_hidden_groups=1, embedding_size=24, activation="gelu_tanh"),
    "albert_two_groups": dict(num_layers=4, num_hidden_groups=2),
    "modernbert": dict(SCANNABLE, num_layers=4, norm_placement="pre", local_attention_window=4,
                       global_attention_every=3, global_rotary_theta=20000.0),
    "mobilebert": dict(MOBILEBERT, num_layers=4),
}
SCAN_BATCH = make_batch(50, pad=0, seq=16, seed=3)


def _scanned_pair(family: str, **compute):
    """(unrolled config, scanned config, unrolled params, the same params stacked). Random params of the
    init's shapes (norm scales near 1), drawn in numpy: an eager init costs seconds per config."""
    cfg = _small(**SCANNED_FAMILIES[family])
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True, **compute)
    shapes = jax.eval_shape(bert_model.BertForPreTraining(cfg).init, jax.random.PRNGKey(0), **SCAN_BATCH)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: ((1.0 if "scale" in jax.tree_util.keystr(path) else 0.0)
                         + rng.normal(0, 0.1, x.shape).astype(x.dtype)),
        nn.meta.unbox(shapes["params"]))
    encoder = bert_model.stack_layers(params["bert"]["encoder"], scanned_cfg)
    return cfg, scanned_cfg, params, dict(params, bert=dict(params["bert"], encoder=encoder))


# Compiling is most of the scan tests' time, and these tiny programs run in milliseconds: LLVM's
# optimisation passes, about half of each compile on CPU, are skipped (float semantics are unchanged).
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


@functools.lru_cache(maxsize=None)
def _encoder_grad_and_outputs(cfg: BertConfig):
    """One compiled function per config: the gradient of a loss on the encoder's output, with its output
    and every layer's hidden state."""

    def loss(encoder_params, x, padding):
        y, hidden, _ = bert_model.Encoder(cfg).apply({"params": encoder_params}, x, padding, True, True)
        return jnp.mean(jnp.sin(y)), [y, *hidden]  # sin: the gradient depends on every layer

    return jax.jit(jax.grad(loss, has_aux=True), compiler_options=QUICK_COMPILE)


def _encoder_inputs():
    """x [B, S, H] and the Padding (mask [B, 1, 1, S], lengths [B], no positions) of SCAN_BATCH."""
    x = np.random.default_rng(1).normal(0, 1, (*SCAN_BATCH["input_ids"].shape, 32)).astype(np.float32)
    mask = SCAN_BATCH["input_mask"] > 0
    return x, attention.Padding(mask[:, None, None, :], mask.sum(-1).astype(np.int32), None)


def _assert_trees_close(a, b, atol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=atol), a, b)


@pytest.mark.parametrize("family, remat", [("albert_one_group", "none"), ("albert_two_groups", "save_named"),
                                           ("modernbert", "none"), ("modernbert", "full"),
                                           ("mobilebert", "save_named")])
def test_options_under_scan_and_remat_compute_the_unrolled_network(family, remat):
    """The scanned layouts compute the unrolled network, outputs and gradients (the heads' rows taken
    after a scan are compared with transformers in the next test)."""
    cfg, scanned_cfg, params, scanned = _scanned_pair(family, remat_policy=remat)
    # The scanned model initialises the tree that stack_layers builds, and unstack_layers undoes it.
    init = jax.eval_shape(bert_model.BertForPreTraining(scanned_cfg).init, jax.random.PRNGKey(0), **SCAN_BATCH)
    _assert_trees_close(jax.tree_util.tree_map(lambda x: x.shape, nn.meta.unbox(init["params"])),
                        jax.tree_util.tree_map(lambda x: x.shape, scanned))
    _assert_trees_close(bert_model.unstack_layers(scanned["bert"]["encoder"], scanned_cfg),
                        params["bert"]["encoder"], 0)

    grads, outputs = _encoder_grad_and_outputs(cfg)(params["bert"]["encoder"], *_encoder_inputs())
    scanned_grads, scanned_outputs = _encoder_grad_and_outputs(scanned_cfg)(scanned["bert"]["encoder"],
                                                                            *_encoder_inputs())
    assert len(outputs) == 1 + cfg.num_layers
    _assert_trees_close(outputs, scanned_outputs)
    _assert_trees_close(grads, bert_model.unstack_layers(scanned_grads, scanned_cfg))


@pytest.mark.parametrize("family", ["albert", "modernbert"])
def test_scanned_families_convert_to_and_from_hugging_face(family, request):
    """Loading a family's HF directory with scan_layers=True stacks what the unrolled load gives, exports
    the same tensors, and computes transformers' outputs."""
    hf_model, directory = request.getfixturevalue(family)
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    scanned_cfg, scanned, _ = hf.load_hf_checkpoint(directory, {"scan_layers": True})
    assert scanned_cfg == dataclasses.replace(cfg, scan_layers=True)
    expected = {"albert": ["layers"], "modernbert": ["final_layer_norm", "layers", "layers_0"]}[family]
    assert sorted(scanned["bert"]["encoder"]) == expected
    unstacked = bert_model.unstack_layers(scanned["bert"]["encoder"], scanned_cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, unstacked, params["bert"]["encoder"])

    exported = hf.params_to_hf(scanned, scanned_cfg)
    reference = hf.params_to_hf(params, cfg)
    assert sorted(exported) == sorted(reference)
    for name, x in exported.items():
        np.testing.assert_array_equal(x, reference[name], err_msg=name)

    if family == "albert":  # the batches of the parity tests above
        batch = make_batch(ALBERT["vocab_size"], pad=0, seq=16, seed=1)
        batch["segment_ids"] = (np.arange(16)[None, :] >= 5).astype(np.int32) * batch["input_mask"]
        ref = hf_reference(hf_model, batch, token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long))
    else:
        batch = make_batch(MODERNBERT["vocab_size"], pad=0, seq=12, seed=2)
        ref = hf_reference(hf_model, batch)
    check_parity(f"{family} (scanned)", scanned_cfg, scanned, batch, ref)


def test_cudnn_path_sends_windows_as_masks(monkeypatch):
    """cuDNN attention does not run on CPU, and JAX's cuDNN call refuses a window reaching to the right
    (it has only the causal, left one). With the XLA implementation of jax.nn.dot_product_attention
    standing in for it, the scanned cuDNN path of alternating layers passes every layer's keys as a
    mask (the band of the local ones inside it), never as a kernel window, and computes the unrolled
    XLA network; unrolled, the global layers still pass padding as lengths. The families' cuDNN
    configs construct."""
    for family in ("albert_two_groups", "modernbert"):
        _small(**SCANNED_FAMILIES[family], scan_layers=True, attention_impl="cudnn", dtype="bfloat16")
    cfg, scanned_cfg, params, scanned = _scanned_pair("modernbert", attention_impl="cudnn")
    _, expected = _encoder_grad_and_outputs(cfg)(params["bert"]["encoder"], *_encoder_inputs())

    fused_attention = attention.fused_attention
    calls = set()

    def xla_for_cudnn(q, k, v, *, implementation, **kwargs):
        assert set(kwargs) == {"mask", "kv_lengths"}  # no window argument reaches the kernel
        calls.add((implementation, kwargs["kv_lengths"] is None))
        return fused_attention(q, k, v, implementation="xla", **kwargs)

    monkeypatch.setattr(attention, "fused_attention", xla_for_cudnn)
    forward = jax.jit(
        lambda p, x, padding: bert_model.Encoder(scanned_cfg).apply({"params": p}, x, padding, True, True))
    y, hidden, _ = forward.lower(scanned["bert"]["encoder"], *_encoder_inputs()).compile(QUICK_COMPILE)(
        scanned["bert"]["encoder"], *_encoder_inputs())
    # Layer 0 (global, unrolled): lengths; the scanned layers, local or global by a traced flag: a mask.
    assert calls == {("cudnn", False), ("cudnn", True)}, calls
    real = SCAN_BATCH["input_mask"].astype(bool)
    for a, b in zip([y, *hidden], expected):  # the real rows: padded ones attend to nothing in a local window
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], rtol=0, atol=ATOL)


def test_modernbert_window_and_rotary_bases_matter(modernbert):
    """The parity test would notice a window or a rotary base left out: each moves the logits by well over
    its tolerance."""
    hf_model, directory = modernbert
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    batch = make_batch(MODERNBERT["vocab_size"], pad=0, seq=12, seed=2)
    reference = np.asarray(_forward(cfg)(params, batch)["mlm_logits"])
    for change in (dict(local_attention_window=0), dict(global_rotary_theta=0.0), dict(rotary_theta=160000.0)):
        other = np.asarray(_forward(dataclasses.replace(cfg, **change))(params, batch)["mlm_logits"])
        assert np.abs(other - reference).max() > 10 * ATOL, change


def test_the_family_of_a_config_is_the_one_whose_options_it_has(tmp_path):
    """What bertjax.export and every save find: the one family whose own options the config sets (BERT:
    none); a network no Hugging Face class computes is refused in one line naming the options."""
    assert hf.family_of_config(_small()) is hf.FAMILIES["bert"]
    assert hf.family_of_config(_small(position_offset=2)) is hf.FAMILIES["roberta"]
    assert hf.config_to_hf(_small(position_offset=2))["architectures"] == ["RobertaForMaskedLM"]
    # Factorised embeddings are ALBERT's, but ELECTRA's with ELECTRA's classification head (pooler gelu).
    assert hf.family_of_config(_small(embedding_size=16)) is hf.FAMILIES["albert"]
    assert hf.family_of_config(_small(embedding_size=16, pooler="gelu")) is hf.FAMILIES["electra"]
    assert hf.config_to_hf(_small(pooler="gelu"))["architectures"] == ["ElectraForPreTraining"]
    # MobileBERT's block comes with factorised embeddings of its own: MobileBERT's, not ALBERT's.
    assert hf.family_of_config(_small(**MOBILEBERT)) is hf.FAMILIES["mobilebert"]
    with pytest.raises(ValueError, match="a MobileBERT checkpoint needs model.block='mobilebert', activation relu"):
        hf.family_of_config(_small(**dict(MOBILEBERT, norm="rmsnorm")))
    with pytest.raises(ValueError, match=r"model options \['global_cls'\] are not ModernBERT's"):  # Longformer's [CLS]
        hf.family_of_config(_small(**dict(SCANNED_FAMILIES["modernbert"], norm="layernorm"), global_cls=True))
    with pytest.raises(ValueError, match=r"model options \['norm'\] make a network no Hugging Face class has"):
        hf.family_of_config(_small(norm="rmsnorm"))
    with pytest.raises(ValueError, match=r"model options \['activation', 'position_offset'\] make a network no"):
        hf.family_of_config(_small(position_offset=2, activation="gelu_tanh"))  # RoBERTa's and ALBERT's at once
    with pytest.raises(ValueError, match="a ModernBERT checkpoint needs"):
        hf.family_of_config(_small(**SCANNABLE))
    with pytest.raises(ValueError, match=r"model options \['norm'\] are not RoBERTa's"):
        hf.save_hf_checkpoint(tmp_path, _small(position_offset=2, norm="rmsnorm"), {})
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="model.head_size=4 x model.num_heads=4 is not model.hidden_size=32"):
        hf.family_of_config(_small(head_size=4))
