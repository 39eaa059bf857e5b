"""Tagging data: IOB1 and BIO read as BIO, CoNLL column files and their mistakes (one line naming
file:line), TFDS conll2003 (mocked offline), rows with a word's tag at its first piece only, long
sentences split at word boundaries and reassembled word for word."""

import string

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from bertjax.tasks import tag_sequences
from bertjax.text import tokenizers

TAGS = tag_sequences.CONLL2003_TAGS
WORDS = ("peter", "black", "##burn", "lives", "in", "brussels", "un", "##aff", "##able", "eu", "rejects",
         "german", "call", "to", "boycott", "british", "lamb", ".", ",")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """WordPiece on a small vocab.txt: every letter is a word and a ##piece, so any ASCII word tokenizes."""
    path = tmp_path_factory.mktemp("tagging") / "vocab.txt"
    letters = list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    path.write_text("\n".join(list(tokenizers.SPECIAL_TOKENS) + list(WORDS) + letters) + "\n", encoding="utf-8")
    return tokenizers.load_tokenizer("wordpiece", str(path), lower_case=True)


def write(path, text):
    path.write_bytes(text.encode("utf-8"))
    return str(path)


# ----------------------------------------------------------------------------------------------------
# IOB1 -> BIO
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("iob1,bio", [
    (["I-PER", "I-PER", "O", "I-LOC"], ("B-PER", "I-PER", "O", "B-LOC")),  # start, after O
    (["I-ORG", "I-MISC", "I-MISC"], ("B-ORG", "B-MISC", "I-MISC")),  # after another type
    (["I-LOC", "B-LOC", "I-LOC"], ("B-LOC", "B-LOC", "I-LOC")),  # IOB1's B-: two adjacent entities
    (["I-MISC"], ("B-MISC",)),
    ([], ()),
])
def test_iob1_becomes_bio(iob1, bio):
    assert tag_sequences.to_bio(iob1) == bio


@pytest.mark.parametrize("bio", [
    ("B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"),
    ("B-ORG", "B-ORG", "B-MISC", "I-MISC", "I-MISC", "O", "O"),
    ("O", "O"),
])
def test_bio_comes_back_unchanged(bio):
    assert tag_sequences.to_bio(bio) == bio


def test_to_bio_is_idempotent_on_any_tags():
    rng = np.random.default_rng(0)
    for _ in range(200):
        tags = tag_sequences.to_bio(rng.choice(TAGS, rng.integers(0, 12)).tolist())
        assert tag_sequences.to_bio(tags) == tags
        for before, tag in zip(("O",) + tags, tags):  # every I-X continues an X
            assert not tag.startswith("I-") or before[2:] == tag[2:]


# ----------------------------------------------------------------------------------------------------
# CoNLL column files
# ----------------------------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O



Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O"""  # no newline at the end: the last sentence still counts


def test_four_columns_docstart_blank_lines_and_iob1(tmp_path):
    examples = tag_sequences.read_conll(write(tmp_path / "a.txt", CONLL), TAGS)
    assert [e.words for e in examples] == [("EU", "rejects", "German", "call", "."), ("Peter", "Blackburn"),
                                           ("BRUSSELS", "1996-08-22")]
    assert [e.tags for e in examples] == [("B-ORG", "O", "B-MISC", "O", "O"), ("B-PER", "I-PER"), ("B-LOC", "O")]
    assert [e.idx for e in examples] == [0, 1, 2]
    crlf = tag_sequences.read_conll(write(tmp_path / "crlf.txt", CONLL.replace("\n", "\r\n")), TAGS)
    assert crlf == examples


def test_two_columns_bio_tabs_and_words_kept_whole(tmp_path):
    text = "\n\nParis\tB-LOC\nis O\nfine\t O\n\n\nLe B-ORG\nMonde I-ORG\n10\u00a0000 O\nx\u2028y O\n"
    examples = tag_sequences.read_conll(write(tmp_path / "b.txt", text), TAGS)
    assert [e.words for e in examples] == [("Paris", "is", "fine"), ("Le", "Monde", "10\u00a0000", "x\u2028y")]
    assert [e.tags for e in examples] == [("B-LOC", "O", "O"), ("B-ORG", "I-ORG", "O", "O")]
    anything = tag_sequences.read_conll(write(tmp_path / "c.txt", "a I-X\nb I-X\n"), None)  # no tag set: any tags
    assert anything[0].tags == ("B-X", "I-X")


def test_unlabelled_sets_may_be_words_only(tmp_path):
    words_only = tag_sequences.read_conll(write(tmp_path / "c.txt", "-DOCSTART-\n\nParis\nis\n\nfine\n"), TAGS,
                                    labeled=False)
    assert [e.words for e in words_only] == [("Paris", "is"), ("fine",)]
    assert all(e.tags is None for e in words_only)
    with_tags = tag_sequences.read_conll(write(tmp_path / "d.txt", "Paris I-LOC\n"), TAGS, labeled=False)
    assert with_tags[0].tags == ("B-LOC",)  # tags that are there are read (and checked) all the same


@pytest.mark.parametrize("text,message", [
    ("-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\nrejects VBZ O\n",
     r"^\S*b\.txt:4: 3 columns, expected 4 as in line 3 "),
    ("EU B-ORG\n\nrejects VBZ O\n", r"^\S*b\.txt:3: 3 columns, expected 2 as in line 1 "),
    ("EU O\nof O\nFOO B-FOO\n", r"^\S*b\.txt:3: tag 'B-FOO' is not a tag of the task: expected one of O, B-PER, "),
    ("EU O\nFOO I-FOO\n", r"^\S*b\.txt:2: tag 'I-FOO' \(read as 'B-FOO'\) is not a tag of the task"),
    ("", r"^\S*b\.txt: no sentences"),
    ("\n \n\t\n", r"^\S*b\.txt: no sentences"),
    ("-DOCSTART- -X- -X- O\n\n\n", r"^\S*b\.txt: no sentences"),
    ("\nEU\n", r"^\S*b\.txt:2: one column"),
])
def test_bad_files_give_one_line_naming_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as e:
        tag_sequences.read_conll(write(tmp_path / "b.txt", text), TAGS)
    assert "\n" not in str(e.value)


def test_missing_file_directory_and_invalid_utf8(tmp_path):
    with pytest.raises(ValueError, match=r"none\.txt: no such file"):
        tag_sequences.read_conll(str(tmp_path / "none.txt"), TAGS)
    with pytest.raises(ValueError, match="is a directory"):
        tag_sequences.read_conll(str(tmp_path), TAGS)
    (tmp_path / "bad.txt").write_bytes(b"EU O\n\ncaf\xe9 O\n")
    with pytest.raises(ValueError, match=r"bad\.txt:3: invalid UTF-8"):
        tag_sequences.read_conll(str(tmp_path / "bad.txt"), TAGS)


# ----------------------------------------------------------------------------------------------------
# TFDS conll2003, mocked
# ----------------------------------------------------------------------------------------------------


def test_tfds_tag_names_are_the_constant():
    assert tuple(tfds.builder("conll2003").info.features["ner"].feature.names) == TAGS


def test_tfds_conll2003_is_read_as_bio():
    sentences = [(["EU", "rejects", "German"], ["I-ORG", "O", "I-MISC"]),
                 (["Peter", "Blackburn"], ["B-PER", "I-PER"]),
                 ([], [])]  # TFDS's generator yields an empty sentence at the end of a file

    def as_dataset(self, split, **kwargs):
        rows = [{"tokens": words, "ner": [TAGS.index(t) for t in tags], "pos": [0] * len(words),
                 "chunks": [0] * len(words)} for words, tags in sentences]
        return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature={
            "tokens": tf.TensorSpec([None], tf.string), "ner": tf.TensorSpec([None], tf.int64),
            "pos": tf.TensorSpec([None], tf.int64), "chunks": tf.TensorSpec([None], tf.int64)})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        examples = tag_sequences.read_tfds_conll("dev")
    assert examples == [tag_sequences.TagExample(0, ("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC")),
                        tag_sequences.TagExample(1, ("Peter", "Blackburn"), ("B-PER", "I-PER"))]


def test_tfds_random_mock_mismatched_lengths_are_one_line():
    # Plain mock_data draws each sequence's length on its own: tokens and ner tags differ in length,
    # which real data never do and which must not be zipped away silently.
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(ValueError, match=r"^TFDS conll2003 split train example 0: \d+ tokens but \d+ tags$"):
            tag_sequences.read_tfds_conll("train")


# ----------------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------------


def pieces_of(tokenizer, words):
    return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer.encode(list(words))]


def test_a_word_is_labelled_at_its_first_piece_only(tokenizer):
    example = tag_sequences.TagExample(7, ("Peter", "Blackburn", "unaffable", "Brussels", "."),
                                 ("B-PER", "I-PER", "O", "B-LOC", "O"))
    f = tag_sequences.featurize_tagging([example], TAGS, tokenizer, 16)
    assert {k: v.shape for k, v in f.items()} == {
        "input_ids": (1, 16), "segment_ids": (1, 16), "input_mask": (1, 16), "label": (1, 16),
        "label_weight": (1, 16), "word_index": (1, 16), "idx": (1,), "example_weight": (1,)}
    assert {k: v.dtype for k, v in f.items() if k not in ("label_weight", "example_weight")} == {
        k: np.int32 for k in ("input_ids", "segment_ids", "input_mask", "label", "word_index", "idx")}
    assert f["label_weight"].dtype == f["example_weight"].dtype == np.float32
    tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][0])
    assert tokens[:10] == ["[CLS]", "peter", "black", "##burn", "un", "##aff", "##able", "brussels", ".", "[SEP]"]
    assert set(tokens[10:]) == {"[PAD]"} and list(f["input_mask"][0]) == [1] * 10 + [0] * 6
    firsts = [1, 2, 4, 7, 8]
    assert list(np.flatnonzero(f["label_weight"][0])) == firsts
    assert [TAGS[t] for t in f["label"][0, firsts]] == list(example.tags)
    assert list(f["word_index"][0, firsts]) == [0, 1, 2, 3, 4] and (f["word_index"][0] >= 0).sum() == 5
    # "unaffable": un ##aff ##able, its O at "un" only; ##burn, ##aff, ##able carry nothing
    assert f["label_weight"][0, [3, 5, 6]].sum() == 0 and f["label"][0, f["label_weight"][0] == 0].sum() == 0
    assert (f["word_index"][0, [0, 3, 5, 6, 9]] == -1).all()
    assert f["segment_ids"].sum() == 0 and list(f["idx"]) == [7] and list(f["example_weight"]) == [1.0]


def test_a_word_that_tokenizes_to_nothing_gets_unk(tokenizer):
    example = tag_sequences.TagExample(0, ("Peter", "\x07", "", "lives"), ("B-PER", "O", "B-MISC", "O"))
    f = tag_sequences.featurize_tagging([example], TAGS, tokenizer, 10)
    assert tokenizer.convert_ids_to_tokens(f["input_ids"][0, :6]) == ["[CLS]", "peter", "[UNK]", "[UNK]", "lives",
                                                                      "[SEP]"]
    assert list(f["word_index"][0, 1:5]) == [0, 1, 2, 3] and list(f["label_weight"][0, 1:5]) == [1, 1, 1, 1]
    assert tag_sequences.tags_from_predictions(f, f["label"], TAGS, [example]) == {0: list(example.tags)}


def test_unlabelled_sentences_mark_first_pieces_in_word_index(tokenizer):
    example = tag_sequences.TagExample(3, ("unaffable", "Peter"), None)
    f = tag_sequences.featurize_tagging([example], TAGS, tokenizer, 8)
    assert f["label_weight"].sum() == 0 and f["label"].sum() == 0
    assert list(f["word_index"][0, :6]) == [-1, 0, -1, -1, 1, -1]
    predicted = np.zeros_like(f["label"])
    predicted[0, 1], predicted[0, 4] = TAGS.index("B-PER"), TAGS.index("I-PER")
    assert tag_sequences.tags_from_predictions(f, predicted, TAGS, {3: 2}) == {3: ["B-PER", "I-PER"]}


def sentence(rng, n):
    vocab = ["Peter", "Blackburn", "unaffable", "lives", "in", "Brussels", "EU", "rejects", "call", ",", "."]
    words = [str(w) for w in rng.choice(vocab, n)]
    return tuple(words), tag_sequences.to_bio([str(t) for t in rng.choice(TAGS, n)])


@pytest.mark.parametrize("max_seq_length", [5, 8, 24])
def test_long_sentences_split_at_word_boundaries_and_reassemble(tokenizer, max_seq_length):
    rng = np.random.default_rng(max_seq_length)
    examples = [tag_sequences.TagExample(i, *sentence(rng, n)) for i, n in enumerate((60, 2, 1, 33))]
    examples[1] = tag_sequences.TagExample(1, ("short", "one"), ("O", "O"))
    f = tag_sequences.featurize_tagging(examples, TAGS, tokenizer, max_seq_length)
    room = max_seq_length - 2
    assert list(f["idx"]) == sorted(f["idx"]) and set(f["idx"]) == {0, 1, 2, 3}
    total = sum(min(len(p), room) for p in pieces_of(tokenizer, examples[0].words))
    assert (f["idx"] == 0).sum() >= max(2, -(-total // room))  # several rows, none over-full
    for e in examples:
        rows = np.flatnonzero(f["idx"] == e.idx)
        expected = [p[:room] for p in pieces_of(tokenizer, e.words)]  # a word longer than a row: its first pieces
        next_word = 0
        for r in rows:
            n = f["input_mask"][r].sum()
            assert f["input_mask"][r, :n].all() and not f["input_mask"][r, n:].any()
            tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][r, :n])
            assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and 3 <= n <= max_seq_length
            words = f["word_index"][r, f["word_index"][r] >= 0]
            # consecutive whole words, taking up where the last row stopped: no overlap, none lost
            assert list(words) == list(range(next_word, next_word + len(words))) and len(words) >= 1
            assert tokens[1:-1] == [p for w in words for p in expected[w]]
            next_word += len(words)
            if r != rows[-1]:  # greedy: the next word would not have fit
                assert n - 2 + len(expected[next_word]) > room
        assert next_word == len(e.words)
    predicted = tag_sequences.tags_from_predictions(f, f["label"], TAGS, examples)
    assert predicted == {e.idx: list(e.tags) for e in examples}
    assert (tag_sequences.tags_from_predictions(f, f["label"], TAGS, {e.idx: len(e.words) for e in examples})
            == predicted)


def test_a_word_longer_than_a_row_keeps_its_first_pieces(tokenizer):
    example = tag_sequences.TagExample(0, ("Peter", "abcdefghij", "lives"), ("O", "B-MISC", "O"))
    f = tag_sequences.featurize_tagging([example], TAGS, tokenizer, 6)
    tokens = [tokenizer.convert_ids_to_tokens(row[:m.sum()]) for row, m in zip(f["input_ids"], f["input_mask"])]
    assert tokens == [["[CLS]", "peter", "[SEP]"], ["[CLS]", "a", "##b", "##c", "##d", "[SEP]"],
                      ["[CLS]", "lives", "[SEP]"]]
    assert tag_sequences.tags_from_predictions(f, f["label"], TAGS, [example]) == {0: ["O", "B-MISC", "O"]}


def test_predictions_ignore_padding_rows_and_refuse_foreign_features(tokenizer):
    examples = [tag_sequences.TagExample(0, ("Peter", "lives"), ("B-PER", "O")),
                tag_sequences.TagExample(1, ("in", "Brussels"), ("O", "B-LOC"))]
    f = tag_sequences.featurize_tagging(examples, TAGS, tokenizer, 8)
    padded = {k: np.concatenate([v, v[:1]]) for k, v in f.items()}  # as eval batching pads: row 0, weight 0
    padded["example_weight"][-1] = 0
    predicted = np.concatenate([f["label"], np.full_like(f["label"][:1], TAGS.index("I-MISC"))])
    assert (tag_sequences.tags_from_predictions(padded, predicted, TAGS, examples)
            == {0: ["B-PER", "O"], 1: ["O", "B-LOC"]})
    with pytest.raises(ValueError, match="sentence 2: word 0 has no row"):
        tag_sequences.tags_from_predictions(f, f["label"], TAGS, {0: 2, 1: 2, 2: 1})
    with pytest.raises(ValueError, match="word 1 of sentence 1, which the set does not have"):
        tag_sequences.tags_from_predictions(f, f["label"], TAGS, {0: 2, 1: 1})
    with pytest.raises(ValueError, match="shape"):
        tag_sequences.tags_from_predictions(f, f["label"][:1], TAGS, examples)


@pytest.mark.parametrize("examples,message", [
    ([tag_sequences.TagExample(0, ("EU",), ("B-FOO",))], r"sentence 0, word 0 \('EU'\): tag 'B-FOO' is not a tag"),
    ([tag_sequences.TagExample(0, ("EU", "call"), ("O",))], "sentence 0: 2 words but 1 tags"),
    ([tag_sequences.TagExample(4, ("EU",), None)] * 2, "sentence idx 4 appears twice"),
    ([], "no sentences"),
])
def test_featurize_refuses_what_it_cannot_row(tokenizer, examples, message):
    with pytest.raises(ValueError, match=message):
        tag_sequences.featurize_tagging(examples, TAGS, tokenizer, 8)


def test_featurize_needs_room_for_a_word(tokenizer):
    with pytest.raises(ValueError, match="max_seq_length=2"):
        tag_sequences.featurize_tagging([tag_sequences.TagExample(0, ("EU",), ("O",))], TAGS, tokenizer, 2)
