"""Tagging data: IOB1 and BIO read as BIO, CoNLL column files and their mistakes (file:line), TFDS conll2003
(mocked offline), rows with a word's tag at its first piece, long sentences split at word boundaries and
reassembled word for word."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from bertjax.data import demo
from bertjax.data.tasks import registry, tagging
from bertjax.text import tokenizers
from bertjax.text import vocab as vocabularies

TAGS = registry.CONLL2003_TAGS


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tagging") / "vocab.txt"
    sentences = [s for doc in demo.demo_documents(200) for s in doc] + ["Peter Blackburn lives in Brussels ."]
    vocabularies.learn_wordpiece_vocab(iter(sentences), 600, False, str(path))
    return tokenizers.load_tokenizer("wordpiece", str(path), lower_case=False)


def test_iob1_becomes_bio_and_bio_stays():
    assert tagging.to_bio(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == (
        "B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG")
    bio = ("B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC")
    assert tagging.to_bio(bio) == bio
    assert tagging.to_bio(["I-MISC"]) == ("B-MISC",)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


CONLL = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O


Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
"""


def test_reading_conll_columns(tmp_path):
    examples = tagging.read_conll(write(tmp_path / "a.txt", CONLL), TAGS)
    assert [e.words for e in examples] == [("EU", "rejects", "German", "call", "."), ("Peter", "Blackburn")]
    assert examples[0].tags == ("B-ORG", "O", "B-MISC", "O", "O") and examples[1].tags == ("B-PER", "I-PER")
    assert [e.idx for e in examples] == [0, 1]
    two = tagging.read_conll(write(tmp_path / "b.txt", "Paris B-LOC\nis O\n\nfine O\n"), TAGS)
    assert [e.tags for e in two] == [("B-LOC", "O"), ("O",)]
    words_only = tagging.read_conll(write(tmp_path / "c.txt", "Paris\nis\n\nfine\n"), TAGS, labeled=False)
    assert [e.words for e in words_only] == [("Paris", "is"), ("fine",)] and words_only[0].tags is None


@pytest.mark.parametrize("text,message", [
    ("EU NNP I-NP I-ORG\nrejects VBZ O\n", r"b\.txt:2: 3 columns, expected 4 as in line 1"),
    ("EU B-FOO\n", r"b\.txt:1: tag 'B-FOO' is not a tag of the task"),
    ("", r"b\.txt: no sentences"),
    ("-DOCSTART- O\n\n\n", r"b\.txt: no sentences"),
    ("EU\n", r"b\.txt:1: one column"),
])
def test_bad_conll_files_give_one_line_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        tagging.read_conll(write(tmp_path / "b.txt", text), TAGS)


def test_missing_directory_and_invalid_utf8(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        tagging.read_conll(str(tmp_path / "none.txt"), TAGS)
    with pytest.raises(ValueError, match="is a directory"):
        tagging.read_conll(str(tmp_path), TAGS)
    (tmp_path / "bad.txt").write_bytes(b"EU O\ncaf\xe9 O\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: invalid UTF-8"):
        tagging.read_conll(str(tmp_path / "bad.txt"), TAGS)


def test_tfds_conll2003_is_read_as_bio():
    names = tfds.builder("conll2003").info.features["ner"].feature.names
    assert tuple(names) == TAGS  # the registry's tag order is TFDS's ClassLabel order
    sentences = [(["EU", "rejects", "German"], ["I-ORG", "O", "I-MISC"]), (["Peter", "Blackburn"], ["B-PER", "I-PER"])]

    def as_dataset(self, split, **kwargs):
        rows = [{"tokens": words, "ner": [names.index(t) for t in tags], "pos": [0] * len(words),
                 "chunks": [0] * len(words)} for words, tags in sentences]
        return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature={
            "tokens": tf.TensorSpec([None], tf.string), "ner": tf.TensorSpec([None], tf.int64),
            "pos": tf.TensorSpec([None], tf.int64), "chunks": tf.TensorSpec([None], tf.int64)})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        examples = tagging.read_tfds_conll("dev")
    assert [e.words for e in examples] == [("EU", "rejects", "German"), ("Peter", "Blackburn")]
    assert [e.tags for e in examples] == [("B-ORG", "O", "B-MISC"), ("B-PER", "I-PER")]


def test_a_word_is_labelled_at_its_first_piece_only(tokenizer):
    example = tagging.TagExample(0, ("Peter", "Blackburn", "unaffable", "Brussels", "."),
                                 ("B-PER", "I-PER", "O", "B-LOC", "O"))
    f = tagging.featurize_tagging([example], TAGS, tokenizer, 32)
    pieces = [tokenizer.encode([w])[0] for w in example.words]
    assert max(len(p) for p in pieces) > 1  # some word splits into pieces
    ids = f["input_ids"][0]
    assert ids[0] == tokenizer.cls_id and list(ids[1:1 + sum(map(len, pieces))]) == [i for p in pieces for i in p]
    firsts = 1 + np.cumsum([0] + [len(p) for p in pieces[:-1]])
    assert list(np.flatnonzero(f["label_weight"][0])) == list(firsts)
    assert [TAGS[t] for t in f["label"][0][firsts]] == list(example.tags)
    assert list(f["word_index"][0][firsts]) == list(range(5)) and (f["word_index"][0] >= 0).sum() == 5
    assert f["label"][0][f["label_weight"][0] == 0].sum() == 0


def test_long_sentences_split_at_word_boundaries_and_reassemble(tokenizer):
    rng = np.random.default_rng(0)
    words = [w for s in demo.demo_documents(3)[0] for w in s.split()][:90]
    tags = [str(t) for t in rng.choice(TAGS, len(words))]
    examples = [tagging.TagExample(0, tuple(words), tagging.to_bio(tags)),
                tagging.TagExample(1, ("short", "one"), ("O", "O"))]
    f = tagging.featurize_tagging(examples, TAGS, tokenizer, 24)
    assert (f["idx"] == 0).sum() > 4 and (f["idx"] == 1).sum() == 1
    for r in range(len(f["idx"])):  # [CLS] ... [SEP] in every row, a word never split across rows
        n = f["input_mask"][r].sum()
        assert f["input_ids"][r, 0] == tokenizer.cls_id and f["input_ids"][r, n - 1] == tokenizer.sep_id
    predicted = tagging.tags_from_predictions(f, f["label"], TAGS, examples)
    assert predicted == {0: list(examples[0].tags), 1: ["O", "O"]}
