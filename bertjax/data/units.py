"""The units of data.masking="units": a lexicon file's phrases and entities (one a line), and the words a
segmenter finds in the training text of scripts written without spaces, each tokenized as the corpus is
(so case-folded as the tokenizer folds) and kept as the hash masking matches: in each example
(bertjax/data/spans.py), or once over a whole corpus for the stream (corpus_unit_starts)."""

import numpy as np

from bertjax.text import files, word_segmentation

# Longest unit, in words, that masking matches: a longer lexicon entry is left out (each extra word is one
# more vector pass per example).
MAX_UNIT_WORDS = 8


def check(settings) -> None:
    """The units' inputs, before anything heavy: the lexicon file exists and holds a unit, the segmenter is
    installed. One line each."""
    if "units" not in (settings.masking, settings.eval_masking):
        return
    if settings.units_lexicon:
        read_lexicon(settings.units_lexicon)
    if settings.word_segmenter != "none":
        word_segmentation.check_installed(settings.word_segmenter)


def read_lexicon(path: str) -> list[str]:
    """The lexicon's units: its non-blank lines, stripped."""
    if not files.path(path).exists():
        raise ValueError(f"data.units_lexicon={path} does not exist: give a text file, one unit a line")
    entries = [line.strip() for _, line in files.read_lines(path) if line.strip()]
    if not entries:
        raise ValueError(f"data.units_lexicon={path} is empty: give one unit (a phrase or an entity) a line")
    return entries


def lexicon_for(settings, tokenizer, documents) -> tuple[np.ndarray, int]:
    """(sorted int64 unit hashes, most words in a unit) from data.units_lexicon and data.word_segmenter.

    documents: the training documents (lists of sentences) the segmenter reads; None where the source is
    tokenized already (no text to segment)."""
    entries = read_lexicon(settings.units_lexicon) if settings.units_lexicon else []
    if settings.word_segmenter != "none":
        if documents is None:
            raise ValueError(f"data.word_segmenter={settings.word_segmenter!r} reads the training text, and "
                             f"data.source={settings.source!r} holds token ids: give the units as "
                             f"data.units_lexicon instead")
        entries += sorted(set(word_segmentation.words(
            settings.word_segmenter, (sentence for document in documents for sentence in document))))
    if getattr(tokenizer, "kind", "") == "bpe":  # byte-level BPE marks a word by the space before it
        entries += [" " + entry for entry in entries]
    return lexicon_units(tokenizer.encode_arrays(entries) if entries else [],
                         np.asarray(tokenizer.word_start, bool), MAX_UNIT_WORDS)


# --- The hash masking matches (each example's side: bertjax/data/spans.py) ---------------------------
# A unit of tokens t_a .. t_(b-1) hashes to sum (t_i + 1) * BASE^(i - a) mod MODULUS, times 64 plus its
# length (capped at 63). Both sides (the lexicon in numpy, the example in TF) compute the same value; a
# false match needs a collision of a 31-bit hash at equal length.
MODULUS = 2_147_483_629  # a prime below 2**31: products of two residues fit in int64
BASE = 1_000_003
MAX_LENGTH = 8192  # longest example whose units are hashed (ModernBERT's longest context)
BASE_POWERS = np.array([pow(BASE, i, MODULUS) for i in range(MAX_LENGTH + 1)], np.int64)
INVERSE_POWERS = np.array([pow(BASE, -i, MODULUS) for i in range(MAX_LENGTH + 1)], np.int64)


def unit_hash(ids) -> int:
    """The hash of one unit's token ids (the lexicon side)."""
    h = sum((int(t) + 1) * int(BASE_POWERS[i]) for i, t in enumerate(ids)) % MODULUS
    return h * 64 + min(len(ids), 63)


def lexicon_units(entries_ids, word_start: np.ndarray, max_words: int) -> tuple[np.ndarray, int]:
    """The lexicon as (sorted int64 hashes, the most words a unit has). entries_ids: each entry's token
    ids (no special tokens); an entry of one word is a word already and is left out, as is one longer
    than max_words words."""
    hashes, longest = set(), 1
    for ids in entries_ids:
        words = int(np.sum(word_start[np.asarray(ids, np.int64)])) if len(ids) else 0
        if 2 <= words <= max_words and word_start[ids[0]]:
            hashes.add(unit_hash(ids))
            longest = max(longest, words)
    return np.array(sorted(hashes), np.int64), longest




# --- Units found once per corpus: what the stream masks by --------------------------------------------
# A document's units depend only on its text and the lexicon, never on the step or the seed, so the stream
# finds them once (corpus_unit_starts, in numpy, when it is built) and each example reads a mark per token
# with its tokens, instead of matching the lexicon again every time the example is masked.

CHUNK_TOKENS = 1 << 20  # tokens matched at once (whole sentences): bounds the memory of the match


def corpus_unit_starts(corpus, word_start: np.ndarray, unit_hashes: np.ndarray, max_words: int,
                       chunk_tokens: int = CHUNK_TOKENS) -> np.ndarray:
    """bool [num_tokens]: the tokens of a TokenizedCorpus that begin a unit (sentence_unit_starts), found
    sentence by sentence, a chunk of whole sentences at a time (a mapped corpus is read, never held whole)."""
    starts = np.asarray(corpus.sentence_starts, np.int64)
    out = np.zeros(len(corpus.tokens), bool)
    s, last = 0, len(starts) - 1
    while s < last:
        e = int(np.searchsorted(starts, starts[s] + chunk_tokens, side="right")) - 1
        e = min(max(e, s + 1), last)
        a, b = int(starts[s]), int(starts[e])
        out[a:b] = sentence_unit_starts(np.asarray(corpus.tokens[a:b]), starts[s:e + 1] - a, word_start,
                                        unit_hashes, max_words)
        s = e
    return out


def sentence_unit_starts(ids: np.ndarray, sentence_starts: np.ndarray, word_start: np.ndarray,
                         unit_hashes: np.ndarray, max_words: int) -> np.ndarray:
    """bool [n]: of the tokens ids [n] of whole sentences (sentence_starts: [S + 1] offsets, the last n), those
    that begin a unit: at the first word not inside an earlier unit, the longest run of words (up to
    max_words) the lexicon holds, else the word alone; matched from each sentence's start, so a unit never
    crosses a sentence's end. The example side's lexicon match (bertjax/data/spans.py), on a whole corpus."""
    n = len(ids)
    begins_sentence = np.zeros(n, bool)
    begins_sentence[sentence_starts[:-1][sentence_starts[:-1] < n]] = True
    token_begins_word = word_start[ids]
    positions = np.flatnonzero(token_begins_word | begins_sentence)  # [W] each word's first token
    num_words = len(positions)
    ends = np.append(positions[1:], n)  # [W] one past each word's last token
    sentence = np.cumsum(begins_sentence)[positions]  # [W]
    terms = (ids.astype(np.int64) + 1) * _powers(BASE, n) % MODULUS
    prefix = np.concatenate([[0], np.cumsum(terms) % MODULUS])  # [n + 1], as spans.py's
    inverse = _powers(pow(BASE, -1, MODULUS), n)
    longest = np.ones(num_words, np.int64)
    for m in range(2, max_words + 1):  # increasing, so the longest match is written last
        first = np.arange(max(num_words - m + 1, 0))
        last = first + m - 1
        a, b = positions[first], ends[last]
        h = (prefix[b] - prefix[a]) % MODULUS * inverse[a] % MODULUS * 64 + np.minimum(b - a, 63)
        longest[first[(sentence[last] == sentence[first]) & _held(unit_hashes, h)]] = m
    out = np.zeros(n, bool)
    out[positions[_leftmost_longest(longest, max_words)]] = True
    # A "##" piece that opens a sentence continues the word before it in an example: no unit starts there.
    return out & token_begins_word


def _held(sorted_hashes: np.ndarray, h: np.ndarray) -> np.ndarray:
    """bool, h's shape: the hash is one of the lexicon's."""
    if not len(sorted_hashes):
        return np.zeros(h.shape, bool)
    where = np.minimum(np.searchsorted(sorted_hashes, h), len(sorted_hashes) - 1)
    return sorted_hashes[where] == h


def _leftmost_longest(longest: np.ndarray, max_words: int) -> np.ndarray:
    """[W] bool: the words that begin a unit, matching from the left (spans.py's fixed point, in numpy)."""
    chosen = np.ones(len(longest), bool)
    while True:
        covered = np.zeros(len(longest), bool)
        for d in range(1, max_words):
            covered[d:] |= chosen[:len(longest) - d] & (longest[:len(longest) - d] > d)
        if np.array_equal(~covered, chosen):
            return chosen
        chosen = ~covered


def _powers(base: int, count: int) -> np.ndarray:
    """int64 [count]: base^i mod MODULUS, as products of a table of small and one of large powers."""
    block = 1024
    small = np.ones(block, np.int64)
    for i in range(1, block):
        small[i] = small[i - 1] * base % MODULUS
    step = int(small[-1]) * base % MODULUS  # base^block
    large = np.ones(max(1, -(-count // block)), np.int64)
    for k in range(1, len(large)):
        large[k] = large[k - 1] * step % MODULUS
    return (large[:, None] * small[None, :] % MODULUS).reshape(-1)[:count]
