"""MobileBERT (Sun et al. 2020) as a family of the one encoder (model.block="mobilebert") against transformers'
MobileBERT, in float32 with every parameter noise: logits within 1e-5 both ways (HF -> bertjax, and bertjax ->
HF through bertjax.interop.hf), HF -> bertjax -> HF bit-exact, scanned as unrolled, and the published config.

Two tiny networks: the published model's options (NoNorm, ReLU, trigram input, a shared query/key bottleneck,
stacked feed-forward networks, no pooler dense) and the others (LayerNorm, where transformers leaves two norms
at torch's eps; the bottleneck as every attention input; GELU; E-wide words without trigrams; a tanh pooler).
The task heads of every kind, the option checks, scanning, remat and packed rows are in the families'
parametrised tests (test_family_heads, test_families, test_packing_model); the heads here are the tanh
pooler's.
"""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers
from test_families import ATOL, check_parity, check_round_trip, hf_reference, make_batch, randomize
from test_family_heads import assert_logits_equal, bertjax_logits, hf_logits, make_inputs, random_head

from bertjax import init_from
from bertjax.interop import hf
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from configs import mobilebert as mobilebert_config

SHAPE = dict(vocab_size=97, hidden_size=32, embedding_size=16, intra_bottleneck_size=16, num_hidden_layers=2,
             num_attention_heads=2, intermediate_size=24, max_position_embeddings=24, pad_token_id=0)
VARIANTS = {
    "published": dict(SHAPE, normalization_type="no_norm", hidden_act="relu", trigram_input=True,
                      key_query_shared_bottleneck=True, use_bottleneck_attention=False, num_feedforward_networks=3,
                      classifier_activation=False),
    "layer_norm": dict(SHAPE, normalization_type="layer_norm", hidden_act="gelu", trigram_input=False,
                       key_query_shared_bottleneck=False, use_bottleneck_attention=True, num_feedforward_networks=2,
                       classifier_activation=True),
}
SEQ = 16


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def mobilebert(request, tmp_path_factory):
    """(variant, a randomised MobileBertForPreTraining, the directory it is saved in)."""
    config = transformers.MobileBertConfig(**VARIANTS[request.param], attn_implementation="eager")
    torch.manual_seed(0)
    hf_model = randomize(transformers.MobileBertForPreTraining(config), seed=4)
    directory = tmp_path_factory.mktemp(f"mobilebert_{request.param}")
    hf_model.save_pretrained(directory)
    return request.param, hf_model, directory


def _batch_and_reference(hf_model, seed: int = 4):
    """make_batch's rows with a second segment from position 5, and transformers' outputs on them."""
    batch = make_batch(SHAPE["vocab_size"], pad=0, seq=SEQ, seed=seed)
    batch["segment_ids"] = (np.arange(SEQ)[None, :] >= 5).astype(np.int32) * batch["input_mask"]
    return batch, hf_reference(hf_model, batch, token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long))


def test_pretraining_parity_with_transformers(mobilebert):
    """Every hidden state, the masked-LM logits at the predicted rows (the heads-only path) and the NSP logits."""
    variant, hf_model, directory = mobilebert
    loaded = init_from.load(init_from.resolve(str(directory), tokenizer=False))
    cfg, params = loaded.config, loaded.params
    assert loaded.missing == []
    expected = {"published": ("no_norm", "relu", True, True, False, 3, "first"),
                "layer_norm": ("layernorm", "gelu", False, False, True, 2, "tanh")}[variant]
    assert (cfg.norm, cfg.activation, cfg.trigram_input, cfg.key_query_shared_bottleneck, cfg.use_bottleneck_attention,
            cfg.num_feedforward_networks, cfg.pooler) == expected
    assert (cfg.block, cfg.embedding_width, cfg.true_hidden_size, cfg.head_dim) == ("mobilebert", 16, 16, 8)
    batch, ref = _batch_and_reference(hf_model)
    check_parity(f"mobilebert {variant}", cfg, params, batch, ref)
    ours = jax.device_get(bert_model.BertForPreTraining(cfg).apply({"params": params}, **batch))
    np.testing.assert_allclose(ours["nsp_logits"], ref["out"].seq_relationship_logits.numpy(), rtol=0, atol=ATOL)


def test_round_trip_and_masked_lm_class(mobilebert, tmp_path):
    """HF -> bertjax -> HF bit for bit (MobileBertForPreTraining loads the directory with nothing missing), and
    the masked-LM class alone (no pooler, no NSP head) computing bertjax's logits."""
    variant, hf_model, directory = mobilebert
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    check_round_trip(hf_model, cfg, params, "mobilebert", tmp_path)
    hf.save_hf_checkpoint(tmp_path / "mlm", cfg, params, masked_lm_only=True)
    loaded, info = transformers.MobileBertForMaskedLM.from_pretrained(tmp_path / "mlm", output_loading_info=True,
                                                                      attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch, _ = _batch_and_reference(hf_model)
    theirs = hf_reference(loaded.eval(), batch, token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long))
    ours = jax.device_get(bert_model.BertForPreTraining(cfg).apply({"params": params}, **batch))
    np.testing.assert_allclose(ours["mlm_logits"], theirs["mlm_logits"], rtol=0, atol=ATOL)


def test_bertjax_params_export_to_transformers_with_equal_logits(mobilebert, tmp_path):
    """The other direction: a bertjax MobileBERT's own params (noise of its init's shapes, from its config alone)
    written by save_hf_checkpoint compute the same MLM and NSP logits in MobileBertForPreTraining."""
    variant, hf_model, _ = mobilebert
    cfg = hf.config_from_hf(hf_model.config.to_dict())
    net = bert_model.BertForPreTraining(cfg)
    shapes = jax.eval_shape(net.init, jax.random.key(0), **bert_model.dummy_batch(1, SEQ, 3))["params"]
    rng = np.random.default_rng(5)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: np.asarray((1.0 if "scale" in jax.tree_util.keystr(path) else 0.0)
                                   + 0.05 * rng.standard_normal(x.shape), np.float32), nn.meta.unbox(shapes))
    hf.save_hf_checkpoint(tmp_path, cfg, params)
    theirs, info = transformers.MobileBertForPreTraining.from_pretrained(tmp_path, output_loading_info=True,
                                                                         attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    batch, ref = _batch_and_reference(theirs.eval(), seed=6)
    ours = jax.device_get(bert_model.BertForPreTraining(cfg).apply({"params": params}, **batch))
    np.testing.assert_allclose(ours["mlm_logits"], ref["mlm_logits"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(ours["nsp_logits"], ref["out"].seq_relationship_logits.numpy(), rtol=0, atol=ATOL)


def test_scanned_load_stacks_the_layers_and_computes_transformers_outputs(mobilebert):
    variant, hf_model, directory = mobilebert
    cfg, params, _ = hf.load_hf_checkpoint(directory)
    scanned_cfg, scanned, _ = hf.load_hf_checkpoint(directory, {"scan_layers": True})
    assert sorted(scanned["bert"]["encoder"]) == ["layers"]
    exported = hf.params_to_hf(scanned, scanned_cfg)
    for name, x in hf.params_to_hf(params, cfg).items():
        np.testing.assert_array_equal(exported[name], x, err_msg=name)
    batch, ref = _batch_and_reference(hf_model)
    check_parity(f"mobilebert {variant} (scanned)", scanned_cfg, scanned, batch, ref)


@pytest.mark.parametrize("kind", ["classification", "span"])
def test_tanh_pooler_heads_both_ways(kind, tmp_path):
    """The layer_norm variant's heads (classifier_activation: model.pooler="tanh"; test_family_heads has every
    kind with the published "first"): bertjax -> HF with equal logits, and HF's task model back bit for bit."""
    labels = {"num_labels": 3} if kind == "classification" else {}
    config = transformers.MobileBertConfig(**VARIANTS["layer_norm"], **labels, attn_implementation="eager")
    cfg = hf.config_from_hf(config.to_dict())
    params = random_head(cfg, kind)
    hf.save_hf_head(tmp_path / "out", cfg, params, kind)
    task_class = getattr(transformers, hf.FAMILIES["mobilebert"].task_classes[kind].architecture)
    theirs, info = task_class.from_pretrained(tmp_path / "out", output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = make_inputs(kind, cfg.vocab_size, segments=True)
    assert_logits_equal(bertjax_logits(cfg, kind, params, batch), hf_logits(theirs.eval(), kind, batch, True), kind,
                        batch)

    torch.manual_seed(0)
    hf_model = randomize(task_class(config), seed=7)
    loaded, missing = hf.hf_to_head_params({k: v.numpy() for k, v in hf_model.state_dict().items()}, cfg, kind)
    # The span class has no pooler: bertjax's (tanh) is fresh, and unused.
    assert missing == ([] if kind == "classification" else ["bert/pooler/bias", "bert/pooler/kernel"])
    assert_logits_equal(bertjax_logits(cfg, kind, loaded, batch), hf_logits(hf_model, kind, batch, True), kind, batch)
    state = hf.head_params_to_hf(loaded, cfg, kind)
    for name, x in hf_model.state_dict().items():
        np.testing.assert_array_equal(state[name], x.numpy(), err_msg=name)


# google/mobilebert-uncased's config.json, as published.
PUBLISHED = {"attention_probs_dropout_prob": 0.1, "classifier_activation": False, "embedding_size": 128,
             "hidden_act": "relu", "hidden_dropout_prob": 0.0, "hidden_size": 512, "initializer_range": 0.02,
             "intermediate_size": 512, "intra_bottleneck_size": 128, "key_query_shared_bottleneck": True,
             "max_position_embeddings": 512, "model_type": "mobilebert", "normalization_type": "no_norm",
             "num_attention_heads": 4, "num_feedforward_networks": 4, "num_hidden_layers": 24, "pad_token_id": 0,
             "trigram_input": True, "true_hidden_size": 128, "type_vocab_size": 2, "use_bottleneck": True,
             "use_bottleneck_attention": False, "vocab_size": 30522}


def test_configs_mobilebert_is_the_published_network_and_writes_it_back():
    """configs/mobilebert.py's model section is what google/mobilebert-uncased's config.json reads as (so its
    weights start a run exactly), and what it writes back reads the same in transformers."""
    ours = BertConfig.from_dict(mobilebert_config.get_config().model.to_dict(), platform="cpu")
    published = hf.config_from_hf(PUBLISHED)
    architecture = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "embedding_size",
                    "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_dropout_rate")
    options = [f.name for f in dataclasses.fields(BertConfig) if f.metadata["family"]] + list(architecture)
    assert {k: getattr(ours, k) for k in options} == {k: getattr(published, k) for k in options}
    written = transformers.MobileBertConfig(**json.loads(json.dumps(hf.config_to_hf(ours))))
    for key, value in PUBLISHED.items():
        assert getattr(written, key) == value, key
