"""Learning a vocabulary from text: a WordPiece vocab.txt or a SentencePiece .model.

    python -m bertjax.vocab train --input='corpus/*.txt.gz' --vocab_size=30522 \\
        --kind=wordpiece --out=vocab.txt [--lower_case=true] [--max_sentences=N]

The library functions take explicit arguments and any iterable of strings, so a training run can
learn the vocabulary of its own corpus in-process:

    path = learn_wordpiece_vocab(sentences, vocab_size=8000, lower_case=True, out_path="vocab.txt")
    path = learn_sentencepiece_model(sentences, vocab_size=8000, out_path="sp.model", lower_case=True)

WordPiece words come from `tokenizers.basic_tokenize`, the op the tokenizer itself uses, so the
vocabulary is learned on exactly the words it will later be asked for (docs/data.md says why not
tensorflow_text's learner). The learner is byte-pair-encoding style merging written with WordPiece's
"##" continuation marks, as Hugging Face's WordPieceTrainer does: start from single characters,
repeatedly merge the most frequent adjacent pair of pieces inside words into a new piece. Every
character seen is kept both as itself and as "##c" (except characters the basic tokenizer always
splits off), so no word is [UNK] merely for lack of a character. Ties are broken by the pieces'
spelling, so the same text always gives the same file.
"""

import collections
import heapq
import io
import itertools
import logging
import os
from typing import Iterable, Iterator, Mapping, Sequence

import sentencepiece

from bertjax.text import files, tf_cpu
from bertjax.text.tokenizers import ALWAYS_SPLIT_CHAR, MAX_CHARS_PER_WORD, SPECIAL_TOKENS, basic_tokenize

tf = tf_cpu.import_tensorflow()

log = logging.getLogger(__name__)


def read_text_lines(input_pattern: str, max_lines: int | None = None) -> Iterator[str]:
    """The sentences (non-blank lines, whitespace runs collapsed) of local text files, as the input
    pipeline reads data.text_format=sentences, so a vocabulary learned here and one learned in a run's
    workdir see the same text.

    Args:
      input_pattern: comma-separated globs; plain or gzip files.
      max_lines: stop after this many lines (None: read everything).

    The files are listed now, so a pattern that matches nothing fails here (FileNotFoundError) rather
    than at the first read; lines are read lazily, and invalid UTF-8 raises ValueError naming the file
    and line.
    """
    paths = files.expand_pattern(input_pattern)
    lines = (" ".join(line.split()) for path in paths for _, line in files.read_lines(path))
    return itertools.islice((line for line in lines if line), max_lines)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def count_words(sentences: Iterable[str], lower_case: bool, batch_size: int = 4096) -> dict[str, int]:
    """How often each word of basic tokenization occurs. Words over MAX_CHARS_PER_WORD characters
    are left out: the tokenizer makes them [UNK] whatever the vocabulary."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def unique_words(texts):
        words = basic_tokenize(texts, lower_case).flat_values
        words = tf.boolean_mask(words, tf.strings.length(words, unit="UTF8_CHAR") <= MAX_CHARS_PER_WORD)
        unique, _, counts = tf.unique_with_counts(words)  # far fewer Python steps than one per word
        return unique, counts

    counts = collections.Counter()
    for batch in _batches(sentences, batch_size):
        unique, n = unique_words(tf.constant(batch, tf.string))
        for word, k in zip(unique.numpy().tolist(), n.numpy().tolist()):
            counts[word] += k
    return {word.decode("utf-8"): n for word, n in counts.items()}


def learn_wordpiece(
    word_counts: Mapping[str, int],
    vocab_size: int,
    always_split: Iterable[str] = (),
    reserved: Sequence[str] = SPECIAL_TOKENS,
    min_frequency: int = 2,
) -> list[str]:
    """WordPiece tokens learned from word counts (see the module docstring).

    Args:
      word_counts: word -> occurrences, words as basic tokenization gives them.
      vocab_size: the most tokens to return, reserved ones included.
      always_split: characters that are always words of their own (no "##" form is added).
      reserved: tokens placed first, in this order (the special tokens).
      min_frequency: stop merging when the most frequent pair occurs fewer times than this; a piece
        seen once is memorization, not a reusable subword. The result may then be short.

    Returns the tokens: reserved, single characters (most frequent first), their "##" forms, then
    the merged pieces in the order they were learned.
    """
    always_split = set(always_split)
    vocab = list(dict.fromkeys(reserved))
    if vocab_size <= len(vocab):
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the {len(vocab)} reserved tokens")
    kept = _kept_characters(word_counts, vocab_size, len(vocab), always_split)
    vocab += kept + ["##" + c for c in kept if c not in always_split]
    return _merge_pieces(word_counts, kept, vocab, vocab_size, min_frequency)


def _kept_characters(word_counts: Mapping[str, int], vocab_size: int, reserved: int,
                     always_split: set[str]) -> list[str]:
    """Characters, most frequent first; if even they do not all fit beside the reserved tokens (a "##"
    form costs one more), the rarest are left out (their words become [UNK]), which only happens for
    tiny vocabularies or huge alphabets."""
    char_counts = collections.Counter()
    for word, n in word_counts.items():
        for c in word:
            char_counts[c] += n
    kept, room = [], vocab_size - reserved
    for c in sorted(char_counts, key=lambda c: (-char_counts[c], c)):
        cost = 1 if c in always_split else 2
        if cost > room:
            break
        kept.append(c)
        room -= cost
    if len(kept) < len(char_counts):
        log.warning("vocab_size %d holds only %d of the %d characters seen; the rest will be [UNK]",
                    vocab_size, len(kept), len(char_counts))
    return kept


def _merge_pieces(word_counts: Mapping[str, int], kept: list[str], vocab: list[str], vocab_size: int,
                  min_frequency: int) -> list[str]:
    """vocab extended by merged pieces, most frequent pair first, until vocab_size or min_frequency."""
    vocab, in_vocab = list(vocab), set(vocab)
    words, counts, pair_counts, holders = _index_pairs(word_counts, kept)
    # Max-heap of (-count, left, right): the spelling breaks ties, so the order never depends on
    # dict or set iteration. Entries go stale as counts change; a stale one is re-pushed with the
    # current count when it surfaces, which is correct because counts of existing pairs only fall
    # (every rise is pushed at once).
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        negative, a, b = heapq.heappop(heap)
        n = pair_counts.get((a, b), 0)
        if n != -negative:
            if n > 0:
                heapq.heappush(heap, (-n, a, b))
            continue
        if n < min_frequency:
            break
        merged = a + b[2:]  # b is a "##" piece: it never starts a word
        if merged not in in_vocab:  # the same piece can be reached by two merge paths
            vocab.append(merged)
            in_vocab.add(merged)
        risen = _apply_merge(words, counts, holders.pop((a, b)), (a, b), merged, pair_counts, holders)
        del pair_counts[(a, b)]
        for pair in risen:
            heapq.heappush(heap, (-pair_counts[pair], *pair))
    return vocab


def _index_pairs(word_counts: Mapping[str, int], kept: list[str]):
    """Each word spelled in kept characters as a list of pieces, its count, and each adjacent pair's
    count and holders (the indices of the words that contain it): merges rewrite only those words."""
    kept_set = set(kept)
    words, counts = [], []
    for word, n in word_counts.items():
        if len(word) > 1 and kept_set.issuperset(word):
            words.append([word[0]] + ["##" + c for c in word[1:]])
            counts.append(n)
    pair_counts = collections.Counter()
    holders = collections.defaultdict(set)  # pair -> indices of the words that contain it
    for i, pieces in enumerate(words):
        for pair in zip(pieces, pieces[1:]):
            pair_counts[pair] += counts[i]
            holders[pair].add(i)
    return words, counts, pair_counts, holders


def _apply_merge(words: list[list[str]], counts: list[int], indices: Iterable[int], pair: tuple[str, str],
                 merged: str, pair_counts: collections.Counter, holders: Mapping[tuple, set]) -> set[tuple]:
    """Rewrites the words at indices with pair merged, updating the pair counts and holders in place;
    returns the pairs that hold the new piece (their counts rose)."""
    a, b = pair
    risen = set()
    for i in indices:
        old, new, j = words[i], [], 0
        while j < len(old):
            if j + 1 < len(old) and old[j] == a and old[j + 1] == b:
                new.append(merged)
                j += 2
            else:
                new.append(old[j])
                j += 1
        for p in zip(old, old[1:]):
            pair_counts[p] -= counts[i]
            holders[p].discard(i)
        for p in zip(new, new[1:]):
            pair_counts[p] += counts[i]
            holders[p].add(i)
            if merged in p:
                risen.add(p)
        words[i] = new
    return risen


def learn_wordpiece_vocab(sentences: Iterable[str], vocab_size: int, lower_case: bool, out_path: str) -> str:
    """Learns a WordPiece vocabulary from text and writes it as a vocab.txt; returns out_path.

    The file starts with [PAD] [UNK] [CLS] [SEP] [MASK] and has exactly vocab_size lines, or fewer
    when the text has fewer pieces worth keeping (a warning says so). lower_case must be the value
    the WordPieceTokenizer will use.
    """
    if vocab_size <= len(SPECIAL_TOKENS):  # before reading what may be a large corpus
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the special tokens")
    word_counts = count_words(sentences, lower_case)
    if not word_counts:
        raise ValueError("no words to learn a vocabulary from: the text is empty")
    chars = sorted({c for word in word_counts for c in word})
    split_alone = tf.strings.regex_full_match(tf.constant(chars), ALWAYS_SPLIT_CHAR).numpy()
    tokens = learn_wordpiece(
        word_counts, vocab_size, always_split=[c for c, s in zip(chars, split_alone) if s]
    )
    if len(tokens) < vocab_size:
        log.warning("the text gives only %d WordPiece tokens (asked for %d): writing %d",
                    len(tokens), vocab_size, len(tokens))
    _write_atomically(out_path, ("\n".join(tokens) + "\n").encode("utf-8"))
    return out_path


def learn_sentencepiece_model(sentences: Iterable[str], vocab_size: int, out_path: str, lower_case: bool) -> str:
    """Trains a SentencePiece unigram model; writes it to out_path and returns out_path.

    A .vocab listing (piece, score) is written beside it: out_path with ".model" replaced by
    ".vocab", or with ".vocab" appended if out_path does not end in ".model". The pieces bertjax needs are
    placed first: [PAD] (pad, id 0),
    [UNK] (unknown, id 1), then [CLS] [SEP] [MASK]. Those three are control symbols, not the
    user-defined symbols often used: control pieces are never produced from text, so a corpus line
    containing "[MASK]" cannot inject a mask (as with WordPiece). No BOS/EOS: pair building adds
    [CLS]/[SEP]. vocab_size is a soft limit (hard_vocab_limit=False), so a small text gives a
    smaller model instead of an error. One thread and a fixed seed make it deterministic.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the special tokens")
    listing_path = (out_path[: -len(".model")] if out_path.endswith(".model") else out_path) + ".vocab"
    model = _train_sentencepiece(sentences, _sentencepiece_options(vocab_size, lower_case))
    # The .vocab the spm_train program writes beside the model: piece <tab> score, for humans.
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    listing = "".join(
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n" for i in range(processor.get_piece_size())
    )
    _write_atomically(listing_path, listing.encode("utf-8"))
    _write_atomically(out_path, model)
    return out_path


def _sentencepiece_options(vocab_size: int, lower_case: bool) -> dict:
    """The trainer's settings (see learn_sentencepiece_model for why each)."""
    return dict(
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        pad_id=0,
        pad_piece="[PAD]",
        unk_id=1,
        unk_piece="[UNK]",
        bos_id=-1,
        eos_id=-1,
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        # NFKC plus the NMT clean-ups; "_cf" adds case folding for an uncased model.
        normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
        # Paragraph-per-line corpora have lines far over the default 4,192 bytes, which the
        # trainer would otherwise skip.
        max_sentence_length=1 << 16,
        num_threads=1,
        minloglevel=2,  # warnings and errors only
    )


def _train_sentencepiece(sentences: Iterable[str], options: dict) -> bytes:
    """The serialized model the trainer learns from the non-blank sentences; its failures raised as
    ValueError in one line, or as the exception reading the sentences raised."""
    # Written to memory, not to a model_prefix: the trainer records model_prefix inside the model,
    # which would make the bytes depend on where they are written.
    model = io.BytesIO()
    # The trainer pulls lines from C++ and reports an exception raised while reading them (say,
    # invalid UTF-8) as a RuntimeError holding a traceback; keep the original to raise it instead.
    failures, lines_read = [], [0]

    def lines():
        try:
            for s in sentences:
                if s.strip():
                    lines_read[0] += 1
                    yield s
        except Exception as e:
            failures.append(e)
            raise

    sentencepiece.set_random_generator_seed(0)
    try:
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=lines(), model_writer=model, **options)
    except RuntimeError as e:
        if failures:
            raise failures[0] from None
        if not lines_read[0]:
            raise ValueError("no text to learn a SentencePiece model from: the text is empty") from None
        raise ValueError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1]}") from None
    return model.getvalue()


def _write_atomically(path: str, data: bytes):
    # A run that caches its learned vocabulary must never find a half-written one after a crash.
    directory = os.path.dirname(path)
    if directory:
        tf.io.gfile.makedirs(directory)
    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "wb") as f:
        f.write(data)
    tf.io.gfile.rename(temporary, path, overwrite=True)
