"""Byte-level BPE (BPETokenizer, bertjax/text/tokenizers.py) against transformers, on conftest's
bpe_directories (a BPE the tokenizers library learned from text the test wrote, saved as a RoBERTa
directory, as RoBERTa's older vocab.json and merges.txt alone, and as a ModernBERT directory, each beside a
small random encoder).

bertjax's ids equal AutoTokenizer's on held-out text and pairs (in Python and inside tf.data), the encoder
outputs through bertjax.load equal transformers', a fine-tuned pair classifier and its export give
AutoTokenizer the same ids and transformers the same logits, the pretraining stream reads it and gives the
same batch twice, and what bertjax cannot read is one line.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from conftest import BPE_HELD_OUT, BPE_PAIRS, WORDS, copy_of

import bertjax
from bertjax import init_from
from bertjax.runs import exporting, finetuning
from bertjax.tasks import features, registry
from configs.finetune import common as finetune_configs

ATOL = 1e-5  # the families' tolerance (tests/test_families.py)
NAMES = ("roberta", "roberta-files", "modernbert")
ROLES = {"roberta": ("<pad>", "<unk>", "<s>", "</s>", "<mask>"),
         "modernbert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}


@pytest.fixture(scope="module")
def loaded(bpe_directories):
    """name -> bertjax.load of its directory, loaded once."""
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = bertjax.load(bpe_directories[name])
        return cache[name]

    return load


def check_ids(tokenizer, reference) -> None:
    """One text and a pair at a time, bertjax's rows equal the reference AutoTokenizer's."""
    for text in BPE_HELD_OUT:
        ours = features.encode_pair(tokenizer.encode([text])[0], None, 128, tokenizer.template, tokenizer.pad_id)
        assert ours["input_ids"][ours["input_mask"] == 1].tolist() == reference(text)["input_ids"], repr(text)
    for a, b in BPE_PAIRS:
        ids_a, ids_b = tokenizer.encode([a, b])
        ours = features.encode_pair(ids_a, ids_b, 128, tokenizer.template, tokenizer.pad_id)
        assert ours["input_ids"][ours["input_mask"] == 1].tolist() == reference(a, b)["input_ids"], (a, b)


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_autotokenizer_in_python_and_in_tf_data(name, bpe_directories, loaded):
    reference = transformers.AutoTokenizer.from_pretrained(bpe_directories[name])
    tokenizer = loaded(name).tokenizer
    assert tokenizer.kind == "bpe" and tokenizer.special_tokens == ROLES[name.split("-")[0]]
    check_ids(tokenizer, reference)
    encoded = tokenizer.encode(BPE_HELD_OUT)
    assert [tokenizer.decode(ids) for ids in encoded] == BPE_HELD_OUT  # byte-level: the text exactly
    # Inside tf.data (the pretraining stream's path) the same ids, batch after batch.
    dataset = tf.data.Dataset.from_tensor_slices(BPE_HELD_OUT).batch(5).map(tokenizer.tokenize)
    assert [row for batch in dataset for row in batch.to_list()] == encoded
    # A written <mask> stays text, as bertjax's other tokenizers keep a written [MASK]; fill_mask reads it.
    mask = tokenizer.mask_token
    assert tokenizer.mask_id not in tokenizer.encode([f"the {mask} city"])[0]
    ids, where = tokenizer.encode_with_masks(f"The {mask} city.")
    assert ids == reference(f"The {mask} city.", add_special_tokens=False)["input_ids"]
    assert [ids[w] for w in where] == [tokenizer.mask_id]


@pytest.mark.parametrize("name", ("roberta", "modernbert"))
def test_encoder_outputs_equal_transformers(name, bpe_directories, loaded):
    directory = bpe_directories[name]
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    texts = [t for t in BPE_HELD_OUT if t.strip()]
    batch = reference(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state.numpy()
    ours = loaded(name).encode(texts)
    np.testing.assert_array_equal(ours["input_ids"], batch["input_ids"].numpy())
    real = ours["input_mask"].astype(bool)
    difference = float(np.abs(ours["sequence_output"][real] - theirs[real]).max())
    print(f"{name}: max |sequence_output difference| vs transformers {difference:.2e}")
    assert difference < ATOL


@pytest.mark.slow
def test_fine_tuned_pairs_export_with_their_tokenizer(bpe_directories, tmp_path):
    """A pair classifier fine-tuned from the RoBERTa directory keeps its tokenizer.json; its Hugging Face
    export gives AutoTokenizer the same ids (<s> A </s></s> B </s>) and transformers the same scores."""
    rng = np.random.default_rng(0)
    rows = [{"text": " ".join(rng.choice(WORDS[:12], size=4)), "text_pair": " ".join(rng.choice(WORDS[:12], size=3)),
             "label": "yes" if i % 2 else "no"} for i in range(24)]
    for name, part in (("train", rows[:16]), ("dev", rows[16:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    config = finetune_configs.finetune_config("classification")
    config.train.init_from = str(bpe_directories["roberta"])
    config.data.update(max_seq_length=32, labels=("no", "yes"), train=str(tmp_path / "train.jsonl"),
                       validation=str(tmp_path / "dev.jsonl"))
    config.train.update(batch_size=8, epochs=1.0)
    config.logging.update(log_every=2, eval_batch_size=8)
    workdir = tmp_path / "run"
    assert finetuning.finetune(config, str(workdir))["steps"] == 2
    kept = init_from.resolve(str(workdir)).tokenizer
    assert kept.kind == "bpe" and kept.vocab_path.endswith("tokenizer.json")

    directory = exporting.export(str(workdir), str(tmp_path / "hf"), "hf")
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    bert = bertjax.load(workdir)
    check_ids(bert.tokenizer, reference)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    a, b = [p[0] for p in BPE_PAIRS], [p[1] for p in BPE_PAIRS]
    with torch.no_grad():
        theirs = torch.softmax(model(**reference(a, b, padding=True, return_tensors="pt")).logits, -1).numpy()
    ours = np.array([[p["scores"][label] for label in ("no", "yes")] for p in bert.predict(a, b)])
    print(f"fine-tuned RoBERTa pairs: max |probability difference| vs transformers {np.abs(ours - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="a byte-level BPE tokenizer runs in Python"):
        exporting.export(str(workdir), str(tmp_path / "sm"), "savedmodel")


def test_what_bertjax_cannot_read_is_one_line(bpe_directories, tmp_path):
    def broken(name, change):
        directory = copy_of(bpe_directories["modernbert"], tmp_path / name)
        spec = json.loads((directory / "tokenizer.json").read_text())
        change(spec)
        (directory / "tokenizer.json").write_text(json.dumps(spec))
        return directory

    word_level = broken("wordlevel", lambda spec: spec["model"].update(type="WordLevel"))
    with pytest.raises(ValueError, match=r"tokenizer.json is a WordLevel tokenizer: bertjax reads tokenizer.json "
                                         r"files whose model is BPE \(byte-level\), WordPiece or Unigram"):
        bertjax.load(word_level)
    metaspace = broken("metaspace", lambda spec: spec.update(pre_tokenizer={"type": "Metaspace"}))
    with pytest.raises(ValueError, match="its BPE has the pre-tokenizer Metaspace, not ByteLevel"):
        bertjax.load(metaspace)
    no_pad = broken("nopad", lambda spec: spec.update(added_tokens=[t for t in spec["added_tokens"]
                                                                    if t["content"] != "[PAD]"]))
    with pytest.raises(ValueError, match=r"no special token names the pad role \(such as <pad> or \[PAD\]\)"):
        bertjax.load(no_pad)
    no_merges = broken("nomerges", lambda spec: spec["model"].update(merges="not a list"))
    with pytest.raises(ValueError, match=r"tokenizer.json: the tokenizers library cannot read it \("):
        bertjax.load(no_merges)
    none = copy_of(bpe_directories["roberta-files"], tmp_path / "none")
    (none / "merges.txt").unlink()
    with pytest.raises(ValueError, match=r"no vocab.txt \(WordPiece\), tokenizer.json, or vocab.json and merges.txt"):
        bertjax.load(none)


def test_the_pretraining_stream_reads_byte_level_bpe_and_repeats_itself(bpe_directories):
    """data.tokenizer=bpe in tf.data: rows <s> ... </s> of the tokenizer's ids, the same batch from a second build."""
    from bertjax.data import inputs
    from configs import roberta_tiny

    data = roberta_tiny.get_config().data
    data.update(source="text", input_pattern=str(bpe_directories["roberta"].parent / "train.txt"), tokenizer="bpe",
                vocab_path=str(bpe_directories["roberta"] / "tokenizer.json"), lower_case=False, eval_fraction=0.1,
                max_seq_length=32, max_predictions_per_seq=5)
    batches = [next(inputs.build_inputs(data, workdir=None).train.dataset(8).as_numpy_iterator()) for _ in range(2)]
    for key, value in batches[0].items():
        np.testing.assert_array_equal(value, batches[1][key], err_msg=key)
    reference = transformers.AutoTokenizer.from_pretrained(bpe_directories["roberta"])
    ids, mask = batches[0]["input_ids"], batches[0]["input_mask"]
    assert (ids[:, 0] == reference.cls_token_id).all()
    assert all(row[int(n) - 1] == reference.sep_token_id for row, n in zip(ids, mask.sum(1)))
    assert ((ids == reference.pad_token_id) == (mask == 0)).all()


def test_word_by_word_tasks_are_refused_from_a_bpe_model(bpe_directories):
    config = finetune_configs.finetune_config("tagging")
    config.train.init_from = str(bpe_directories["roberta"])
    task = registry.get_task("tagging", labels=["O", "B-X", "I-X"])
    with pytest.raises(ValueError, match=r"task tagging \(tagging\) tokenizes its text word by word, which "
                                         r"byte-level BPE reads otherwise"):
        finetuning.starting_model(config, task, 3)
