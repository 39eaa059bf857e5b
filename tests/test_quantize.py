"""int8 quantisation for inference (bertjax/compression/quantize.py, qwix): weight-only int8 equals the
float network run with kernels quantised and dequantised by hand in numpy; both modes keep the logits
and predictions of a classifier on real text; the int8 params export is >= 3.5x smaller in its dense
kernels (>= 3.3x as a whole file, the embedding tables int8 too) and loads back to the same outputs; the
int8 SavedModel serves the same logits; hf is refused in one line. Group-wise int4 / int8: the stored
weights are exactly a numpy rounding per group and the network runs them; int4-g32 keeps most
predictions; the int4 export is packed, half of int8's values; a misspelt mode is one line; a mixed
plan gives int8 to the layer whose int4 costs most (bertjax/runs/precision_plan.py)."""

import collections
import json
import os
import pathlib
import re

import flax.linen as nn
from flax import traverse_util
import jax
import numpy as np
import pytest

import bertjax
from bertjax.compression import quantize
from bertjax.runs import exporting
from bertjax import init_from as pretrained_files
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models import heads
from bertjax.training import checkpoint
from bertjax.training.checkpoint_meta import CheckpointMeta
from conftest import shared_directory
from test_finetune import keyword_sentences  # real sentences of the demo corpus, half with the keyword

LABELS = ["no", "yes"]


def keyword_classifier(root, rows, max_seq_length: int = 48) -> str:
    """A fine-tuning workdir for the keyword task, written directly: a word-level vocabulary of the texts,
    a small BERT drawn at random with a wide initializer (weights of std 0.2, so that its pooled outputs
    differ from text to text as a trained encoder's do, unlike the near-constant ones of std 0.02), and a
    classifier fitted by ridge regression to the training rows' pooled outputs. Returns its directory."""
    words = collections.Counter(w for text, _ in rows for w in re.findall(r"\w+|[^\w\s]", text.lower()))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w, _ in words.most_common(1500)]
    workdir = pathlib.Path(root) / "classifier"
    workdir.mkdir(parents=True)
    (workdir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=64, num_layers=2, num_heads=2,
                                intermediate_size=128, max_position_embeddings=64, initializer_range=0.2)
    net = heads.network("classification", cfg, 2)
    params = jax.jit(net.init)(jax.random.key(0), **heads.dummy_inputs("classification", 1, 8))["params"]
    params = jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))
    encoder = bert_model.BertModel(cfg)
    tokenizer = pretrained_files.TokenizerFiles("wordpiece", str(workdir / "vocab.txt"), True).load()
    train = rows[: len(rows) * 3 // 4]
    ids, mask = _tokenize(tokenizer, [text for text, _ in train], max_seq_length)
    pooled = np.asarray(jax.jit(lambda p, i, m: encoder.apply({"params": p}, i, i * 0, m)["pooled_output"])(
        params["bert"], ids, mask))  # [N, H]
    targets = np.where(np.array([[label == name for name in LABELS] for _, label in train]), 1.0, -1.0)  # [N, 2]
    design = np.concatenate([pooled, np.ones((len(pooled), 1), np.float32)], axis=1)
    solution = np.linalg.solve(design.T @ design + 0.01 * len(design) * np.eye(design.shape[1]), design.T @ targets)
    params["classifier"] = {"kernel": solution[:-1].astype(np.float32), "bias": solution[-1].astype(np.float32)}
    meta = {"step": 1, "model": cfg.__dict__,
            "tokenizer": {"kind": "wordpiece", "path": "vocab.txt", "lower_case": True},
            "task": {"name": "classification", "kind": "classification", "labels": LABELS, "num_choices": None,
                     "max_seq_length": max_seq_length}}
    checkpoint.save_params(str(workdir), checkpoint.BEST_DIR, 1, params, CheckpointMeta.from_json(meta))
    return str(workdir)


def _tokenize(tokenizer, texts, length):
    """[CLS] text [SEP], cut and padded to length: input_ids and input_mask [B, S]."""
    ids = np.zeros((len(texts), length), np.int32)
    for b, row in enumerate(tokenizer.encode(list(texts))):
        row = [tokenizer.cls_id, *row[: length - 2], tokenizer.sep_id]
        ids[b, : len(row)] = row
    return ids, (ids != 0).astype(np.int32)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """The keyword task's classifier (keyword_classifier), the float model, its params and the dev features."""
    rows = keyword_sentences()[:400]
    # Made once per test run (tests/test_compression_report.py reads it too); read-only.
    workdir = str(shared_directory(tmp_path_factory, "keyword-classifier", lambda root: keyword_classifier(root, rows))
                  / "classifier")
    float_model = bertjax.load(workdir)
    params, _ = checkpoint.restore_params(os.path.join(workdir, checkpoint.BEST_DIR))
    dev = rows[len(rows) * 3 // 4:]
    return dict(workdir=workdir, cfg=float_model.config, params=jax.device_get(params), float=float_model,
                features=classification_features(float_model, [text for text, _ in dev]),
                labels=[LABELS.index(label) for _, label in dev])


def classification_features(model, texts):
    from bertjax.tasks.kinds import classification

    return classification.encode_texts(model, texts)


def by_hand_int8(params):
    """Every dense kernel quantised per output channel, symmetric int8, in numpy: scale = max |w| over
    the contracted axes / 127.5 (qwix's int8 bound: the top bucket whole), q = clip(round(w / scale),
    -128, 127); every embedding table the same way per row. Returns {path: (q, scale)} for each kernel
    ("a/b/kernel") and table ("a/b/embedding")."""
    out = {}
    for path, w in traverse_util.flatten_dict(params, sep="/").items():
        if path.endswith("/embedding"):  # a table [V, E]: one scale per row
            w = np.asarray(w, np.float32)
            scale = np.max(np.abs(w), axis=1, keepdims=True) / np.float32(127.5)
            out[path] = (np.clip(np.round(w / scale), -128, 127), scale)
        if path.endswith("/kernel"):
            # The attention output's kernel [N, D, H] contracts its first two axes; the others [in, ...] one.
            contracted = (0, 1) if path.endswith("attention/output/kernel") else (0,)
            w = np.asarray(w, np.float32)
            scale = np.max(np.abs(w), axis=contracted, keepdims=True) / np.float32(127.5)
            out[path] = (np.clip(np.round(w / scale), -128, 127), scale)
    return out


def float_logits(cfg, params, feats):
    net = heads.network("classification", cfg, 2)
    apply = jax.jit(lambda p, ids, segments, mask: net.apply({"params": p}, ids, segments, mask, deterministic=True))
    return np.asarray(apply(params, feats["input_ids"], feats["segment_ids"], feats["input_mask"]))


@pytest.fixture(scope="module")
def int8_models(classifier):
    return {mode: bertjax.load(classifier["workdir"], quantize=mode) for mode in ("int8-weights", "int8-dynamic")}


def test_weight_only_int8_is_the_float_network_with_kernels_rounded_by_hand(classifier, int8_models):
    model = int8_models["int8-weights"]
    assert "int8-weights" in repr(model)
    stored = traverse_util.flatten_dict(jax.device_get(model.params), sep="/")
    weights = traverse_util.flatten_dict(classifier["params"], sep="/")
    hand = by_hand_int8(classifier["params"])
    assert sorted(hand) == sorted([k[: -len("/qvalue")] for k in stored if k.endswith("/qvalue")]
                                  + [k[: -len("/qrows")] for k in stored if k.endswith("/qrows")])
    dequantised = dict(weights)
    for path, (q, scale) in hand.items():
        values, scales = ("qrows", "row_scale") if path.endswith("/embedding") else ("qvalue", "scale")
        qvalue, stored_scale = np.asarray(stored[f"{path}/{values}"]), np.asarray(stored[f"{path}/{scales}"])
        assert qvalue.dtype == np.int8 and stored_scale.shape == scale.shape
        np.testing.assert_allclose(stored_scale, scale, rtol=1e-6)
        # The same integers, but where a channel's extreme lands on -127.5 and float rounding of w / scale
        # decides between -127 and -128.
        differ = q != qvalue
        reduced = tuple(axis for axis, size in enumerate(scale.shape) if size == 1)  # where the scale is one
        extreme = np.abs(np.asarray(weights[path])) == np.max(np.abs(weights[path]), axis=reduced, keepdims=True)
        assert np.all(np.abs(q - qvalue) <= 1) and np.all(extreme[differ]), path
        dequantised[path] = qvalue.astype(np.float32) * scale
    # The float network with the dequantised kernels and tables: equal to float32 rounding (qwix
    # dequantises inside the compiled function, the reference before it). 1e-4 is far below one int8
    # step's effect.
    feats = classifier["features"]
    logits = model.task_logits(feats)
    reference = float_logits(classifier["cfg"], traverse_util.unflatten_dict(dequantised, sep="/"), feats)
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    assert np.abs(logits - classifier["float"].task_logits(feats)).max() > 1e-3  # and int8 is not float
    assert model.params["bert"]["embeddings"]["word_embeddings"]["embedding"]["qrows"].dtype == np.int8


def test_both_int8_modes_keep_the_logits_and_the_predictions(classifier, int8_models):
    feats, labels = classifier["features"], np.array(classifier["labels"])
    reference = classifier["float"].task_logits(feats)
    float_accuracy = np.mean(reference.argmax(-1) == labels)
    for mode, model in int8_models.items():
        logits = model.task_logits(feats)
        # This random encoder (weights of std 0.2) amplifies rounding more than a trained one: int8 moves
        # its logits by 7% (weight-only) and 9% (dynamic) of their norm here, and keeps 97-98% of its
        # predictions. The bounds leave room above those; a wrong scale axis or an unscaled kernel moves the
        # logits by 100% and more.
        relative = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
        assert relative < 0.15, (mode, relative)
        assert np.mean(logits.argmax(-1) == reference.argmax(-1)) >= 0.9, mode
        assert abs(np.mean(logits.argmax(-1) == labels) - float_accuracy) <= 0.05, mode
    # The encoder of a quantised model runs int8 too (encode reads the same params).
    texts = ["The function returns a list of the lines.", "short"]
    q, f = int8_models["int8-dynamic"].encode(texts), classifier["float"].encode(texts)
    assert not np.array_equal(q["pooled_output"], f["pooled_output"])
    assert np.linalg.norm(q["pooled_output"] - f["pooled_output"]) / np.linalg.norm(f["pooled_output"]) < 0.05


def test_the_int8_params_export_is_smaller_and_loads_back_the_same(classifier, int8_models, tmp_path):
    plain = exporting.export(classifier["workdir"], str(tmp_path / "float"), "params")
    int8 = exporting.export(classifier["workdir"], str(tmp_path / "int8"), "params", quantize="int8")
    flat_float, flat_int8 = dict(np.load(f"{plain}/params.npz")), dict(np.load(f"{int8}/params.npz"))
    kernels = sorted(k for k in flat_float if k.endswith("/kernel"))
    assert kernels and all(flat_int8[k + "/qvalue"].dtype == np.int8 for k in kernels)
    float_bytes = sum(flat_float[k].nbytes for k in kernels)
    int8_bytes = sum(flat_int8[k + "/qvalue"].nbytes + flat_int8[k + "/scale"].nbytes for k in kernels)
    assert float_bytes / int8_bytes >= 3.5
    tables = sorted(k for k in flat_float if k.endswith("/embedding"))
    assert len(tables) == 3 and all(flat_int8[k + "/qrows"].dtype == np.int8 for k in tables)
    # The whole file: kernels and tables int8; biases, norms, scales and the archive's headers float32 or
    # as they were. At this model's hidden size of 64 a table's row scales are 1/16 of its int8 bytes, and
    # the file is 3.39x smaller (docs/performance.md has the figures of trained models).
    assert os.path.getsize(f"{plain}/params.npz") / os.path.getsize(f"{int8}/params.npz") >= 3.3
    assert json.loads(open(f"{int8}/config.json").read())["quantize"] == "int8-dynamic"  # what "int8" means
    # Read back: the same int8 weights as quantising on load, run in the mode it was exported with, or
    # weight-only on request.
    loaded = bertjax.load(int8)
    assert loaded.quantize == "int8-dynamic"
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(loaded.params),
                           jax.device_get(int8_models["int8-dynamic"].params))
    weight_only = bertjax.load(int8, quantize="int8-weights")
    feats = classifier["features"]
    np.testing.assert_array_equal(weight_only.task_logits(feats), int8_models["int8-weights"].task_logits(feats))
    # The float export reads back as the float params.
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(bertjax.load(plain).params),
                           classifier["params"])


def test_the_int8_savedmodel_serves_the_quantised_logits(classifier, int8_models, tmp_path):
    import tensorflow as tf

    # Weight-only: the served function is continuous in its inputs, so TF's compilation of it equals
    # JAX's to float rounding. (int8-dynamic serves too, but rounds its activations, where the two
    # compilations' last-bit differences land on different sides of a rounding point now and then.)
    out = exporting.export(classifier["workdir"], str(tmp_path / "serving"), "savedmodel", quantize="int8-weights")
    served = tf.saved_model.load(out)
    assert any(v.dtype == tf.int8 for v in tf.nest.flatten(served.params))  # the kernels are stored as int8
    texts = ["It returns the value of the key.", "The module reads the file."]
    logits = served.signatures["predict"](texts=tf.constant(texts))["logits"].numpy()
    model = int8_models["int8-weights"]
    np.testing.assert_allclose(logits, model.task_logits(classification_features(model, texts)), atol=1e-5)


def test_mistakes_are_one_line(classifier, tmp_path):
    with pytest.raises(ValueError, match="transformers reads no int8 BERT format"):
        exporting.export(classifier["workdir"], str(tmp_path / "hf"), "hf", quantize="int8")
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ValueError, match="quantize='int4': choose one of int8, int8-weights, int8-dynamic"):
        bertjax.load(classifier["workdir"], quantize="int4")


def test_a_pretraining_checkpoint_quantises_its_heads_too(classifier, tmp_path):
    cfg = classifier["cfg"]
    net = bert_model.BertForPreTraining(cfg)
    params = jax.jit(net.init)(jax.random.key(2), **bert_model.dummy_batch(1, 8, 2))["params"]
    params = {**jax.device_get(nn.unbox(params)), "bert": classifier["params"]["bert"]}
    vocab = os.path.join(classifier["workdir"], "vocab.txt")
    meta = {"step": 1, "model": cfg.__dict__, "tokenizer": {"kind": "wordpiece", "path": vocab, "lower_case": True}}
    checkpoint.save_params(str(tmp_path), checkpoint.BEST_DIR, 1, params, CheckpointMeta.from_json(meta))
    model = bertjax.load(tmp_path, quantize="int8")
    assert model.params["mlm_head"]["transform"]["kernel"]["qvalue"].dtype == np.int8
    assert model.params["nsp_head"]["kernel"]["qvalue"].dtype == np.int8
    assert model.num_params() == bert_model.count_params(params)
    guesses = model.fill_mask("The function [MASK] a list.")
    assert len(guesses) == 5 and all(0 <= g["score"] <= 1 for g in guesses)


# ---------------------------------------------------------------------------------------------------
# Group-wise int4 / int8 (Q-BERT's group-wise quantisation)
# ---------------------------------------------------------------------------------------------------


def by_hand_grouped(params, bits: int, group: int) -> dict:
    """Every dense kernel quantised symmetric per group, in numpy: its contracted axes (the leading ones:
    two for the attention output's [N, D, H], one for the others) read flattened as W inputs; per output
    channel, groups of g = min(group, W) consecutive inputs; scale = max |w| over the group / qmax (qwix's
    bound, the top bucket whole: 7.5 for int4, 127.5 for int8); q = clip(round(w / scale), -2^(b-1),
    2^(b-1) - 1). Each division as XLA's CPU compiler computes it, x × (1 / y) in float32 (it rewrites a
    division so; exact division would differ in a scale's last bit, and then by one step where w / scale
    lands on a half), so that the integers and scales are exactly qwix's. Returns {path: (q, scale)}, each
    [W / g, g, outputs] and [W / g, 1, outputs]."""
    qmax, low, high = 2 ** (bits - 1) - 0.5, -2 ** (bits - 1), 2 ** (bits - 1) - 1
    out = {}
    for path, w in traverse_util.flatten_dict(params, sep="/").items():
        if path.endswith("/kernel"):
            contracted = 2 if path.endswith("attention/output/kernel") else 1
            w = np.asarray(w, np.float32)
            width = int(np.prod(w.shape[:contracted]))
            g = min(group, width)
            groups = w.reshape(width // g, g, -1)
            scale = np.max(np.abs(groups), axis=1, keepdims=True) * np.float32(1 / qmax)
            out[path] = (np.clip(np.round(groups * (np.float32(1) / scale)), low, high), scale)
    return out


def unpacked(kernel: dict) -> np.ndarray:
    """A stored kernel's integers: qvalue as it is, or qpacked read in numpy (low nibble first, two's
    complement), its last axis the scale's."""
    if "qvalue" in kernel:
        return np.asarray(kernel["qvalue"])
    packed, n = np.asarray(kernel["qpacked"]), np.shape(kernel["scale"])[-1]
    assert packed.dtype == np.uint8
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)[..., :n].astype(np.int8)
    return np.where(nibbles >= 8, nibbles - 16, nibbles)


def dequantised(kernel: dict) -> np.ndarray:
    """q x scale, each scale repeated over its group."""
    q = unpacked(kernel).astype(np.float32)
    scale = np.asarray(kernel["scale"])
    for axis, (n, s) in enumerate(zip(q.shape, scale.shape)):
        scale = np.repeat(scale, n // s, axis=axis)
    return q * scale


@pytest.fixture(scope="module")
def grouped_models(classifier):
    return {mode: bertjax.load(classifier["workdir"], quantize=mode) for mode in ("int4-g32", "int8-g32")}


@pytest.mark.parametrize("mode,bits,group", [("int4-g32", 4, 32), ("int8-g32", 8, 32)])
def test_group_wise_weights_are_a_numpy_rounding_per_group(classifier, grouped_models, mode, bits, group):
    model = grouped_models[mode]
    assert mode in repr(model)
    stored = traverse_util.flatten_dict(jax.device_get(model.params), sep="/", is_leaf=lambda _, v: "scale" in v)
    hand = by_hand_grouped(classifier["params"], bits, group)
    reference = traverse_util.flatten_dict(classifier["params"], sep="/")
    assert sorted(hand) == sorted(k for k in stored if k.endswith("/kernel"))
    for path, (q, scale) in hand.items():
        kernel = stored[path]
        assert set(kernel) == ({"qpacked", "scale"} if bits == 4 else {"qvalue", "scale"}), path
        # The same groups (the stored scale holds as many per output channel), the same integers, exactly.
        assert np.asarray(kernel["scale"]).size == scale.size, path
        np.testing.assert_array_equal(dequantised(kernel), (q * scale).reshape(reference[path].shape), path)
        reference[path] = (q * scale).reshape(reference[path].shape)
    if bits == 8:
        return  # the network's run of grouped weights is checked once, on int4's
    # The network runs those weights: the float network with the numpy-dequantised kernels (and the tables,
    # int8 per row as in the int8 modes, dequantised from the stored rows) gives its logits to float32
    # rounding.
    tables = traverse_util.flatten_dict(jax.device_get(model.params), sep="/", is_leaf=lambda _, v: "qrows" in v)
    for path, table in tables.items():
        if path.endswith("/embedding"):
            reference[path] = np.asarray(table["qrows"], np.float32) * np.asarray(table["row_scale"])
    feats = classifier["features"]
    np.testing.assert_allclose(model.task_logits(feats),
                               float_logits(classifier["cfg"], traverse_util.unflatten_dict(reference, sep="/"), feats),
                               rtol=1e-4, atol=1e-4)


def test_inputs_that_do_not_split_into_groups_of_g_take_the_largest_group_that_splits_them(
        classifier, grouped_models, tmp_path, capsys):
    """int8-g48 on kernels of 64 and 128 inputs: groups of 32, the largest size up to 48 that splits both, so
    exactly int8-g32's weights (checked against numpy above); the export says so in one line."""
    model = bertjax.load(classifier["workdir"], quantize="int8-g48")
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(model.params),
                           jax.device_get(grouped_models["int8-g32"].params))
    smaller = quantize.smaller_groups(model.params, 48)
    kernels = [k for k in traverse_util.flatten_dict(classifier["params"], sep="/") if k.endswith("/kernel")]
    assert sorted(path for path, _ in smaller) == sorted(kernels) and {size for _, size in smaller} == {32}
    assert quantize.smaller_groups(grouped_models["int8-g32"].params, 32) == []
    exporting.export(classifier["workdir"], str(tmp_path / "g48"), "params", quantize="int8-g48")
    assert (f"quantize=int8-g48: {len(kernels)} kernels' inputs do not split into groups of 48"
            in capsys.readouterr().out)


def test_int4_g32_keeps_the_logits_and_the_predictions(classifier, grouped_models):
    feats, labels = classifier["features"], np.array(classifier["labels"])
    reference = classifier["float"].task_logits(feats)
    logits = grouped_models["int4-g32"].task_logits(feats)
    # int4's step is 16x int8's: with a scale per 32 inputs it moves this random encoder's logits (weights of
    # std 0.2, which amplify rounding more than a trained encoder's) by 53% of their norm and keeps 86% of
    # its predictions (int8 per channel: 6% and 98%; int8-g32: 4% and 99%; int4-g128: 90% and 68%), and
    # its accuracy on the keyword labels within 2 points (0.60 against 0.58). The bounds leave room above
    # those; that the weights are the right ones is the test above.
    relative = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
    agree = np.mean(logits.argmax(-1) == reference.argmax(-1))
    assert relative < 0.6 and agree >= 0.8, (relative, agree)
    assert abs(np.mean(logits.argmax(-1) == labels) - np.mean(reference.argmax(-1) == labels)) <= 0.05


def test_the_int4_export_is_packed_half_of_int8_and_loads_back_the_same(classifier, grouped_models, int8_models,
                                                                       tmp_path):
    int4 = exporting.export(classifier["workdir"], str(tmp_path / "int4"), "params", quantize="int4-g32")
    # The int8 model's params as the params export writes them (np.savez of the flattened tree).
    np.savez(tmp_path / "int8.npz", **traverse_util.flatten_dict(jax.device_get(int8_models["int8-weights"].params),
                                                                 sep="/"))
    flat8, flat4 = dict(np.load(tmp_path / "int8.npz")), dict(np.load(f"{int4}/params.npz"))
    kernels = sorted(k[: -len("/qvalue")] for k in flat8 if k.endswith("kernel/qvalue"))
    assert kernels == sorted(k[: -len("/qpacked")] for k in flat4 if k.endswith("kernel/qpacked"))
    values8 = sum(flat8[k + "/qvalue"].nbytes for k in kernels)
    values4 = sum(flat4[k + "/qpacked"].nbytes for k in kernels)
    assert all(flat4[k + "/qpacked"].dtype == np.uint8 for k in kernels) and values4 * 2 == values8  # two a byte
    # With the scales: a float32 per 32 inputs, against one per output channel for int8 (whose inputs here
    # are 64 and 128 wide): 0.59x of int8's bytes (0.53x at G = 128 on these kernels).
    bytes8 = values8 + sum(flat8[k + "/scale"].nbytes for k in kernels)
    bytes4 = values4 + sum(flat4[k + "/scale"].nbytes for k in kernels)
    assert 0.5 < bytes4 / bytes8 < 0.6, bytes4 / bytes8
    # The file is smaller by those bytes (the tables, biases and norms are the same in both).
    saved = os.path.getsize(tmp_path / "int8.npz") - os.path.getsize(f"{int4}/params.npz")
    assert abs(saved - (bytes8 - bytes4)) < 0.01 * bytes8
    assert json.loads(open(f"{int4}/config.json").read())["quantize"] == "int4-g32"
    assert "int4 with a float32 scale per group of 32 input elements" in open(f"{int4}/README.md").read()
    # Read back: the same packed weights as quantising on load, run in the mode it was exported with.
    loaded = bertjax.load(int4)
    assert loaded.quantize == "int4-g32"
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(loaded.params),
                           jax.device_get(grouped_models["int4-g32"].params))
    with pytest.raises(ValueError, match=f"{int4} was exported as int4-g32, whose weights do not run as int8-dynamic: "
                                         "load it with quantize='int4-g32' or without quantize"):
        bertjax.load(int4, quantize="int8")


@pytest.mark.parametrize("mode", ["int4-g0", "int3-g128"])
def test_a_misspelt_group_mode_is_one_line(classifier, tmp_path, mode):
    # (The program prints a ValueError as its one line and exits 2: bertjax/runs/console.py.)
    with pytest.raises(ValueError) as raised:
        exporting.export(classifier["workdir"], str(tmp_path / "x"), "params", quantize=mode)
    assert str(raised.value) == (f"quantize='{mode}': choose one of int8, int8-weights, int8-dynamic, or int4-gG / "
                                 "int8-gG (a scale per G input elements, G >= 2: int4-g128, int4-g32, int8-g128) (or "
                                 "none for float32)")
    assert not (tmp_path / "x").exists()



def test_a_mixed_plan_gives_int8_to_the_layer_whose_int4_costs_most(classifier, grouped_models, tmp_path):
    from bertjax.runs import compression_report, precision_plan
    from bertjax.tasks import kinds

    float_model, low, high = classifier["float"], grouped_models["int4-g32"], grouped_models["int8-g32"]
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in keyword_sentences()[300:400]))
    task = compression_report.task_of(float_model)[0]
    split, examples = compression_report.read_dev(task, str(dev))
    features = kinds.get(task.kind).featurize(task, examples, float_model.tokenizer, 48)
    floats = quantize.weight_bytes(float_model.params, kernels_only=True)
    one_layer = quantize.weight_bytes(quantize.mix(low.params, high.params, {"layers_0"}), kernels_only=True)
    model, record = precision_plan.plan(float_model, low, high, (one_layer + 1) / floats, task, split, examples,
                                        features)  # room for one layer at int8
    measured = {name: (layer["score_drop"], layer["logit_change"]) for name, layer in record["layers"].items()}
    sensitive = max(measured, key=measured.get)
    assert {name: layer["mode"] for name, layer in record["layers"].items()} == {
        name: "int8-g32" if name == sensitive else "int4-g32" for name in ("layers_0", "layers_1")}
    encoder = model.params["bert"]["encoder"]
    assert set(encoder[sensitive]["mlp"]["intermediate"]["kernel"]) == {"qvalue", "scale"}
    assert all(set(encoder[name]["mlp"]["intermediate"]["kernel"]) == {"qpacked", "scale"}
               for name in encoder if name != sensitive)
    assert model.quantize == "mixed" and quantize.weight_bytes(model.params, kernels_only=True) <= one_layer + 1
    np.testing.assert_allclose(record["kernel_ratio"], quantize.weight_bytes(model.params, kernels_only=True) / floats)
    with pytest.raises(ValueError, match=r"--size_budget=0.1: the dense kernels take at least 0\.1[0-9]* of their "
                                         r"float32 bytes \(every layer int4-g32\): give at least that"):
        precision_plan.plan(float_model, low, high, 0.1, task, split, examples, features)
    with pytest.raises(ValueError, match="quantize='mixed' is a plan chosen per layer on a dev set: make it with "
                                         "python -m bertjax.export"):
        bertjax.load(classifier["workdir"], quantize="mixed")
