"""The task heads (bertjax.models.heads) against Hugging Face's task classes: the same logits from the same
weights, converted both ways (hf.load_hf_head / hf.save_hf_head and transformers' from_pretrained),
losses equal to torch's on the same logits, padded examples ignored, dropout only in training.

Reference models are small, random and fp32, every parameter overwritten with noise (test_hf's
make_hf_model) so that a wrong name or transpose shows in the outputs.
"""

import functools
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from test_hf import make_hf_model

from bertjax.models import heads
from bertjax.interop import hf
from bertjax.models.config import BertConfig

ATOL = 1e-5
SHAPE = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=53,
             max_position_embeddings=16)
# kind -> (transformers class, AutoModel class that from_pretrained must pick, its config extras)
CLASSES = {
    "classification": (transformers.BertForSequenceClassification, transformers.AutoModelForSequenceClassification,
                       dict(num_labels=3)),
    "regression": (transformers.BertForSequenceClassification, transformers.AutoModelForSequenceClassification,
                   dict(num_labels=1, problem_type="regression")),
    "multiple_choice": (transformers.BertForMultipleChoice, transformers.AutoModelForMultipleChoice, {}),
    "span": (transformers.BertForQuestionAnswering, transformers.AutoModelForQuestionAnswering, {}),
    "tagging": (transformers.BertForTokenClassification, transformers.AutoModelForTokenClassification,
                dict(num_labels=5)),
}


def make_inputs(seed: int = 0, choices: int | None = None) -> dict:
    """Right-padded pairs [CLS] A [SEP] B [SEP] of different lengths, [B, S] or [B, C, S] with choices."""
    rng = np.random.default_rng(seed)
    seq = 10
    lengths = np.array([10, 6, 3, 8]) if choices is None else rng.integers(3, seq + 1, size=(2, choices))  # [B, C]
    input_mask = (np.arange(seq) < lengths[..., None]).astype(np.int32)
    input_ids = rng.integers(1, SHAPE["vocab_size"], size=input_mask.shape).astype(np.int32) * input_mask
    segment_ids = ((np.arange(seq) >= lengths[..., None] // 2) * input_mask).astype(np.int32)
    return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}


def hf_logits(hf_model, inputs: dict, **labels):
    """(logits in bertjax's layout, HF's loss or None) of an HF task model in eval mode."""
    with torch.no_grad():
        out = hf_model(input_ids=torch.as_tensor(inputs["input_ids"], dtype=torch.long),
                       token_type_ids=torch.as_tensor(inputs["segment_ids"], dtype=torch.long),
                       attention_mask=torch.as_tensor(inputs["input_mask"], dtype=torch.long),
                       **{k: torch.as_tensor(v) for k, v in labels.items()})
    if hasattr(out, "start_logits"):
        logits = torch.stack([out.start_logits, out.end_logits], dim=-1)  # [B, S, 2]
    else:
        logits = out.logits
    return logits.numpy(), None if out.loss is None else float(out.loss)


def hf_state(hf_model) -> dict[str, np.ndarray]:
    return {name: x.numpy() for name, x in hf_model.state_dict().items()}


@functools.lru_cache(maxsize=None)
def _forward(kind: str, cfg: BertConfig, num_labels: int | None, deterministic: bool = True):
    net = heads.network(kind, cfg, num_labels)
    return jax.jit(lambda params, inputs, rngs=None: net.apply(
        {"params": params}, **inputs, deterministic=deterministic, rngs=rngs))


def bertjax_logits(kind, cfg, params, inputs, num_labels=None):
    return np.asarray(_forward(kind, cfg, num_labels)(params, inputs))


def real(x: np.ndarray, inputs: dict) -> np.ndarray:
    """The real positions of a per-token [B, S, ...] array: what padding positions hold means nothing."""
    return x[inputs["input_mask"].astype(bool)]


def example_labels(kind: str, inputs: dict, rng) -> tuple[np.ndarray, dict]:
    """(bertjax labels, the same as HF keyword arguments) for one batch of `kind`."""
    batch = inputs["input_ids"].shape[0]
    if kind == "classification":
        labels = rng.integers(0, 3, size=batch)
        return labels, dict(labels=labels)
    if kind == "regression":
        labels = rng.uniform(0, 5, size=batch).astype(np.float32)
        return labels, dict(labels=labels)
    if kind == "multiple_choice":
        labels = rng.integers(0, inputs["input_ids"].shape[1], size=batch)
        return labels, dict(labels=labels)
    if kind == "span":
        lengths = inputs["input_mask"].sum(-1)
        start = np.array([rng.integers(0, n) for n in lengths])
        end = np.array([rng.integers(s, n) for s, n in zip(start, lengths)])
        return np.stack([start, end], -1), dict(start_positions=start, end_positions=end)
    labels = rng.integers(0, 5, size=inputs["input_ids"].shape)  # tagging: labels only at real tokens
    return labels, dict(labels=np.where(inputs["input_mask"] > 0, labels, -100))


# --------------------------------------------------------------------------------------------------
# Parity with transformers, both ways
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(CLASSES))
def test_head_matches_transformers_both_ways(kind, tmp_path):
    cls, auto_cls, extras = CLASSES[kind]
    hf_model = make_hf_model({**SHAPE, **extras}, seed=3, cls=cls)
    inputs = make_inputs(seed=3, choices=4 if kind == "multiple_choice" else None)
    labels, hf_labels = example_labels(kind, inputs, np.random.default_rng(3))
    ref, ref_loss = hf_logits(hf_model, inputs, **hf_labels)
    per_token = kind in ("span", "tagging")

    # HF -> bertjax: the task's own directory loads whole.
    hf_model.save_pretrained(tmp_path / "hf")
    cfg, params, missing = hf.load_hf_head(tmp_path / "hf", kind)
    assert missing == (["bert/pooler/bias", "bert/pooler/kernel"] if per_token else [])  # HF has none there
    assert set(params) == {"bert", "classifier"}
    num_labels = extras.get("num_labels")
    ours = bertjax_logits(kind, cfg, params, inputs, num_labels)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)  # noqa: E731
    close(real(ours, inputs), real(ref, inputs)) if per_token else close(ours, ref)

    # The loss on those logits is torch's (all examples real).
    weights = np.ones(labels.shape if kind == "tagging" else labels.shape[:1], np.float32)
    if kind == "tagging":
        weights = inputs["input_mask"].astype(np.float32)
    loss, sums = heads.HEADS[kind].loss(jnp.asarray(ours), jnp.asarray(labels), jnp.asarray(weights))
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    assert float(sums["count"]) == weights.sum()

    # bertjax -> HF: written, then read by transformers' Auto class with nothing missing or left over.
    label_names = [f"tag{i}" for i in range(num_labels)] if kind in ("classification", "tagging") else None
    hf.save_hf_head(tmp_path / "out", cfg, params, kind, label_names=label_names)
    reloaded, info = auto_cls.from_pretrained(tmp_path / "out", attn_implementation="eager", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(reloaded) is cls
    again, _ = hf_logits(reloaded.eval(), inputs)
    np.testing.assert_array_equal(again, ref)  # the conversion is exact both ways
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [cls.__name__]
    if kind == "regression":
        assert written["problem_type"] == "regression" and reloaded.config.num_labels == 1
    if label_names:
        assert reloaded.config.id2label == dict(enumerate(label_names))


def test_multiple_choice_is_one_pooled_score_per_choice():
    """A choice's score depends on its own row only: reordering the choices reorders the logits."""
    hf_model = make_hf_model(SHAPE, seed=4, cls=transformers.BertForMultipleChoice)
    cfg = hf.config_from_hf(hf_model.config.to_dict())
    params, _ = hf.hf_to_head_params(hf_state(hf_model), cfg, "multiple_choice")
    inputs = make_inputs(seed=4, choices=4)
    logits = bertjax_logits("multiple_choice", cfg, params, inputs)  # [B, C]
    order = np.array([2, 0, 3, 1])
    shuffled = bertjax_logits("multiple_choice", cfg, params, {k: v[:, order] for k, v in inputs.items()})
    np.testing.assert_allclose(shuffled, logits[:, order], rtol=0, atol=ATOL)


# --------------------------------------------------------------------------------------------------
# Encoders from pretraining checkpoints
# --------------------------------------------------------------------------------------------------


def test_pretraining_checkpoint_gives_the_encoder(tmp_path):
    pretraining = make_hf_model(SHAPE, seed=5)  # BertForPreTraining
    pretraining.save_pretrained(tmp_path / "pre")
    cfg, pre_params, _ = hf.load_hf_checkpoint(tmp_path / "pre")

    cfg2, params, missing = hf.load_hf_head(tmp_path / "pre", "classification", num_labels=3)
    assert cfg2 == cfg and missing == ["classifier/bias", "classifier/kernel"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["bert"], pre_params["bert"])
    assert params["classifier"]["kernel"].shape == (SHAPE["hidden_size"], 3)
    assert 0.005 < params["classifier"]["kernel"].std() < 0.04  # BERT's init, not zeros

    # The same from bertjax params: a head's params (here their shapes, as a program has them first)
    # with the pretraining encoder put in, the boxes (logical axis names) kept.
    net = heads.network("classification", cfg, 3)
    fresh = jax.eval_shape(net.init, jax.random.key(0), **heads.dummy_inputs("classification"))["params"]
    assert fresh["classifier"]["kernel"].names == ("embed", None)
    joined = heads.with_pretrained_encoder(fresh, pre_params)
    assert joined["bert"]["pooler"]["kernel"].names == ("embed", None)
    jax.tree_util.tree_map(np.testing.assert_array_equal, nn.unbox(joined["bert"]), pre_params["bert"])
    assert joined["classifier"] is fresh["classifier"]
    with pytest.raises(ValueError, match="scan_layers"):
        heads.with_pretrained_encoder(fresh, hf.load_hf_checkpoint(tmp_path / "pre", {"scan_layers": True})[1])

    # A classification checkpoint loaded for tagging: the encoder only, its classifier is another task's.
    make_hf_model({**SHAPE, "num_labels": 4}, seed=6, cls=transformers.BertForSequenceClassification).save_pretrained(
        tmp_path / "cls")
    _, tagging, missing = hf.load_hf_head(tmp_path / "cls", "tagging", num_labels=7)
    assert missing == ["classifier/bias", "classifier/kernel"] and tagging["classifier"]["bias"].shape == (7,)
    with pytest.raises(ValueError, match="needs num_labels"):
        hf.load_hf_head(tmp_path / "pre", "classification")


def test_scanned_head_round_trips(tmp_path):
    hf_model = make_hf_model({**SHAPE, "num_labels": 3}, seed=7, cls=transformers.BertForSequenceClassification)
    hf_model.save_pretrained(tmp_path)
    cfg, params, _ = hf.load_hf_head(tmp_path, "classification", model_config_overrides={"scan_layers": True})
    assert "layers" in params["bert"]["encoder"]
    inputs = make_inputs(seed=7)
    np.testing.assert_allclose(bertjax_logits("classification", cfg, params, inputs, 3), hf_logits(hf_model, inputs)[0],
                               rtol=0, atol=ATOL)
    exported = hf.head_params_to_hf(params, cfg, "classification")
    original = hf_model.state_dict()
    assert sorted(exported) == sorted(k for k in original if not k.endswith("position_ids"))
    for name, x in exported.items():
        np.testing.assert_array_equal(x, original[name].numpy(), err_msg=name)


# --------------------------------------------------------------------------------------------------
# Losses, padding, predictions, dropout
# --------------------------------------------------------------------------------------------------


def test_losses_ignore_padded_examples():
    """A padded final batch (weight 0 rows, whatever they hold) has the loss of its real rows, which
    is torch's on those rows alone."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4)).astype(np.float32)
    labels = rng.integers(0, 4, size=5)
    weights = np.array([1, 1, 1, 0, 0], np.float32)
    torch_ce = torch.nn.functional.cross_entropy(torch.as_tensor(logits[:3]), torch.as_tensor(labels[:3]))
    loss, sums = heads.classification_loss(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))
    np.testing.assert_allclose(float(loss), float(torch_ce), rtol=1e-6)
    assert float(sums["count"]) == 3
    assert float(sums["correct"]) == np.sum(np.argmax(logits[:3], -1) == labels[:3])
    garbage = logits.copy()
    garbage[3:] = 1e4  # padded rows hold anything
    np.testing.assert_allclose(float(heads.classification_loss(garbage, labels, weights)[0]), float(loss), rtol=1e-6)

    values = rng.normal(size=(5, 1)).astype(np.float32)
    targets = rng.uniform(0, 5, size=5).astype(np.float32)
    torch_mse = torch.nn.functional.mse_loss(torch.as_tensor(values[:3, 0]), torch.as_tensor(targets[:3]))
    loss, sums = heads.regression_loss(jnp.asarray(values), jnp.asarray(targets), jnp.asarray(weights))
    np.testing.assert_allclose(float(loss), float(torch_mse), rtol=1e-6)
    np.testing.assert_allclose(float(sums["squared_error_sum"]), 3 * float(torch_mse), rtol=1e-6)

    # A batch of padding only: zero loss, zero gradient, nothing counted (not NaN).
    zero = jnp.zeros(5)
    loss, grads = jax.value_and_grad(lambda x: heads.classification_loss(x, labels, zero)[0])(jnp.asarray(logits))
    assert float(loss) == 0.0 and not np.any(grads)


def test_predictions():
    logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    np.testing.assert_array_equal(heads.predictions(logits, "classification"), [1, 0])
    np.testing.assert_array_equal(heads.predictions(logits, "multiple_choice"), [1, 0])
    np.testing.assert_array_equal(heads.predictions(logits[:, :1], "regression"), np.float32([0.1, 3.0]))
    np.testing.assert_array_equal(heads.predictions(logits[None], "tagging"), [[1, 0]])
    # Span: the best start + end with start <= end; here the separate argmaxes (start 3, end 1) are not.
    start = jnp.array([0.0, 1.0, 0.0, 5.0])
    end = jnp.array([0.0, 4.0, 2.0, 0.0])
    np.testing.assert_array_equal(heads.predictions(jnp.stack([start, end], -1)[None], "span"), [[1, 1]])


def test_dropout_only_in_training():
    shape = {**SHAPE, "num_hidden_layers": 1}  # one block: compiling in training mode is the cost here
    cfg = hf.config_from_hf(transformers.BertConfig(**shape).to_dict())  # BERT's dropout 0.1
    for kind, num_labels in (("classification", 3), ("multiple_choice", None)):
        inputs = make_inputs(seed=8, choices=4 if kind == "multiple_choice" else None)
        # Params by conversion (shapes only, no compile), from an HF model of the task.
        cls, _, extras = CLASSES[kind]
        params, _ = hf.hf_to_head_params(hf_state(make_hf_model({**shape, **extras}, seed=8, cls=cls)), cfg, kind)
        train = _forward(kind, cfg, num_labels, deterministic=False)
        a, b, a2 = (np.asarray(train(params, inputs, {"dropout": jax.random.key(s)})) for s in (1, 2, 1))
        assert not np.allclose(a, b) and np.array_equal(a, a2)
        evaluated = bertjax_logits(kind, cfg, params, inputs, num_labels)
        assert not np.allclose(a, evaluated)
        np.testing.assert_array_equal(evaluated, bertjax_logits(kind, cfg, params, inputs, num_labels))


def test_table_and_mistakes():
    # Every kind but contrastive (an encoder and its pooling) has a transformers task class.
    assert list(hf.HF_HEADS) == [kind for kind in heads.HEADS if kind != "contrastive"]
    cfg = BertConfig(vocab_size=53, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(ValueError, match=re.escape("'classify'")):
        heads.network("classify", cfg, 3)
    with pytest.raises(ValueError, match="num_labels=1, not 3"):
        heads.network("regression", cfg, 3)
    with pytest.raises(ValueError, match="needs num_labels >= 2"):
        heads.network("tagging", cfg)
    with pytest.raises(ValueError, match="3 distinct names"):
        hf.config_to_hf(cfg, "classification", 3, ["a", "b"])
    regression = hf.config_to_hf(cfg, "regression")
    assert regression["problem_type"] == "regression" and regression["id2label"] == {"0": "LABEL_0"}
    assert hf.config_to_hf(cfg)["architectures"] == ["BertForPreTraining"]  # unchanged without a kind
