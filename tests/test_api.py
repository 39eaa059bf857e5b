"""bertjax.load(...).encode(...) against transformers' BertTokenizer + BertModel on the same directory."""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

import bertjax
from bertjax import inference
from bertjax.training.checkpoint_meta import CheckpointMeta

# The reference-model helper is shared with the conversion tests (tests/ is on sys.path under pytest).
from test_hf import make_hf_model

TEXTS = ["The quick brown fox jumps over the lazy dogs.", "Hello, world!"]
# Every word piece the texts need (lower-cased), "##s" to exercise WordPiece continuations.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "jump", "##s",
         "over", "lazy", "dog", "hello", "world", ",", "!", "."] + [f"filler{i}" for i in range(40)]
SHAPE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             vocab_size=len(VOCAB), max_position_embeddings=64)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A Hugging Face BERT directory as save_pretrained writes it, plus the vocabulary."""
    directory = tmp_path_factory.mktemp("hf_bert")
    make_hf_model(SHAPE, seed=3).save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return directory


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return bertjax.load(hf_dir)


def hf_reference(hf_dir, texts, **tokenizer_kwargs):
    tokenizer = transformers.BertTokenizer(str(hf_dir / "vocab.txt"), do_lower_case=True)
    encoding = tokenizer(texts, padding=True, return_tensors="pt", **tokenizer_kwargs)
    hf_model = transformers.BertModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf_model(**encoding, output_hidden_states=True)
    return encoding, out


def test_repr_is_a_summary_not_the_weights(loaded):
    text = repr(loaded)
    assert len(text) < 300 and "2 layers" in text and "parameters" in text, text


def test_encode_matches_transformers(hf_dir, loaded):
    assert loaded.missing == [] and loaded.config.num_layers == 2
    out = loaded.encode(TEXTS)
    encoding, ref = hf_reference(hf_dir, TEXTS)
    np.testing.assert_array_equal(out["input_ids"], encoding["input_ids"].numpy())
    np.testing.assert_array_equal(out["input_mask"], encoding["attention_mask"].numpy())
    assert 1 not in out["input_ids"]  # no [UNK]: the vocabulary covers the texts
    real = out["input_mask"].astype(bool)  # outputs at padding carry no meaning

    close = lambda a, b: np.testing.assert_allclose(a, b.numpy(), rtol=0, atol=1e-5)  # noqa: E731
    assert out["sequence_output"].shape == (2, real[0].sum(), 64) and out["sequence_output"].dtype == np.float32
    close(out["sequence_output"][real], ref.last_hidden_state[torch.as_tensor(real)])
    close(out["pooled_output"], ref.pooler_output)
    assert len(out["hidden_states"]) == 3
    for ours, theirs in zip(out["hidden_states"], ref.hidden_states):
        close(ours[real], theirs[torch.as_tensor(real)])


def test_truncation_and_lower_case_setting(hf_dir, loaded, tmp_path):
    batch = loaded.tokenize(TEXTS, max_length=5)
    encoding, _ = hf_reference(hf_dir, TEXTS, truncation=True, max_length=5)
    np.testing.assert_array_equal(batch["input_ids"], encoding["input_ids"].numpy())
    assert batch["input_ids"].shape == (2, 5) and (batch["input_ids"][:, -1] == loaded.tokenizer.sep_id).all()
    with pytest.raises(ValueError, match="max_length=65 must be between 2 .* the model.s 64 positions"):
        loaded.tokenize(TEXTS, max_length=65)

    # do_lower_case comes from tokenizer_config.json: cased, "Hello" is not in this lower-case vocab.
    shutil.copytree(hf_dir, tmp_path / "cased")
    (tmp_path / "cased" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = bertjax.load(tmp_path / "cased")
    assert cased.tokenizer.lower_case is False
    assert cased.tokenize(["Hello world"])["input_ids"].tolist() == [[2, 1, 15, 3]]


def test_load_rejects_what_it_cannot_read(hf_dir, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        bertjax.load(tmp_path / "nowhere")
    with pytest.raises(ValueError,
                       match="expected a bertjax training or fine-tuning workdir.*or a Hugging Face BERT directory"):
        bertjax.load(tmp_path)
    shutil.copytree(hf_dir, tmp_path / "no_vocab")
    (tmp_path / "no_vocab" / "vocab.txt").unlink()
    with pytest.raises(ValueError, match="no vocab.txt"):
        bertjax.load(tmp_path / "no_vocab")


def test_package_exports_load():
    assert bertjax.load is inference.load


# ----------------------------------------------------------------------------------------------------
# fill_mask, features and predict, against transformers on the same weights
# ----------------------------------------------------------------------------------------------------


def test_fill_mask_equals_the_hugging_face_pipeline(hf_dir, loaded):
    pipe = transformers.pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir), top_k=5)
    text = "The quick brown [MASK] jumps over the lazy dogs."
    ours, theirs = loaded.fill_mask(text, top_k=5), pipe(text)
    assert [g["token"] for g in ours] == [g["token"] for g in theirs]
    np.testing.assert_allclose([g["score"] for g in ours], [g["score"] for g in theirs], atol=1e-5)
    assert [g["token_str"] for g in ours] == [g["token_str"].replace(" ", "") for g in theirs]
    assert ours[0]["sequence"].startswith("the quick brown ")
    # Two masks in a text, and a batch: one list of guesses per mask.
    two = "Hello, [MASK] [MASK]"
    both = loaded.fill_mask([two, text], top_k=3)
    ref = pipe(two, top_k=3)
    assert len(both) == 2 and len(both[0]) == 2 and len(both[1]) == 1
    for mine, hf_guesses in zip(both[0], ref):
        assert [g["token"] for g in mine] == [g["token"] for g in hf_guesses]
        np.testing.assert_allclose([g["score"] for g in mine], [g["score"] for g in hf_guesses], atol=1e-5)
    with pytest.raises(ValueError, match=r"no \[MASK\]"):
        loaded.fill_mask("no mask here")


def test_features_combine_the_chosen_layers(hf_dir, loaded):
    _, ref = hf_reference(hf_dir, TEXTS)
    hidden = [h.numpy() for h in ref.hidden_states]  # embeddings, then each layer
    real = loaded.encode(TEXTS)["input_mask"].astype(bool)
    with pytest.raises(ValueError, match=r"hidden states 0\.\.2"):
        loaded.features(TEXTS)  # the paper's last four: this model has 2 layers, 3 states
    concat = loaded.features(TEXTS, layers=(-1, -2))["features"]
    np.testing.assert_allclose(concat[real], np.concatenate([hidden[-1], hidden[-2]], -1)[real], atol=1e-5)
    mean = loaded.features(TEXTS, layers=(-1, 0), combine="mean")["features"]
    np.testing.assert_allclose(mean[real], ((hidden[-1] + hidden[0]) / 2)[real], atol=1e-5)
    assert loaded.features(TEXTS, layers=(-1, -2, -3))["features"].shape[-1] == 3 * 64


def test_predict_of_a_fine_tuned_checkpoint_equals_transformers(hf_dir, tmp_path):
    from bertjax.training import checkpoint
    from bertjax.interop import hf

    labels = ["negative", "neutral", "positive"]
    head_dir = tmp_path / "hf_head"
    reference = make_hf_model(dict(SHAPE, num_labels=3), seed=5, cls=transformers.BertForSequenceClassification)
    reference.save_pretrained(head_dir)
    cfg, params, missing = hf.load_hf_head(head_dir, "classification")
    assert missing == []
    workdir = tmp_path / "finetuned"
    workdir.mkdir()
    shutil.copy(hf_dir / "vocab.txt", workdir / "vocab.txt")
    meta = {"step": 7, "model": cfg.__dict__,
            "tokenizer": {"kind": "wordpiece", "path": "vocab.txt", "lower_case": True},
            "task": {"name": "classification", "kind": "classification", "labels": labels, "num_choices": None,
                     "max_seq_length": 32}}
    checkpoint.save_params(str(workdir), checkpoint.BEST_DIR, 7, params, CheckpointMeta.from_json(meta))
    model = bertjax.load(workdir)
    assert "fine-tuned for classification" in repr(model)
    pairs = ["Hello, world!", "The lazy dog."]
    predictions = model.predict(TEXTS, text_pairs=pairs)
    tokenizer = transformers.BertTokenizer(str(hf_dir / "vocab.txt"), do_lower_case=True)
    encoding = tokenizer(TEXTS, pairs, padding="max_length", max_length=32, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(reference(**encoding).logits, -1).numpy()
    for p, ref in zip(predictions, probs):
        assert p["label"] == labels[int(np.argmax(ref))]
        np.testing.assert_allclose([p["scores"][name] for name in labels], ref, atol=1e-5)
    # encode and features read the task checkpoint's encoder; fill_mask has no head to use.
    assert model.encode(["Hello, world!"])["pooled_output"].shape == (1, 64)
    with pytest.raises(ValueError, match="no masked-LM head"):
        model.fill_mask("hello [MASK]")
    with pytest.raises(ValueError, match="not a fine-tuned task checkpoint"):
        bertjax.load(hf_dir).predict(["hello"])
