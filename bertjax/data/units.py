"""The units of data.masking="units": a lexicon file's phrases and entities (one a line), and the words a
segmenter finds in the training text of scripts written without spaces, each tokenized as the corpus is
(so case-folded as the tokenizer folds) and kept as the hash masking matches (bertjax/data/spans.py)."""

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


