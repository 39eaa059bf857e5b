"""BERT WordPiece tokenization as TensorFlow ops, id-for-id equal to Hugging Face's slow tokenizer.

The input pipeline tokenizes inside tf.data, so the whole tokenizer is built from graph ops
(RE2 regexes, ICU lower-casing and normalization, tensorflow_text's FastWordpieceTokenizer). The
reference is Hugging Face's Python BertTokenizer (`BertTokenizerLegacy` since transformers 5), which
is the original google-research/bert algorithm plus an NFC step. For one piece of text it does:

  1. clean: drop U+0000, U+FFFD and control characters (category C*, but not \\t \\n \\r);
     map whitespace (\\t \\n \\r and category Zs) to a space;
  2. put spaces around CJK ideographs (the exact ranges of HF's `_is_chinese_char`; Hangul, kana
     are not in them and stay inside words);
  3. NFC-normalize, split on whitespace;
  4. uncased only: `str.lower()`, NFD, drop nonspacing marks (category Mn), i.e. strip accents;
  5. split off every punctuation character (ASCII symbols and category P*) as its own word;
  6. WordPiece: greedy longest match first with "##" continuations; a word longer than 100
     characters, or one that cannot be pieced completely, becomes a single [UNK].

Why not tensorflow_text.BertTokenizer: it lower-cases with NFKC_Casefold, which differs from
`str.lower()` (NFKC folds ligatures, full-width forms, superscripts, "ß" -> "ss", ...), so on such
text its ids differ from those the original uncased BERT checkpoints were trained on.

Known, deliberate difference: text such as "[MASK]" is tokenized as ordinary text ("[", "mask",
"]"), as the original BERT does; HF instead maps literal special tokens in the text to their ids.
Corpus text must never be able to inject [SEP] or [MASK] into a pretraining example.
Remaining difference: RE2's and ICU's Unicode tables are newer than Python 3.11's `unicodedata`
(Unicode 14), so the ~4,500 codepoints first assigned since (e.g. CJK Extension H) are kept as
letters here while HF deletes them as unassigned. Every other codepoint, tried one at a time in
both modes, gives the same ids.
"""

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# HF's WordpieceTokenizer counts characters, not bytes; a UTF-8 character is at most 4 bytes,
# so the byte limit handed to FastWordpieceTokenizer never fires before the character limit.
MAX_CHARS_PER_WORD = 100

# Category C* except \t \n \r, plus U+FFFD (HF drops it too: it marks undecodable input).
# Written as "none of the assigned categories" because RE2's \p{C} leaves out unassigned
# codepoints (Cn), which Python's unicodedata reports as "Cn" and HF therefore removes.
_CONTROL = r"[^\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}\t\n\r]|\x{FFFD}"
# Zl/Zp (U+2028, U+2029) are not whitespace to HF's cleaner, but Python's str.split() splits on
# them all the same, so they end up as word separators.
_WHITESPACE = r"[\t\n\r\p{Z}]"
_CJK = (
    r"([\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
    r"\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}])"
)
# ASCII 33-47, 58-64, 91-96, 123-126 count as punctuation even where Unicode says Sm/Sc/Sk
# ("$", "+", "^", "`"), as in the original BERT.
_PUNCT = r"[\x{21}-\x{2F}\x{3A}-\x{40}\x{5B}-\x{60}\x{7B}-\x{7E}\p{P}]"


def load_vocab(path) -> list[str]:
    """Reads a vocab.txt: one token per line, UTF-8, the line number (from 0) is the id.

    Lines are split like HF's reader (text mode: "\\n", "\\r\\n" or "\\r"), so ids agree with it.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"vocab file not found: {path}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"vocab {path} line {line}: invalid UTF-8 ({e.reason})") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":  # the newline ending the last line does not start another token
        lines.pop()
    if not lines:
        raise ValueError(f"vocab {path} is empty: expected one token per line")
    first_line = {}
    for i, token in enumerate(lines):
        if token in first_line:
            raise ValueError(
                f"vocab {path} lists {token!r} twice (lines {first_line[token] + 1} and {i + 1}):"
                " every token needs a unique id"
            )
        first_line[token] = i
    return lines


class WordPieceTokenizer:
    """WordPiece tokenizer whose `tokenize` runs as TF ops (eager or inside tf.data).

    Args:
      vocab_path: vocab.txt, one token per line; must contain all of SPECIAL_TOKENS.
      lower_case: True for uncased vocabularies (lower-case and strip accents), False for cased.
    """

    def __init__(self, vocab_path: str, lower_case: bool = True):
        self.vocab = load_vocab(vocab_path)
        self.vocab_size = len(self.vocab)
        self.lower_case = lower_case
        token_to_id = {t: i for i, t in enumerate(self.vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in token_to_id]
        if missing:
            more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
            raise ValueError(
                f"vocab {vocab_path} lacks {missing[0]}{more}: add these tokens, one per line"
            )
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            token_to_id[t] for t in SPECIAL_TOKENS
        )
        self.special_ids = np.array([token_to_id[t] for t in SPECIAL_TOKENS], np.int32)
        # Whole-word masking groups a word-start piece with the "##" pieces that follow it.
        self.word_start = np.array([not t.startswith("##") for t in self.vocab], bool)
        # no_pretokenization: words arrive already split by our HF-compatible basic tokenizer.
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=self.vocab,
            suffix_indicator="##",
            max_bytes_per_word=4 * MAX_CHARS_PER_WORD,
            token_out_type=tf.int32,
            unknown_token="[UNK]",
            no_pretokenization=True,
        )

    def _split_words(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """HF's BasicTokenizer on a batch: [N] strings -> ragged [N, (words)] strings."""
        # Undecodable bytes become U+FFFD, which the cleaning below drops, as HF drops the U+FFFD
        # that Python's decode(errors="replace") leaves; without this the ICU ops would fail.
        x = tf.strings.unicode_transcode(
            texts, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        x = tf.strings.regex_replace(x, _CONTROL, "")
        x = tf.strings.regex_replace(x, _WHITESPACE, " ")
        x = tf.strings.regex_replace(x, _CJK, r" \1 ")
        x = tf_text.normalize_utf8(x, "NFC")
        if self.lower_case:
            # ICU's full lower-casing matches str.lower(), including "İ" -> "i̇" and the Greek
            # final sigma, which depends on context; HF lowers per whitespace-separated word,
            # but a space never counts as context, so lowering the whole string is the same.
            x = tf.strings.lower(x, encoding="utf-8")
            x = tf_text.normalize_utf8(x, "NFD")
            x = tf.strings.regex_replace(x, r"\p{Mn}+", "")
        # Spaces separate words and are dropped; each punctuation character is kept as a word.
        return tf_text.regex_split(x, rf" +|({_PUNCT})", _PUNCT)

    def tokenize(self, texts: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
        """[N] strings -> ragged int32 [N, (tokens)]; a scalar string -> int32 [tokens].

        No [CLS]/[SEP] are added: pair building does that.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            return self.tokenize(texts[tf.newaxis])[0]
        if texts.shape.rank != 1:
            raise ValueError(f"tokenize expects a scalar or [N] strings, got shape {texts.shape}")
        words = self._split_words(texts)  # [N, (W)]
        flat = words.flat_values  # [sum W]
        # Over-long words become the literal "[UNK]", which WordPiece maps to the one unk id.
        too_long = tf.strings.length(flat, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        flat = tf.where(too_long, "[UNK]", flat)
        pieces = self._wordpiece.tokenize(flat)  # [sum W, (P)]
        return words.with_flat_values(pieces).merge_dims(1, 2)  # [N, (T)]

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Eager convenience: Python strings -> lists of ids."""
        if not texts:
            return []
        return self.tokenize(tf.constant(list(texts), tf.string)).to_list()

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]

    def decode(self, ids) -> str:
        """Tokens joined by spaces, "##" pieces glued to the previous token. For humans only:
        it does not restore case, accents or the original spacing around punctuation."""
        text = ""
        for token in self.convert_ids_to_tokens(ids):
            if token.startswith("##") and text:
                text += token[2:]
            else:
                text += (" " if text else "") + token
        return text
