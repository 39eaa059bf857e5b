"""bertjax.interop.hf on the BERT family against transformers itself: numerical parity with
BertForPreTraining (PyTorch), the readers (safetensors, sharded, pytorch_model.bin without torch),
bit-exact round trips, and the failures a wrong checkpoint must produce.

The reference models are randomly initialised, then every parameter (biases and LayerNorm included,
which HF initialises to constants) is overwritten with noise, so that a wrong transpose, reshape or
name in the table shows up in the outputs.
"""

import collections
import dataclasses
import functools
import json
import os
import pickle
import re
import shutil

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from bertjax.interop import hf, hf_files
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig

ATOL = 1e-5

# Hugging Face configs of the reference models: the brief's two shapes and one with small heads (D=4),
# a short position table and another LayerNorm epsilon.
HF_SHAPES = {
    "L2_H64": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=256, vocab_size=99),
    "L3_H96_T3": dict(num_hidden_layers=3, hidden_size=96, num_attention_heads=4, intermediate_size=128,
                      vocab_size=211, type_vocab_size=3),
    "L4_H32_D4": dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=8, intermediate_size=48,
                      vocab_size=37, max_position_embeddings=24, layer_norm_eps=1e-6),
}


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def make_hf_model(shape: dict, seed: int = 0, cls=transformers.BertForPreTraining, **kwargs):
    config = transformers.BertConfig(**shape, attn_implementation="eager")
    torch.manual_seed(seed)
    hf_model = cls(config, **kwargs).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters lists tied parameters (decoder weight/bias) once, so ties survive.
        for name, p in hf_model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if "LayerNorm.weight" in name else 0.05 * noise)
    return hf_model


def make_batch(shape: dict, seed: int = 0) -> dict:
    """Three right-padded sequences of different lengths, two segments (three where the config has
    them), three masked-LM predictions per row of which the last row's third is padding (weight 0)."""
    rng = np.random.default_rng(seed)
    vocab, types = shape["vocab_size"], shape.get("type_vocab_size", 2)
    lengths, seq = np.array([12, 7, 4]), 12
    input_mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)  # [B, S]
    input_ids = rng.integers(1, vocab, size=(3, seq)).astype(np.int32) * input_mask
    segment_ids = (np.arange(seq)[None, :] >= lengths[:, None] // 2).astype(np.int32) * input_mask
    segment_ids[0, -2:] = types - 1  # the largest segment id the config allows
    positions = np.stack([np.sort(rng.choice(np.arange(1, n), size=3, replace=False)) for n in lengths])
    weights = np.ones((3, 3), np.float32)
    positions[2, 2], weights[2, 2] = 0, 0.0  # a padding prediction
    return {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "input_mask": input_mask,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_weights": weights,
        "masked_lm_ids": rng.integers(0, vocab, size=(3, 3)).astype(np.int32),
        "next_sentence_labels": np.array([0, 1, 0], np.int32),
    }


def hf_outputs(hf_model, batch: dict) -> dict:
    """The reference numbers, in bertjax's output naming, gathered like bertjax gathers them."""
    ids, seg, mask = (torch.as_tensor(batch[k], dtype=torch.long) for k in ("input_ids", "segment_ids", "input_mask"))
    # HF labels: -100 everywhere except at the real (weight 1) predictions.
    labels = torch.full(ids.shape, -100, dtype=torch.long)
    for b, p in zip(*np.nonzero(batch["masked_lm_weights"])):
        labels[b, batch["masked_lm_positions"][b, p]] = int(batch["masked_lm_ids"][b, p])
    with torch.no_grad():
        bert = hf_model.bert if hasattr(hf_model, "bert") else hf_model
        base = bert(input_ids=ids, token_type_ids=seg, attention_mask=mask, output_hidden_states=True)
        out = {
            "sequence_output": base.last_hidden_state.numpy(),
            "pooled_output": None if base.pooler_output is None else base.pooler_output.numpy(),
            "hidden_states": [h.numpy() for h in base.hidden_states],
        }
        if hasattr(hf_model, "cls"):
            heads = hf_model(input_ids=ids, token_type_ids=seg, attention_mask=mask, labels=labels,
                             next_sentence_label=torch.as_tensor(batch["next_sentence_labels"], dtype=torch.long))
            logits = heads.prediction_logits.numpy()  # [B, S, V]
            out["mlm_logits"] = np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
            out["nsp_logits"] = heads.seq_relationship_logits.numpy()
            out["loss"] = float(heads.loss)
    return out


@functools.lru_cache(maxsize=None)
def _bertjax_forward(cfg: BertConfig):
    """One compiled function per config (configs are hashable): compiling dominates these tests."""

    def forward(params, batch):
        inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
        # The heads and the loss come from the path training runs (heads_only: the last block only at
        # [CLS] and the masked rows); the per-position outputs from the full encoder.
        out = bert_model.BertForPreTraining(cfg).apply(
            {"params": params}, **inputs, masked_lm_positions=batch["masked_lm_positions"], heads_only=True)
        out.update(bert_model.BertModel(cfg).apply({"params": params["bert"]}, **inputs, output_hidden_states=True))
        out["loss"], _ = bert_model.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                                batch["masked_lm_weights"], batch["next_sentence_labels"])
        return out

    return jax.jit(forward)


def bertjax_outputs(cfg: BertConfig, params: dict, batch: dict) -> dict:
    out = jax.device_get(_bertjax_forward(cfg)(params, batch))
    out["loss"] = float(out["loss"])
    return out


def real(x: np.ndarray, batch: dict) -> np.ndarray:
    """The real (unpadded) positions of a [B, S, ...] array, flattened: padding outputs mean nothing."""
    return x[batch["input_mask"].astype(bool)]


def assert_parity(ours: dict, ref: dict, batch: dict, heads: bool = True):
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)  # noqa: E731
    close(real(ours["sequence_output"], batch), real(ref["sequence_output"], batch))
    close(ours["pooled_output"], ref["pooled_output"])
    assert len(ours["hidden_states"]) == len(ref["hidden_states"])
    for a, b in zip(ours["hidden_states"], ref["hidden_states"]):
        close(real(a, batch), real(b, batch))
    if heads:
        # Padding predictions (weight 0) sit at position 0 on both sides, so all P columns compare.
        close(ours["mlm_logits"], ref["mlm_logits"])
        close(ours["nsp_logits"], ref["nsp_logits"])
        # HF divides the MLM NLL by the count of labels, bertjax by (sum of weights + 1e-5).
        np.testing.assert_allclose(ours["loss"], ref["loss"], rtol=1e-5)


def max_difference(a: dict, b: dict, batch: dict) -> float:
    return float(max(np.abs(real(a["sequence_output"], batch) - real(b["sequence_output"], batch)).max(),
                     np.abs(a["mlm_logits"] - b["mlm_logits"]).max()))


def write_torch_checkpoint(directory, hf_model):
    """config.json + pytorch_model.bin: transformers 5 has no way left to write .bin itself
    (save_pretrained(safe_serialization=False) is accepted and ignored), so torch.save it."""
    directory.mkdir(parents=True, exist_ok=True)
    hf_model.config.to_json_file(str(directory / "config.json"))
    torch.save(hf_model.state_dict(), directory / "pytorch_model.bin")
    return directory


@pytest.fixture(scope="module", params=sorted(HF_SHAPES))
def reference(request, tmp_path_factory):
    """A saved random HF BertForPreTraining of one shape, its batch and its outputs."""
    shape = HF_SHAPES[request.param]
    hf_model = make_hf_model(shape)
    directory = tmp_path_factory.mktemp(request.param)
    hf_model.save_pretrained(directory)
    batch = make_batch(shape)
    return dict(shape=shape, hf_model=hf_model, dir=directory, batch=batch, outputs=hf_outputs(hf_model, batch))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The first shape only, for the tests that need one model rather than each."""
    shape = HF_SHAPES["L2_H64"]
    hf_model = make_hf_model(shape, seed=1)
    directory = tmp_path_factory.mktemp("small")
    hf_model.save_pretrained(directory)
    batch = make_batch(shape, seed=1)
    return dict(shape=shape, hf_model=hf_model, dir=directory, batch=batch, outputs=hf_outputs(hf_model, batch))


# --------------------------------------------------------------------------------------------------
# Parity
# --------------------------------------------------------------------------------------------------


def test_parity_with_transformers(reference):
    cfg, params, missing = hf.load_hf_checkpoint(reference["dir"])
    assert missing == []
    assert cfg.num_layers == reference["shape"]["num_hidden_layers"]
    assert_parity(bertjax_outputs(cfg, params, reference["batch"]), reference["outputs"], reference["batch"])


def test_parity_scanned_layers(reference):
    cfg, params, _ = hf.load_hf_checkpoint(reference["dir"], {"scan_layers": True})
    assert cfg.scan_layers and "layers" in params["bert"]["encoder"]
    assert params["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"].shape[0] == cfg.num_layers
    assert_parity(bertjax_outputs(cfg, params, reference["batch"]), reference["outputs"], reference["batch"])


def test_parity_from_pytorch_bin(small, tmp_path):
    directory = write_torch_checkpoint(tmp_path / "bin", small["hf_model"])
    assert not (directory / "model.safetensors").exists()
    cfg, params, missing = hf.load_hf_checkpoint(directory)
    assert missing == []
    assert_parity(bertjax_outputs(cfg, params, small["batch"]), small["outputs"], small["batch"])
    # The same numbers as from the safetensors file, bit for bit.
    _, from_safetensors, _ = hf.load_hf_checkpoint(small["dir"])
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, from_safetensors)


@pytest.mark.parametrize("pooler", [True, False])
def test_bert_model_checkpoint_lacks_heads(small, tmp_path, pooler):
    hf_model = make_hf_model(small["shape"], seed=2, cls=transformers.BertModel, add_pooling_layer=pooler)
    hf_model.save_pretrained(tmp_path)
    names = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
    assert not any(name.startswith(("bert.", "cls.")) for name in names)  # BertModel naming: no prefix

    cfg, params, missing = hf.load_hf_checkpoint(tmp_path)
    heads = ["mlm_head/layer_norm/bias", "mlm_head/layer_norm/scale", "mlm_head/output_bias",
             "mlm_head/transform/bias", "mlm_head/transform/kernel", "nsp_head/bias", "nsp_head/kernel"]
    assert sorted(missing) == sorted(heads + ([] if pooler else ["bert/pooler/bias", "bert/pooler/kernel"]))
    # The fresh heads have the model's init: LayerNorm scale 1, biases 0, kernels ~ N(0, 0.02).
    np.testing.assert_array_equal(params["mlm_head"]["layer_norm"]["scale"], 1.0)
    assert 0.01 < params["nsp_head"]["kernel"].std() < 0.03

    batch = small["batch"]
    ours, ref = bertjax_outputs(cfg, params, batch), hf_outputs(hf_model, batch)
    if not pooler:  # HF has no pooled output to compare then
        ref["pooled_output"] = ours["pooled_output"]
    assert_parity(ours, ref, batch, heads=False)


# --------------------------------------------------------------------------------------------------
# Round trips and the other readers
# --------------------------------------------------------------------------------------------------


def test_round_trip_is_bit_exact_and_loads_in_transformers(small, tmp_path):
    original = safetensors.numpy.load_file(str(small["dir"] / "model.safetensors"))
    for scan in (False, True):
        cfg, params, _ = hf.load_hf_checkpoint(small["dir"], {"scan_layers": scan})
        exported = hf.params_to_hf(params, cfg)
        assert sorted(exported) == sorted(original)
        for name, x in original.items():
            assert exported[name].dtype == x.dtype and exported[name].shape == x.shape, name
            np.testing.assert_array_equal(exported[name], x, err_msg=name)

    vocab = tmp_path / "vocab.in.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]) + "\n")
    out = tmp_path / "exported"
    hf.save_hf_checkpoint(out, cfg, params, vocab_path=vocab)
    written = safetensors.numpy.load_file(str(out / "model.safetensors"))
    assert sorted(written) == sorted(original)
    assert all(np.array_equal(written[k], original[k]) for k in original)
    assert (out / "vocab.txt").read_bytes() == vocab.read_bytes()

    reloaded, info = transformers.BertForPreTraining.from_pretrained(
        out, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reloaded.eval()
    # Ties restored by transformers: the decoder is the word-embedding matrix.
    word_embeddings = reloaded.bert.embeddings.word_embeddings.weight
    assert reloaded.cls.predictions.decoder.weight.data_ptr() == word_embeddings.data_ptr()
    again = hf_outputs(reloaded, small["batch"])
    for key in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_array_equal(again[key], small["outputs"][key])
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.convert_tokens_to_ids(["[CLS]", "w3"]) == [2, 8]


def test_sharded_safetensors(small, tmp_path):
    small["hf_model"].save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    _, sharded, _ = hf.load_hf_checkpoint(tmp_path)
    _, single, _ = hf.load_hf_checkpoint(small["dir"])
    jax.tree_util.tree_map(np.testing.assert_array_equal, sharded, single)

    # Sharded pytorch_model.bin, as older transformers wrote large models: same index format.
    bins = tmp_path / "bins"
    bins.mkdir()
    shutil.copy(small["dir"] / "config.json", bins / "config.json")
    state = small["hf_model"].state_dict()
    weight_map = {}
    for shard, names in enumerate([list(state)[::2], list(state)[1::2]]):
        torch.save({n: state[n] for n in names}, bins / f"pytorch_model-0000{shard + 1}-of-00002.bin")
        weight_map.update({n: f"pytorch_model-0000{shard + 1}-of-00002.bin" for n in names})
    (bins / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _, from_bins, _ = hf.load_hf_checkpoint(bins)
    jax.tree_util.tree_map(np.testing.assert_array_equal, from_bins, single)


def test_legacy_names_and_tied_decoder(small):
    """gamma/beta LayerNorm names (checkpoints converted from TF) and a written-out tied decoder."""
    state = safetensors.numpy.load_file(str(small["dir"] / "model.safetensors"))
    cfg = hf.config_from_hf(small["hf_model"].config.to_dict())
    expected, _ = hf.hf_to_params(state, cfg)
    legacy = {re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", k)): v
              for k, v in state.items()}
    legacy["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    legacy["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    legacy["bert.embeddings.position_ids"] = np.arange(512)[None]  # a buffer: ignored
    params, missing = hf.hf_to_params(legacy, cfg)
    assert missing == []
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, expected)

    untied = dict(legacy, **{"cls.predictions.decoder.weight": legacy["cls.predictions.decoder.weight"] + 1})
    with pytest.raises(ValueError, match=re.escape("'cls.predictions.decoder.weight'")):
        hf.hf_to_params(untied, cfg)


def test_torch_reader_without_torch_semantics(tmp_path):
    """Storages of several dtypes, shared storages, offsets, strides and Parameters read as torch does."""
    base = torch.randn(4, 6)
    state = collections.OrderedDict(
        f32=base,
        transposed=base.t(),  # strided view of the same storage
        row=base[2],  # offset into it
        f16=torch.randn(3, 5).half(),
        bf16=torch.randn(5, 3).bfloat16(),
        param=torch.nn.Parameter(torch.randn(7)),
        ids=torch.arange(10),
    )
    torch.save(state, tmp_path / "x.bin")
    read = hf_files.read_torch_state_dict(tmp_path / "x.bin")
    assert sorted(read) == sorted(state)
    for name, tensor in state.items():
        expected = tensor.detach().float().numpy() if tensor.dtype == torch.bfloat16 else tensor.detach().numpy()
        assert read[name].shape == tuple(tensor.shape), name
        np.testing.assert_array_equal(np.asarray(read[name], expected.dtype), expected, err_msg=name)
    assert str(read["bf16"].dtype) == "bfloat16" and read["f16"].dtype == np.float16

    torch.save(state, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="re-save it with a recent torch"):
        hf_files.read_torch_state_dict(tmp_path / "old.bin")


class _Payload:
    """An object whose unpickling would run a command: the reader must refuse before calling it."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_torch_reader_refuses_arbitrary_classes(tmp_path):
    torch.save({"x": torch.zeros(2), "y": _Payload()}, tmp_path / "evil.bin")
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        hf_files.read_torch_state_dict(tmp_path / "evil.bin")
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")


# --------------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------------


def test_wrong_shape_names_the_tensor(small, tmp_path):
    state = safetensors.numpy.load_file(str(small["dir"] / "model.safetensors"))
    name = "bert.encoder.layer.1.intermediate.dense.weight"  # [F, H] = [256, 64]
    state[name] = np.ascontiguousarray(state[name].T)
    shutil.copy(small["dir"] / "config.json", tmp_path / "config.json")
    safetensors.numpy.save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as error:
        hf.load_hf_checkpoint(tmp_path)
    message = str(error.value)
    assert "\n" not in message and repr(name) in message and "(256, 64)" in message and "(64, 256)" in message

    # A config that disagrees with the weights (another head count changes no HF shape, the
    # intermediate size does) fails the same way, naming the first tensor it meets.
    with pytest.raises(ValueError, match=re.escape("'bert.encoder.layer.0.intermediate.dense.weight'")):
        hf.hf_to_params(safetensors.numpy.load_file(str(small["dir"] / "model.safetensors")),
                        hf.config_from_hf({**small["hf_model"].config.to_dict(), "intermediate_size": 128}))


def test_missing_encoder_tensor_fails(small):
    state = safetensors.numpy.load_file(str(small["dir"] / "model.safetensors"))
    del state["bert.encoder.layer.1.attention.self.key.bias"]
    with pytest.raises(ValueError, match=re.escape("'bert.encoder.layer.1.attention.self.key.bias'")):
        hf.hf_to_params(state, hf.config_from_hf(small["hf_model"].config.to_dict()))


def test_config_conversion():
    hf_config = transformers.BertConfig(
        **HF_SHAPES["L3_H96_T3"], hidden_dropout_prob=0.2, layer_norm_eps=1e-7).to_dict()
    cfg = hf.config_from_hf(hf_config, scan_layers=True)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.type_vocab_size) == (3, 96, 4, 3)
    assert (cfg.hidden_dropout_rate, cfg.layer_norm_eps, cfg.scan_layers) == (0.2, 1e-7, True)
    assert hf.config_from_hf(hf.config_to_hf(cfg), scan_layers=True) == cfg
    exported = transformers.BertConfig(**hf.config_to_hf(cfg))
    assert (exported.num_hidden_layers, exported.hidden_act, exported.layer_norm_eps) == (3, "gelu", 1e-7)

    for key, value in [("hidden_act", "gelu_new"), ("position_embedding_type", "relative_key"),
                       ("model_type", "gpt2")]:  # a model type of no family bertjax reads
        with pytest.raises(ValueError, match=re.escape(repr(value))):
            hf.config_from_hf({**hf_config, key: value})
    with pytest.raises(ValueError, match="num_layerz"):
        hf.config_from_hf(hf_config, num_layerz=2)
    # The weights fix the network: an override may set how it computes (scan_layers, dtype), not what it is.
    with pytest.raises(ValueError, match=r"the overrides \['num_layers', 'pre_layer_norm'\] contradict"):
        hf.config_from_hf(hf_config, num_layers=4, pre_layer_norm=True)


# --------------------------------------------------------------------------------------------------
# The parity check has teeth
# --------------------------------------------------------------------------------------------------


def test_parity_check_detects_small_mistakes(small):
    cfg, params, _ = hf.load_hf_checkpoint(small["dir"])
    batch, ref = small["batch"], small["outputs"]
    assert max_difference(bertjax_outputs(cfg, params, batch), ref, batch) < ATOL

    # One square weight transposed: what a missing .T in one table row would do.
    kernel = params["bert"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]  # [H, N, D]
    h = kernel.shape[0]
    wrong = jax.tree_util.tree_map(lambda x: x, params)
    wrong["bert"]["encoder"]["layers_0"]["attention"]["query"]["kernel"] = kernel.reshape(h, h).T.reshape(kernel.shape)
    assert max_difference(bertjax_outputs(cfg, wrong, batch), ref, batch) > 1e-4

    # LayerNorm epsilon 1e-5 instead of BERT's 1e-12.
    eps = dataclasses.replace(cfg, layer_norm_eps=1e-5)
    assert max_difference(bertjax_outputs(eps, params, batch), ref, batch) > 1e-4
