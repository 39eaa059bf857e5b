"""Tokenizers as TensorFlow ops (WordPiece, SentencePiece), so the input pipeline tokenizes inside tf.data;
and byte-level BPE (RoBERTa's, ModernBERT's), whose engine runs in tf.data through tf.numpy_function.

Both share one interface (`Tokenizer`): the vocabulary, the ids of the special tokens, which ids start
a word (for whole-word masking) and which ids masking may substitute as "a random token".

WordPiece is id-for-id equal to Hugging Face's Python BertTokenizer (the original google-research/bert
algorithm plus an NFC step), built from RE2 regexes, ICU normalization and tensorflow_text's
FastWordpieceTokenizer; `basic_tokenize` is its word splitting, which vocabulary learning reuses.
Not tensorflow_text.BertTokenizer: its NFKC case folding differs from `str.lower()`, so its ids differ
from those the original uncased checkpoints were trained on. Literal "[MASK]" in text stays plain
text, so a corpus can never inject a special token. The algorithm step by step and the known
differences are in docs/data.md ("Tokenizers").

SentencePiece runs tensorflow_text's SentencepieceTokenizer on the serialized .model, so its ids are
those of the `sentencepiece` library itself. Vocabularies are learned by bertjax.text.vocab_learning.
"""

import itertools
import json
import re

import numpy as np
import sentencepiece
import tokenizers as hf_tokenizers
from sentencepiece import sentencepiece_model_pb2

from bertjax.text import bpe, templates, tf_cpu

tf = tf_cpu.import_tensorflow()
tf_text = tf_cpu.import_tensorflow_text()

# bertjax's own names of the special tokens, in the order of templates.SPECIAL_ROLES.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Texts per tokenizer call in encode_arrays: bounds the memory of one ragged batch on the largest
# fine-tuning sets (QQP, MNLI).
_ENCODE_CHUNK = 8192

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
# Characters basic_tokenize always makes a word of their own: a "##" form of them is never looked up.
ALWAYS_SPLIT_CHAR = f"{_PUNCT}|{_CJK}"

# Placeholders of the original BERT vocabularies, kept for later use; they are never in real text.
_UNUSED_WORDPIECE = re.compile(r"\[unused\d+\]")
_SENTENCEPIECE_WORD_START = "\u2581"  # "▁": SentencePiece marks the start of each word with it
_BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": byte-level BPE's mark of a token that starts after a space


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


def _replace_invalid_utf8(texts: tf.Tensor) -> tf.Tensor:
    # Undecodable bytes become U+FFFD, as Python's decode(errors="replace") makes them; without
    # this the ICU and SentencePiece ops would fail (or differ from the Python references) on them.
    return tf.strings.unicode_transcode(
        texts, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )


def basic_tokenize(texts: tf.Tensor, lower_case: bool) -> tf.RaggedTensor:
    """HF's BasicTokenizer (steps 1-5 in docs/data.md) on a batch: [N] strings -> ragged [N, (words)] strings."""
    x = _replace_invalid_utf8(texts)  # U+FFFD is then dropped by the cleaning, as HF drops it
    x = tf.strings.regex_replace(x, _CONTROL, "")
    x = tf.strings.regex_replace(x, _WHITESPACE, " ")
    x = tf.strings.regex_replace(x, _CJK, r" \1 ")
    x = tf_text.normalize_utf8(x, "NFC")
    if lower_case:
        # ICU's full lower-casing matches str.lower(), including "İ" -> "i̇" and the Greek
        # final sigma, which depends on context; HF lowers per whitespace-separated word,
        # but a space never counts as context, so lowering the whole string is the same.
        x = tf.strings.lower(x, encoding="utf-8")
        x = tf_text.normalize_utf8(x, "NFD")
        x = tf.strings.regex_replace(x, r"\p{Mn}+", "")
    # Spaces separate words and are dropped; each punctuation character is kept as a word.
    return tf_text.regex_split(x, rf" +|({_PUNCT})", _PUNCT)


class Tokenizer:
    """What the input pipeline needs from a tokenizer; WordPiece and SentencePiece both provide it.

    Attributes:
      vocab: the tokens, id order. vocab_size: len(vocab).
      special_tokens: the tokens of templates.SPECIAL_ROLES (SPECIAL_TOKENS, or a family's own, e.g. RoBERTa's <pad>).
      pad_id, unk_id, cls_id, sep_id, mask_id: their ids; special_ids: them as int32.
      template: where the special tokens go around one text or a pair (bertjax/text/templates.py).
      word_start: bool [vocab_size], True where a token begins a word; whole-word masking groups a
        word-start token with the continuation tokens after it. True for the special tokens.
      replacement_ids: int32, the ids masking may put in as "a random token": all but the special
        tokens and placeholders that never occur in text, so the model is not shown impossible inputs.
    """

    vocab: list[str]
    lower_case: bool
    special_tokens: tuple = SPECIAL_TOKENS

    def _set_ids(self, token_to_id: dict, word_start: np.ndarray, never_in_text: np.ndarray):
        self.vocab_size = len(self.vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            token_to_id[t] for t in self.special_tokens
        )
        self.special_ids = np.array([token_to_id[t] for t in self.special_tokens], np.int32)
        self.word_start = word_start.astype(bool)
        self.word_start[self.special_ids] = True
        never_in_text = never_in_text.astype(bool)
        never_in_text[self.special_ids] = True
        self.replacement_ids = np.flatnonzero(~never_in_text).astype(np.int32)

    @property
    def mask_token(self) -> str:
        return self.special_tokens[templates.SPECIAL_ROLES.index("mask")]

    @property
    def template(self) -> templates.Template:
        return templates.bert_template(self.cls_id, self.sep_id)

    def _tokenize_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        raise NotImplementedError

    def encode_with_masks(self, text: str) -> tuple[list[int], list[int]]:
        """The ids of a text (no special tokens added) in which each written mask token (mask_token) is
        the mask id, and where those are: what fill_mask feeds the model."""
        ids, where = [], []
        for i, piece_ids in enumerate(self.encode(text.split(self.mask_token))):
            if i:
                where.append(len(ids))
                ids.append(self.mask_id)
            ids.extend(piece_ids)
        return ids, where

    def tokenize(self, texts: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
        """[N] strings -> ragged int32 [N, (tokens)]; a scalar string -> int32 [tokens].

        No [CLS]/[SEP] are added: pair building does that.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            return self.tokenize(texts[tf.newaxis])[0]
        if texts.shape.rank != 1:
            raise ValueError(f"tokenize expects a scalar or [N] strings, got shape {texts.shape}")
        return self._tokenize_batch(texts)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Eager convenience: Python strings -> lists of ids."""
        if not texts:
            return []
        return self.tokenize(tf.constant(list(texts), tf.string)).to_list()

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """Every text's ids as int32 arrays (no special tokens), in chunks of _ENCODE_CHUNK texts: a whole
        fine-tuning set at once (bertjax/tasks/features.py), one ragged batch's memory bounded."""
        out = []
        for start in range(0, len(texts), _ENCODE_CHUNK):
            ragged = self.tokenize(tf.constant(texts[start:start + _ENCODE_CHUNK], tf.string))
            flat = ragged.flat_values.numpy().astype(np.int32)
            splits = ragged.row_splits.numpy()
            out.extend(flat[splits[i]:splits[i + 1]] for i in range(len(splits) - 1))
        return out

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]


class WordPieceTokenizer(Tokenizer):
    """WordPiece tokenizer whose `tokenize` runs as TF ops (eager or inside tf.data).

    Args:
      vocab_path: vocab.txt, one token per line; must contain all of SPECIAL_TOKENS.
      lower_case: True for uncased vocabularies (lower-case and strip accents), False for cased.
    """

    kind = "wordpiece"  # its name for load_tokenizer and in checkpoints

    def __init__(self, vocab_path: str, lower_case: bool = True):
        self.vocab = load_vocab(vocab_path)
        self.lower_case = lower_case
        token_to_id = {t: i for i, t in enumerate(self.vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in token_to_id]
        if missing:
            more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
            raise ValueError(
                f"vocab {vocab_path} lacks {missing[0]}{more}: add these tokens, one per line"
            )
        self._set_ids(
            token_to_id,
            word_start=np.array([not t.startswith("##") for t in self.vocab]),
            never_in_text=np.array([bool(_UNUSED_WORDPIECE.fullmatch(t)) for t in self.vocab]),
        )
        # no_pretokenization: words arrive already split by our HF-compatible basic tokenizer.
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=self.vocab,
            suffix_indicator="##",
            max_bytes_per_word=4 * MAX_CHARS_PER_WORD,
            token_out_type=tf.int32,
            unknown_token="[UNK]",
            no_pretokenization=True,
        )

    def _tokenize_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        words = basic_tokenize(texts, self.lower_case)  # [N, (W)]
        flat = words.flat_values  # [sum W]
        # Over-long words become the literal "[UNK]", which WordPiece maps to the one unk id.
        too_long = tf.strings.length(flat, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD
        flat = tf.where(too_long, "[UNK]", flat)
        pieces = self._wordpiece.tokenize(flat)  # [sum W, (P)]
        return words.with_flat_values(pieces).merge_dims(1, 2)  # [N, (T)]

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


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece tokenizer whose `tokenize` runs as TF ops; ids equal the `sentencepiece` library's.

    Args:
      model_path: a SentencePiece .model holding the pieces [PAD] and [UNK] as its pad and unknown
        pieces and [CLS] [SEP] [MASK] as control (or user-defined) pieces, as
        `python -m bertjax.vocab train --kind=sentencepiece` makes them. Control pieces are
        never produced from text, so a literal "[MASK]" in the corpus stays plain text; a model
        with user-defined ones would map it to the mask id.

    Case and normalization are part of the model (its normalization rule), not an argument;
    `lower_case` reports whether the rule case-folds.
    """

    kind = "sentencepiece"  # its name for load_tokenizer and in checkpoints

    def __init__(self, model_path: str):
        model_path = str(model_path)
        try:
            with tf.io.gfile.GFile(model_path, "rb") as f:
                model = f.read()
        except tf.errors.NotFoundError:
            raise FileNotFoundError(f"SentencePiece model not found: {model_path}") from None
        # The Python processor answers piece types and decodes for humans; the TF op tokenizes.
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        sp = self._processor
        self.vocab = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        token_to_id = {t: i for i, t in enumerate(self.vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in token_to_id]
        if missing:
            raise ValueError(
                f"SentencePiece model {model_path} lacks the pieces {' '.join(missing)}: train it with"
                " `python -m bertjax.vocab train --kind=sentencepiece`, which adds them"
            )
        if sp.unk_id() != token_to_id["[UNK]"]:
            raise ValueError(
                f"SentencePiece model {model_path}: its unknown piece is {sp.id_to_piece(sp.unk_id())!r},"
                " not [UNK]: train it with `python -m bertjax.vocab train --kind=sentencepiece`"
            )
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(model)
        self.lower_case = proto.normalizer_spec.name.endswith("_cf")  # e.g. nmt_nfkc_cf
        self._set_ids(
            token_to_id,
            word_start=np.array([t.startswith(_SENTENCEPIECE_WORD_START) for t in self.vocab]),
            never_in_text=np.array(
                [sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) for i in range(len(self.vocab))]
            ),
        )
        self._sentencepiece = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)

    def _tokenize_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        return self._sentencepiece.tokenize(_replace_invalid_utf8(texts))

    def decode(self, ids) -> str:
        """The text SentencePiece restores (normalized: case-folded if the model folds), with the
        special tokens written out by name, which the library itself would drop."""
        special = set(self.special_ids.tolist())
        parts, run = [], []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i in special:
                parts += [self._processor.decode(run), self.vocab[i]]
                run = []
            else:
                run.append(i)
        parts.append(self._processor.decode(run))
        return " ".join(p for p in parts if p)


class BPETokenizer(Tokenizer):
    """Byte-level BPE whose ids equal transformers' AutoTokenizer on the same tokenizer.json: the engine is
    the `tokenizers` library, the one transformers' own tokenizers run; the file is read by
    bertjax/text/bpe.py.

    As the other tokenizers, a special token written in the text stays plain text (a corpus never injects
    one); fill_mask alone reads the written mask token (encode_with_masks). Inside tf.data the engine runs
    through tf.numpy_function: a pure function of the text, so the stream stays deterministic.

    Args:
      path: a tokenizer.json (model BPE, pre-tokenizer ByteLevel).
      lower_case: lower-case the text first (str.lower), as sentence-transformers does for a module with
        do_lower_case; the vocabulary itself is cased.
    """

    kind = "bpe"  # its name for load_tokenizer and in checkpoints

    def __init__(self, path: str, lower_case: bool = False):
        path = str(path)
        spec = bpe.read_spec(path)
        self.lower_case = bool(lower_case)
        try:
            self._masks = hf_tokenizers.Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # the library's own error types say nothing of the file
            raise ValueError(f"{path}: the tokenizers library cannot read it ({e})") from None
        # Ids only: the file's own truncation and padding (sentence-transformers saves them) would cut or pad.
        self._masks.no_truncation()
        self._masks.no_padding()
        self._engine = hf_tokenizers.Tokenizer.from_str(self._masks.to_str())
        self._engine.encode_special_tokens = True  # a written <mask> is text, not the mask token
        size = self._engine.get_vocab_size(with_added_tokens=True)
        self.vocab = [self._engine.id_to_token(i) or "" for i in range(size)]
        token_to_id = {t: i for i, t in enumerate(self.vocab) if t}
        self._template = bpe.template_of(spec, path)
        self.special_tokens = bpe.special_roles(spec, self._template, self.vocab, path)
        added = {t["id"] for t in spec.get("added_tokens") or [] if t.get("special")}
        self._set_ids(
            token_to_id,
            word_start=np.array([t.startswith(_BYTE_LEVEL_SPACE) for t in self.vocab]),
            never_in_text=np.array([i in added or not t for i, t in enumerate(self.vocab)]),
        )

    @property
    def template(self) -> templates.Template:
        return self._template

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self.lower_case:
            texts = [t.lower() for t in texts]
        return [e.ids for e in self._engine.encode_batch(list(texts), add_special_tokens=False)]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, np.int32) for ids in self.encode(texts)]

    def _tokenize_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        def run(batch: np.ndarray):
            # Undecodable bytes become U+FFFD, as the other tokenizers make them.
            rows = self.encode([t.decode("utf-8", errors="replace") for t in batch.reshape(-1)])
            lengths = np.array([len(r) for r in rows], np.int64)
            return np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum())), lengths

        flat, lengths = tf.numpy_function(run, [texts], [tf.int32, tf.int64], stateful=False)
        return tf.RaggedTensor.from_row_lengths(tf.ensure_shape(flat, [None]), tf.ensure_shape(lengths, [None]))

    def encode_with_masks(self, text: str) -> tuple[list[int], list[int]]:
        """The written mask token as the mask id, its neighbours as AutoTokenizer reads them (where the
        tokenizer.json's mask token strips the space before it, that space too)."""
        text = text.lower().replace(self.mask_token.lower(), self.mask_token) if self.lower_case else text
        ids = self._masks.encode(text, add_special_tokens=False).ids
        return ids, [i for i, token in enumerate(ids) if token == self.mask_id]

    def decode(self, ids) -> str:
        """The text the ids stand for (byte-level BPE restores it exactly), special tokens written out."""
        return self._engine.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=False)


def load_tokenizer(kind: str, path: str, lower_case: bool = True) -> Tokenizer:
    """The tokenizer for config.data.tokenizer: "wordpiece" reads a vocab.txt, "sentencepiece" a
    .model (lower_case is then ignored: the model's own normalization rule decides), "bpe" a Hugging
    Face tokenizer.json of byte-level BPE (lower_case: lower-case the text first, as a
    sentence-transformers module with do_lower_case does)."""
    if kind == "wordpiece":
        return WordPieceTokenizer(path, lower_case=lower_case)
    if kind == "sentencepiece":
        return SentencePieceTokenizer(path)
    if kind == "bpe":
        return BPETokenizer(path, lower_case=lower_case)
    raise ValueError(f"unknown tokenizer {kind!r}: set data.tokenizer to wordpiece, sentencepiece or bpe")
