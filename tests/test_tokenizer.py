"""bertjax.text.tokenizers against Hugging Face's Python BertTokenizer, eagerly and inside tf.data.

The reference is HF's slow tokenizer (`BertTokenizerLegacy` in transformers 5, `BertTokenizer` before):
it is the original BERT algorithm in readable Python. The Rust `BertTokenizer` of transformers 5 is not
the reference: it lower-cases character by character (no Greek final sigma) and skips HF's NFC step.
"""

import random
import string

import numpy as np
import pytest
import tensorflow as tf

from bertjax.text.tokenizers import SPECIAL_TOKENS, WordPieceTokenizer, load_vocab

# Texts chosen for the rules most likely to go wrong in a re-implementation; each comment says which.
TEXTS = [
    # accents: stripped when uncased, kept (NFC-composed) when cased
    "Café au lait, naïve Ångström on the façade.",
    "CAFÉ NAÏVE ÅNGSTRÖM",
    "Cafe\u0301 written decomposed, and a lone \u0301 mark",
    # mixed case
    "The Quick BROWN fox JuMpS over McDonald's iPhone",
    # punctuation and symbols: ASCII symbols count as punctuation, Unicode P* too
    "Hello, world!",
    "e.g. i.e. U.S.A. etc.",
    "It costs $5.00 (or €4.50) — 50% off!",
    "a-b_c d/e f\\g h+i=j",
    "\"quoted\" 'single' “curly” ‘quotes’ don't",
    "«guillemets» ¿Qué tal? ¡Hola!",
    "em—dash en–dash…ellipsis",
    "#hashtag ##double @user C++ x^2 `tick` {brace} [bracket] <angle> ~tilde |pipe",
    "1,000.50 3.14159 2024-01-01 42nd",
    # CJK ideographs become single-character words; kana and Hangul do not (not in HF's ranges)
    "我爱北京天安门",
    "東京は日本の首都です。Tokyo is the capital.",
    "中文English混合text",
    "\U00020000extension B\uf900compatibility ideograph",  # outside U+4E00-9FFF, no spaces around them
    "한국어 텍스트입니다",
    "서울Seoul",
    # other scripts; Greek final sigma and dotted capital I need full (contextual) lower-casing
    "Ελληνικά: ΟΔΟΣ ΣΟΦΟΣ. Σ",
    "İstanbul Straße STRASSE ẞ",
    "Москва — столица России",
    "العربية هنا",
    "हिन्दी क़लम",
    # NFC changes these: Angstrom/Ohm signs, a composition exclusion, conjoining Hangul jamo
    "\u212b \u2126 \u0958\u0932\u092e \u1100\u1161\u11a8",
    "ภาษาไทย",
    # unknown words: "q" is never in the test vocab
    "qwerty quizzically zqz",
    # the 100-character rule counts characters, not bytes
    "x" * 101,
    "x" * 100,
    "д" * 60,
    "д" * 101,
    "é" * 101,
    "é" * 60 + " ok",
    # whitespace oddities
    "\ttab\tseparated\nnew\nlines\r\nwindows\rmac",
    "non\u00a0breaking\u2003em space\u3000ideographic",
    "   multiple    spaces   ",
    " leading",
    "trailing ",
    "line\u2028separator\u2029paragraph",
    # control and format characters are deleted (they join their neighbours)
    "null\x00char",
    "zero\u200bwidth",
    "soft\u00adhyphen",
    "replace\ufffdment",
    "bom\ufeffmark",
    "bell\x07 esc\x1b del\x7f next\x85line",
    "private\ue000use unassigned\u0378x joiner\u200d",
    # empty results
    "",
    "   ",
    "\x00\u200b\ufffd",
    # digits and number-like symbols
    "0123456789 ٣ ²³ ½",
    # compatibility characters must not be NFKC-folded
    "ﬁ ligature ＡＢＣ１２３ full-width",
    "emoji 👍🏽 🎉!",
]

COMMON_WORDS = """the of and to in is was for on that with as by at from his her it an are were be this
which or have had not but they their one all been has more who also first new after other two time
world people city year years state part school university known war name made used during
between under most over later when where into only some such many may these would than out about
hello quick brown fox over lazy dog cost costs off dash tab new lines spaces leading trailing
line separator paragraph null char zero width soft hyphen mark next written lone single quotes
capital english text ok""".split()


def _hf():
    try:  # transformers >= 5: the Python tokenizer was renamed
        from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Bert
    except ImportError:
        from transformers.models.bert.tokenization_bert import BasicTokenizer, BertTokenizer as Bert
    return Bert, BasicTokenizer


def _write_vocab(path, lower_case):
    """A vocab where some test words are whole, some pieced ("wo ##rld"), some unknown."""
    _, BasicTokenizer = _hf()
    basic = BasicTokenizer(do_lower_case=lower_case)
    words = sorted({w for t in TEXTS for w in basic.tokenize(t)})
    common = [w for w in COMMON_WORDS] + ([] if lower_case else [w.title() for w in COMMON_WORDS])
    vocab = list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(10)] + common
    for i, w in enumerate(words):
        if "q" in w or len(w) > 50:
            continue
        if i % 3 == 0:
            vocab.append(w)
        elif i % 3 == 1 and len(w) >= 4:
            vocab += [w[:2], "##" + w[2:]]
        # else: left to be pieced from the single characters below, or [UNK]
    letters = [c for c in string.ascii_lowercase if c not in "qz"]
    if not lower_case:
        letters += [c.upper() for c in letters]
    vocab += letters + ["##" + c for c in letters]
    vocab += ["##" + s for s in ("ing", "ed", "s", "er", "ly", "tion")]
    vocab += ["д", "##д", "é", "##é", "e", "##e"]  # the long 2-byte-character words get pieced
    vocab = list(dict.fromkeys(vocab))  # keep the first of any duplicate
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def pair(request, tmp_path_factory):
    """(ours, Hugging Face's) built on the same vocab.txt."""
    lower_case = request.param
    path = _write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt", lower_case)
    Bert, _ = _hf()
    return WordPieceTokenizer(path, lower_case=lower_case), Bert(path, do_lower_case=lower_case)


def _hf_ids(hf, text):
    return hf.convert_tokens_to_ids(hf.tokenize(text))


def _assert_same(ours, hf, texts, got):
    for text, ids in zip(texts, got):
        want = _hf_ids(hf, text)
        assert ids == want, (
            f"text {text!r} (lower_case={ours.lower_case}):\n"
            f"  ours {ours.convert_ids_to_tokens(ids)}\n  HF   {hf.convert_ids_to_tokens(want)}"
        )


def test_vocab_exercises_pieces_and_unknowns(pair):
    ours, _ = pair
    flat = [i for ids in ours.encode(TEXTS) for i in ids]
    assert ours.unk_id in flat
    assert any(not ours.word_start[i] for i in flat)


def test_matches_hugging_face(pair):
    ours, hf = pair
    _assert_same(ours, hf, TEXTS, ours.encode(TEXTS))


def test_matches_hugging_face_on_random_text(pair):
    # Random mixtures find interactions the hand-written texts miss (punctuation next to accents,
    # CJK next to controls, ...).
    ours, hf = pair
    pool = (
        string.ascii_letters * 3 + string.digits + string.punctuation + "  \t\n\r\x00\x85\u00a0\u2028"
        + "éÉèçÇñÑüÜøØåÅßẞİıΣσςΑΩдД€£¥©®°±×÷–—‘’“”«»¿¡…"
        + "中日本語\U00020000\uf900한국ひらカタ\u0301\u0308\u200b\u00ad\ufeff\ufffd\ue000👍"
    )
    rng = random.Random(0)
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    _assert_same(ours, hf, texts, ours.encode(texts))


def test_character_limit_counts_characters_not_bytes(pair):
    ours, _ = pair
    cyrillic_60, cyrillic_101, x_100 = ours.encode(["д" * 60, "д" * 101, "x" * 100])
    assert ours.convert_ids_to_tokens(cyrillic_60) == ["д"] + ["##д"] * 59
    assert cyrillic_101 == [ours.unk_id]
    assert len(x_100) == 100


def test_same_ids_inside_tf_data(pair):
    ours, _ = pair
    want = ours.encode(TEXTS)
    per_text = tf.data.Dataset.from_tensor_slices(TEXTS).map(ours.tokenize)
    got = [ids.numpy().tolist() for ids in per_text]
    assert got == want
    batched = tf.data.Dataset.from_tensor_slices(TEXTS).batch(7).map(ours.tokenize)
    assert [row for batch in batched for row in batch.to_list()] == want


def test_tokenize_shapes_and_dtype(pair):
    ours, _ = pair
    scalar = ours.tokenize(tf.constant("Hello, world!"))
    assert isinstance(scalar, tf.Tensor) and scalar.shape.rank == 1 and scalar.dtype == tf.int32
    batch = ours.tokenize(tf.constant(["Hello, world!", ""]))
    assert isinstance(batch, tf.RaggedTensor) and batch.dtype == tf.int32
    assert batch.to_list() == [scalar.numpy().tolist(), []]
    assert ours.encode([]) == []


def test_invalid_utf8_input_is_replaced_then_dropped(pair):
    # HF sees Python text; bytes that do not decode reach it as U+FFFD, which it deletes.
    ours, hf = pair
    raw = b"caf\xc3 ok\xff!"
    got = ours.tokenize(tf.constant([raw])).to_list()[0]
    assert got == _hf_ids(hf, raw.decode("utf-8", errors="replace"))


def test_special_tokens_in_text_are_plain_text(pair):
    # Deliberate difference from HF, which maps a literal "[MASK]" in the text to the mask id:
    # corpus text must not inject special tokens. We follow the original BERT here, which is
    # HF's own BasicTokenizer + WordpieceTokenizer without the special-token shortcut.
    ours, hf = pair
    text = "Paris is the [MASK] of x[SEP]y."
    words = hf.basic_tokenizer.tokenize(text)  # no never_split: specials are split like text
    want = hf.convert_tokens_to_ids([p for w in words for p in hf.wordpiece_tokenizer.tokenize(w)])
    assert ours.encode([text])[0] == want
    assert ours.mask_id not in want and ours.sep_id not in want


def test_special_ids_and_word_start(pair):
    ours, _ = pair
    assert [ours.vocab[i] for i in ours.special_ids] == list(SPECIAL_TOKENS)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == tuple(ours.special_ids)
    assert ours.word_start.dtype == bool and ours.word_start.shape == (ours.vocab_size,)
    for i, token in enumerate(ours.vocab):
        assert ours.word_start[i] == (not token.startswith("##")), token
    assert ours.word_start[ours.special_ids].all()


def test_replacement_ids_leave_out_specials_and_unused(pair):
    # Masking's "random token" must be one that can occur in text: not a special token, and not
    # one of the [unusedN] placeholders that no text ever produces.
    ours, _ = pair
    assert ours.replacement_ids.dtype == np.int32
    left_out = set(range(ours.vocab_size)) - set(ours.replacement_ids.tolist())
    assert {ours.vocab[i] for i in left_out} == set(SPECIAL_TOKENS) | {f"[unused{i}]" for i in range(10)}


def test_decode_glues_pieces(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(list(SPECIAL_TOKENS) + ["hello", "wo", "##rld", ",", "!"]) + "\n")
    tok = WordPieceTokenizer(str(path))
    ids = tok.encode(["Hello, WORLD!"])[0]
    assert tok.convert_ids_to_tokens(ids) == ["hello", ",", "wo", "##rld", "!"]
    assert tok.convert_ids_to_tokens(np.array(ids)) == tok.convert_ids_to_tokens(tf.constant(ids))
    assert tok.decode(ids) == "hello , world !"
    assert tok.decode([]) == ""


def test_missing_special_token_is_named(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[SEP]\nhello\n")
    with pytest.raises(ValueError) as err:
        WordPieceTokenizer(str(path))
    message = str(err.value)
    assert "[CLS]" in message and "[MASK]" in message and str(path) in message
    assert "\n" not in message


def test_missing_vocab_file_names_path(tmp_path):
    path = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        WordPieceTokenizer(str(path))


def test_bad_vocab_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"[PAD]\n[UNK]\nca\xfft\n")
    with pytest.raises(ValueError, match=r"bad\.txt line 3"):
        load_vocab(bad)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_vocab(empty)
    dup = tmp_path / "dup.txt"
    dup.write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="twice"):
        load_vocab(dup)


def test_load_vocab_line_endings_like_hf(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\r\n[UNK]\n\nlast")
    assert load_vocab(path) == ["[PAD]", "[UNK]", "", "last"]
