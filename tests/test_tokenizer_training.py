"""Learning vocabularies (bertjax/text/vocab_learning.py, `python -m bertjax.vocab train`) and the SentencePiece
tokenizer, on a small English corpus the tests write themselves."""

import gzip
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from bertjax.text import vocab_learning as vocab
from bertjax.text.tokenizers import (SPECIAL_TOKENS, SentencePieceTokenizer, WordPieceTokenizer, load_tokenizer,
                                     load_vocab)
from conftest import start_command  # tests/ is on sys.path under pytest

REPO = Path(__file__).resolve().parents[1]

NAMES = "Alice Bob Zoë José François Müller Ångström Chloé Renée Søren Dvořák Nuñez".split()
ADJECTIVES = "quick lazy bright quiet naïve old modern curious careful famous tiny enormous".split()
NOUNS = "dog cat river mountain library café façade garden engine painter museum village".split()
VERBS = "visited painted described repaired watched admired crossed photographed measured".split()
ADVERBS = "slowly quickly carefully happily rarely eventually suddenly".split()
PLACES = "Paris Zürich Kraków São Paulo Reykjavík Montréal Berlin Tokyo".split()
CONNECTIVES = ["and then", "because", "although", "while", "so"]


def _corpus_lines(n: int = 400) -> list[str]:
    """Varied English sentences, the same every time: names and words with accents, numbers and
    punctuation, upper and lower case; a blank line every 10 lines separates documents."""
    rng = random.Random(1234)
    lines = []
    for i in range(n):
        if i % 10 == 9:
            lines.append("")
            continue
        sentence = (
            f"{rng.choice(NAMES)} {rng.choice(ADVERBS)} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} "
            f"{rng.choice(NOUNS)} in {rng.choice(PLACES)}, {rng.choice(CONNECTIVES)} "
            f"{rng.choice(NAMES)} {rng.choice(VERBS)} {rng.randint(2, 1999)} {rng.choice(NOUNS)}s"
            f"{rng.choice(['.', '!', '?', ' (again).'])}"
        )
        lines.append(sentence.upper() if i % 17 == 0 else sentence)
    return lines


LINES = _corpus_lines()
TEXT = [line for line in LINES if line]
VOCAB_SIZE = 400


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """The corpus split over a plain and a gzip file, as the CLI reads it."""
    d = tmp_path_factory.mktemp("corpus")
    half = len(LINES) // 2
    (d / "part1.txt").write_text("\n".join(LINES[:half]) + "\n", encoding="utf-8")
    with gzip.open(d / "part2.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(LINES[half:]) + "\n")
    (d / "bad.txt").write_bytes(b"fine line\nbad \xff byte\n")
    return d


@pytest.fixture(scope="module")
def wordpiece_vocab(tmp_path_factory):
    out = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    return vocab.learn_wordpiece_vocab(iter(LINES), VOCAB_SIZE, lower_case=True, out_path=str(out))


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("sentencepiece") / "sp.model"
    return vocab.learn_sentencepiece_model(iter(LINES), 300, out_path=str(out), lower_case=True)


# --- WordPiece learning


def test_wordpiece_vocab_file(wordpiece_vocab):
    tokens = load_vocab(wordpiece_vocab)  # also rejects duplicates
    assert len(tokens) == VOCAB_SIZE
    assert tuple(tokens[: len(SPECIAL_TOKENS)]) == SPECIAL_TOKENS
    assert len(set(tokens)) == len(tokens)
    # Every character of the (lower-cased, accent-stripped) text as itself, and as "##c" unless it
    # is punctuation, which basic tokenization always splits off.
    chars = {c for line in TEXT for c in line.lower() if not c.isspace()}
    chars = {c for c in chars if c.isascii()}  # accented letters lose their accents when uncased
    for c in chars:
        assert c in tokens, c
        assert (("##" + c) in tokens) == c.isalnum(), c
    assert "é" not in tokens and "##é" not in tokens
    # Frequent words are learned whole.
    assert {"the", "in", "and"} <= set(tokens)


def test_wordpiece_is_deterministic(wordpiece_vocab, tmp_path):
    # Counts do not depend on line order, so even shuffled input gives the same file.
    shuffled = list(LINES)
    random.Random(0).shuffle(shuffled)
    again = vocab.learn_wordpiece_vocab(shuffled, VOCAB_SIZE, True, str(tmp_path / "vocab.txt"))
    assert Path(again).read_bytes() == Path(wordpiece_vocab).read_bytes()


def test_training_text_has_no_unknowns(wordpiece_vocab):
    tok = WordPieceTokenizer(wordpiece_vocab, lower_case=True)
    ids = [i for row in tok.encode(TEXT) for i in row]
    assert tok.unk_id not in ids
    assert any(not tok.word_start[i] for i in ids)  # some words are pieced
    # Unseen words made of seen characters are pieced, never unknown.
    unseen = tok.encode(["Zebras voted, the ketchup wiggled!"])[0]
    assert tok.unk_id not in unseen


def test_cased_vocab_keeps_case_and_accents(tmp_path):
    path = vocab.learn_wordpiece_vocab(LINES, VOCAB_SIZE, lower_case=False, out_path=str(tmp_path / "v.txt"))
    tok = WordPieceTokenizer(path, lower_case=False)
    assert {"é", "##é", "A", "##A"} <= set(tok.vocab)
    assert tok.unk_id not in [i for row in tok.encode(TEXT) for i in row]


def test_wordpiece_word_start_and_replacement_ids(wordpiece_vocab):
    tok = WordPieceTokenizer(wordpiece_vocab)
    np.testing.assert_array_equal(tok.word_start, [not t.startswith("##") for t in tok.vocab])
    assert tok.replacement_ids.dtype == np.int32
    assert sorted(tok.replacement_ids) == list(range(len(SPECIAL_TOKENS), VOCAB_SIZE))


def test_small_corpus_gives_a_shorter_vocab(tmp_path, caplog):
    path = vocab.learn_wordpiece_vocab(["low lower lowest", "low lower"], 100, True, str(tmp_path / "v.txt"))
    tokens = load_vocab(path)
    assert len(tokens) < 100
    assert "low" in tokens and "lower" in tokens  # pairs seen twice are merged
    assert "lowest" not in tokens  # seen once: not worth a token
    assert "gives only" in caplog.text


def test_learner_merges_most_frequent_pairs_first():
    tokens = vocab.learn_wordpiece({"hug": 10, "pug": 5, "hugs": 5}, vocab_size=100, reserved=["[PAD]"])
    learned = tokens[tokens.index("##s") + 1 :]
    # ("##u", "##g") occurs 20 times, then ("h", "##ug") 15, ("hug", "##s") 5, ("p", "##ug") 5.
    assert learned == ["##ug", "hug", "hugs", "pug"]


def test_tiny_vocab_keeps_the_most_frequent_characters():
    # "a" (6 times) and "##a" fill the room; "b" would need two more places; words with it are [UNK].
    tokens = vocab.learn_wordpiece({"aab": 3, "c": 1}, vocab_size=4, reserved=["[PAD]"])
    assert tokens == ["[PAD]", "a", "##a"]
    with pytest.raises(ValueError, match="no room"):
        vocab.learn_wordpiece({"a": 1}, vocab_size=1, reserved=["[PAD]"])


def test_empty_text_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        vocab.learn_wordpiece_vocab(["", "  "], 100, True, str(tmp_path / "v.txt"))
    with pytest.raises(ValueError, match="empty"):
        vocab.learn_sentencepiece_model([], 100, str(tmp_path / "sp.model"), True)


# --- Reading text files


def test_read_text_lines(corpus_dir):
    pattern = f"{corpus_dir}/part1.txt, {corpus_dir}/*.gz"
    assert list(vocab.read_text_lines(pattern)) == TEXT
    assert list(vocab.read_text_lines(pattern, max_lines=5)) == TEXT[:5]
    with pytest.raises(FileNotFoundError, match="nothing"):
        vocab.read_text_lines(f"{corpus_dir}/part1.txt,{corpus_dir}/nothing*.txt")
    with pytest.raises(ValueError, match=r"bad\.txt line 2: invalid UTF-8"):
        list(vocab.read_text_lines(f"{corpus_dir}/bad.txt"))


# --- SentencePiece


def test_sentencepiece_model_loads_with_special_ids(sp_model):
    tok = SentencePieceTokenizer(sp_model)
    assert Path(sp_model).with_suffix(".vocab").is_file()
    assert tok.vocab[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.lower_case


def test_sentencepiece_ids_equal_the_library(sp_model):
    tok = SentencePieceTokenizer(sp_model)
    reference = sentencepiece.SentencePieceProcessor(model_file=sp_model)
    texts = TEXT + ["Unseen wörds: Qatar's 1,000 ZEBRAS — ﬁne!", "", "   spaced   out  ", "中文 text"]
    assert tok.encode(texts) == [reference.encode(t) for t in texts]
    invalid = b"caf\xc3 ok\xff!"
    assert tok.tokenize(tf.constant(invalid)).numpy().tolist() == reference.encode(
        invalid.decode("utf-8", errors="replace")
    )


def test_sentencepiece_inside_tf_data(sp_model):
    tok = SentencePieceTokenizer(sp_model)
    texts = TEXT[:23]
    want = tok.encode(texts)
    per_text = tf.data.Dataset.from_tensor_slices(texts).map(tok.tokenize)
    assert [ids.numpy().tolist() for ids in per_text] == want
    batched = tf.data.Dataset.from_tensor_slices(texts).batch(5).map(tok.tokenize)
    assert [row for batch in batched for row in batch.to_list()] == want
    scalar = tok.tokenize(tf.constant(texts[0]))
    assert isinstance(scalar, tf.Tensor) and scalar.dtype == tf.int32 and scalar.shape.rank == 1


def test_sentencepiece_special_tokens_in_text_are_plain_text(sp_model):
    # [CLS] [SEP] [MASK] are control pieces: the text "[MASK]" must not become the mask id.
    tok = SentencePieceTokenizer(sp_model)
    ids = tok.encode(["Paris is the [MASK] of x[SEP]y."])[0]
    assert not set(ids) & set(tok.special_ids.tolist()) - {tok.unk_id}


def test_sentencepiece_word_start_and_replacement_ids(sp_model):
    tok = SentencePieceTokenizer(sp_model)
    special = set(tok.special_ids.tolist())
    for i, piece in enumerate(tok.vocab):
        assert tok.word_start[i] == (piece.startswith("\u2581") or i in special), piece
    assert tok.word_start.dtype == bool and tok.word_start.shape == (tok.vocab_size,)
    assert sorted(tok.replacement_ids) == list(range(len(SPECIAL_TOKENS), tok.vocab_size))


def test_sentencepiece_decode(sp_model):
    tok = SentencePieceTokenizer(sp_model)
    ids = [tok.cls_id] + tok.encode(["The quick dog."])[0] + [tok.sep_id]
    assert tok.decode(ids) == "[CLS] the quick dog. [SEP]"


def test_sentencepiece_is_deterministic(sp_model, tmp_path):
    # The model is written to exactly the path given (any name), with the .vocab listing beside it;
    # the bytes do not depend on that path.
    out = tmp_path / "sp.model.tmp.123"
    assert vocab.learn_sentencepiece_model(LINES, 300, str(out), True) == str(out)
    assert out.read_bytes() == Path(sp_model).read_bytes()
    assert (tmp_path / "sp.model.tmp.123.vocab").read_text().startswith("[PAD]\t0\n[UNK]\t0\n")


def _train_plain_sentencepiece(prefix, **specials):
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT), model_prefix=str(prefix), vocab_size=200, minloglevel=2,
        num_threads=1, hard_vocab_limit=False, **specials,
    )
    return f"{prefix}.model"


def test_sentencepiece_model_without_mask_is_rejected(tmp_path):
    user_defined = dict(pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1)
    path = _train_plain_sentencepiece(tmp_path / "no_mask", user_defined_symbols=["[CLS]", "[SEP]"],
                                      **user_defined)
    with pytest.raises(ValueError) as err:
        SentencePieceTokenizer(path)
    message = str(err.value)
    assert "[MASK]" in message and "[CLS]" not in message and "no_mask.model" in message
    assert "--kind=sentencepiece" in message and "\n" not in message
    # The same pieces as user-defined symbols (instead of control symbols) are accepted.
    path = _train_plain_sentencepiece(tmp_path / "user", user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
                                      **user_defined)
    assert SentencePieceTokenizer(path).mask_id == 4


# --- load_tokenizer


def test_load_tokenizer(wordpiece_vocab, sp_model):
    assert isinstance(load_tokenizer("wordpiece", wordpiece_vocab), WordPieceTokenizer)
    assert load_tokenizer("wordpiece", wordpiece_vocab, lower_case=False).lower_case is False
    assert isinstance(load_tokenizer("sentencepiece", sp_model), SentencePieceTokenizer)
    with pytest.raises(ValueError, match="data.tokenizer"):
        load_tokenizer("unigram", wordpiece_vocab)


# --- The program: python -m bertjax.vocab train


def _program_lines(stderr: str) -> list[str]:
    """stderr without TensorFlow's C++ start-up log ("I0000 00:00:... port.cc:153] ...", absl's
    pre-init warning), which no environment variable silences in TF 2.21."""
    tf_log = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:|WARNING: All log messages before absl::InitializeLog)")
    return [line for line in stderr.splitlines() if line.strip() and not tf_log.match(line)]


@pytest.fixture(scope="module")
def cli_runs(corpus_dir, tmp_path_factory):
    """The four runs of the program, started together so TensorFlow's start-up is paid in parallel."""
    out = tmp_path_factory.mktemp("cli")
    inputs = f"--input={corpus_dir}/part1.txt,{corpus_dir}/*.gz"
    commands = {
        "wordpiece": ["train", inputs, f"--vocab_size={VOCAB_SIZE}", f"--out={out}/vocab.txt"],
        "sentencepiece": ["train", inputs, "--vocab_size=300", "--kind=sentencepiece", f"--out={out}/sp.model"],
        "no_match": ["train", f"--input={corpus_dir}/nothing*.txt", "--vocab_size=300", f"--out={out}/x.txt"],
        "bad_utf8": ["train", f"--input={corpus_dir}/bad.txt", "--vocab_size=300", f"--out={out}/y.txt"],
    }
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = {name: start_command([sys.executable, "-m", "bertjax.vocab", *args], env=env, cwd=out)
             for name, args in commands.items()}
    runs = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        runs[name] = (proc.returncode, stdout, stderr)
    return out, runs


def test_cli_learns_wordpiece(cli_runs, wordpiece_vocab):
    out, runs = cli_runs
    code, stdout, stderr = runs["wordpiece"]
    assert code == 0, stderr
    assert f"{VOCAB_SIZE} tokens" in stdout
    # Same lines (plain + gzip files) and settings as the library call: the same file.
    assert (out / "vocab.txt").read_bytes() == Path(wordpiece_vocab).read_bytes()


def test_cli_learns_sentencepiece(cli_runs, sp_model):
    out, runs = cli_runs
    code, stdout, stderr = runs["sentencepiece"]
    assert code == 0, stderr
    assert (out / "sp.vocab").is_file()
    assert (out / "sp.model").read_bytes() == Path(sp_model).read_bytes()


def _assert_one_error_line(run, *expected):
    code, _, stderr = run
    assert code == 2
    # The program's own output is one line, last; TF may log at start-up before it.
    ours = _program_lines(stderr)
    assert "Traceback" not in stderr and sum("error:" in line for line in ours) == 1, stderr
    last = ours[-1]
    assert last.startswith("vocab.py: error: ")
    for text in expected:
        assert text in last


def test_cli_no_matching_file_is_one_line_exit_2(cli_runs):
    _, runs = cli_runs
    _assert_one_error_line(runs["no_match"], "--input=", "nothing*.txt")
    # With TF quiet (as in these tests), it is the only line.
    assert len(_program_lines(runs["no_match"][2])) == 1


def test_cli_invalid_utf8_names_file_and_line(cli_runs):
    _assert_one_error_line(cli_runs[1]["bad_utf8"], "bad.txt line 2: invalid UTF-8")
