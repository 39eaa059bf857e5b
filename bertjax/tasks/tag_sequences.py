"""Token tagging data (CoNLL-2003 NER and the user's own CoNLL column files): words, tags and the rows the
encoder reads.

A sentence's words are tokenized one at a time, so a word's pieces never run into its neighbours; its tag
sits at its first piece (the BERT paper's choice, section 5.3) and the other pieces carry no label
(weight 0 in the loss, no vote in the prediction). A sentence whose pieces do not fit in one row is split
into several rows at word boundaries, so every word of every sentence is predicted and scored:

    [CLS] w1 ##p w2 w3 ##p ##p [SEP] [PAD] ...     label_weight  0 1 0 1 1 0 0 0 0 ...
                                                   word_index   -1 0 -1 1 2 -1 -1 -1 -1 ...

Tags are read as BIO (IOB2): IOB1 files (CoNLL-2003's own, where B- appears only between two adjacent
entities of one type) are converted on reading and BIO files pass through unchanged, so either scheme
reads right without being named.

Features (R rows, S max_seq_length; a sentence makes one row or more):
  input_ids, segment_ids, input_mask  int32 [R, S]   [CLS] pieces [SEP] [PAD]...; segment ids all 0
  label          int32 [R, S]   the word's tag index at its first piece, 0 elsewhere (and for unlabelled sets)
  label_weight   float32 [R, S] 1 at each word's first piece of a labelled sentence, 0 elsewhere
  word_index     int32 [R, S]   the word's position in its sentence at its first piece, -1 elsewhere: marks
                                the first pieces whether or not the set has tags (what prediction reads)
  idx            int32 [R]      the row's sentence (its TagExample.idx)
  example_weight float32 [R]    1 for a real row; eval batching pads with 0
"""

import dataclasses
import os
import re

import numpy as np

from bertjax.tasks.registry import CONLL2003_TAGS  # TFDS conll2003's ClassLabel order, as BIO
from bertjax.text import files, tf_cpu

__all__ = ["CONLL2003_TAGS", "TagExample", "to_bio", "read_conll", "read_tfds_conll", "featurize_tagging",
           "tags_from_predictions"]


@dataclasses.dataclass(frozen=True)
class TagExample:
    """A sentence: its words and their tags (None for a set without tags).

    idx: the sentence's number in its set (from 0, file or TFDS order); rows and predictions name it.
    """

    idx: int
    words: tuple[str, ...]
    tags: tuple[str, ...] | None


def _entity_type(tag: str) -> str | None:
    return tag[2:] if tag[:2] in ("B-", "I-") else None


def to_bio(tags) -> tuple[str, ...]:
    """IOB1 -> BIO: an I-X that does not continue an entity of type X (after O, another type, or at the
    start) begins one, B-X. BIO is a fixed point (its I-X always continue an X), so both schemes read
    right without being told which; a B-X after an X stays B-X (two adjacent entities)."""
    out, previous = [], None
    for tag in tags:
        tag = str(tag)
        if tag.startswith("I-") and previous != tag[2:]:
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = _entity_type(tag)
    return tuple(out)


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------

# Columns are separated by ASCII whitespace only: str.split() would also split at a no-break space or
# U+2028 inside a word, and then a line would seem to have an extra column.
_COLUMNS = re.compile(r"[^ \t\r\n\f\v]+")


def read_conll(path: str, labels: tuple[str, ...] | None, labeled: bool = True) -> list[TagExample]:
    """CoNLL column files -> TagExamples, in file order.

    One word per line, whitespace-separated columns, the word first and its tag in the last column
    (2-column "word tag", 4-column CoNLL-2003 "word POS chunk tag"); blank lines between sentences (any
    number of them); -DOCSTART- lines skipped. Every token line has the first token line's column count.
    Tags are read as BIO (to_bio) and, where `labels` is given, must be tags of the task. A set read with
    labeled=False may be one column (words only: tags None); where it has tags they are checked all the
    same. Every problem is one ValueError line naming the file (and line).
    """
    path = os.fspath(path)
    examples = []
    for words, tags, numbers in _sentences(path, files.read_text(path, "a CoNLL column file"), labeled):
        bio = _checked_tags(path, tags, numbers, labels) if tags else None
        examples.append(TagExample(len(examples), tuple(words), bio))
    if not examples:
        raise ValueError(f"{path}: no sentences: expected a word and its tag per line, a blank line between "
                         "sentences")
    return examples


def _sentences(path: str, text: str, labeled: bool):
    """(words, tags, line numbers) of each sentence; the column counts checked line by line."""
    words, tags, numbers = [], [], []
    columns = first_line = None
    # Lines end at "\n" only ("\r\n" too): str.splitlines() would also end one at U+2028 or U+0085
    # inside a word, and every later line number would be off.
    for number, line in enumerate(text.split("\n"), start=1):
        fields = _COLUMNS.findall(line)
        if not fields or fields[0].startswith("-DOCSTART-"):
            if words:
                yield words, tags, numbers
            words, tags, numbers = [], [], []
            continue
        if columns is None:
            columns, first_line = len(fields), number
            if columns < 2 and labeled:
                raise ValueError(f"{path}:{number}: one column: expected the word and its tag (word ... tag), "
                                 "a blank line between sentences")
        elif len(fields) != columns:
            raise ValueError(f"{path}:{number}: {len(fields)} columns, expected {columns} as in line {first_line}"
                             " (the word first, its tag last)")
        words.append(fields[0])
        numbers.append(number)
        if columns >= 2:
            tags.append(fields[-1])
    if words:
        yield words, tags, numbers


def _checked_tags(path: str, tags: list[str], numbers: list[int], labels: tuple[str, ...] | None) -> tuple:
    """A sentence's tags as BIO, each a tag of the task where `labels` is given."""
    bio = to_bio(tags)
    if labels is not None:
        for number, tag, read_as in zip(numbers, tags, bio):
            if read_as not in labels:
                shown = f"{tag!r}" + (f" (read as {read_as!r})" if read_as != tag else "")
                raise ValueError(f"{path}:{number}: tag {shown} is not a tag of the task: expected one of "
                                 f"{', '.join(labels)}")
    return bio


def read_tfds_conll(split: str, data_dir: str | None = None) -> list[TagExample]:
    """TFDS conll2003's split (train, dev, test) -> TagExamples, tags by name as BIO.

    The tag names come from the builder's own ClassLabel, not from CONLL2003_TAGS, so a reordered
    dataset version cannot silently swap tags. Empty sentences (TFDS's generator may yield one at the
    end of a file) are skipped.
    """
    tfds = tf_cpu.import_tensorflow_datasets()  # here: the task kinds import this module without TensorFlow

    ds, info = tfds.load("conll2003", split=split, data_dir=data_dir, shuffle_files=False, with_info=True)
    names = info.features["ner"].feature.names
    examples = []
    for n, row in enumerate(tfds.as_numpy(ds)):
        words = tuple(w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in row["tokens"])
        ner = [int(t) for t in row["ner"]]
        if len(ner) != len(words):
            raise ValueError(f"TFDS conll2003 split {split} example {n}: {len(words)} tokens but {len(ner)} tags")
        if words:
            examples.append(TagExample(len(examples), words, to_bio([names[t] for t in ner])))
    if not examples:
        raise ValueError(f"TFDS conll2003 split {split} is empty")
    return examples


# ----------------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------------


def _rows_of(sizes: list[int], room: int) -> list[tuple[int, int]]:
    """Words [first, stop) per row: greedy at word boundaries, at most `room` pieces a row, no overlap.
    `sizes` are the words' piece counts, each already cut to `room`."""
    rows, first, used = [], 0, 0
    for n, size in enumerate(sizes):
        if used + size > room and n > first:
            rows.append((first, n))
            first, used = n, 0
        used += size
    rows.append((first, len(sizes)))
    return rows


def _check_examples(examples, index: dict) -> None:
    """Problems featurizing would hide: tags that are not the task's, tag counts, repeated idx."""
    seen = set()
    for e in examples:
        if e.idx in seen:
            raise ValueError(f"sentence idx {e.idx} appears twice: rows and predictions name sentences by idx")
        seen.add(e.idx)
        if e.tags is None:
            continue
        if len(e.tags) != len(e.words):
            raise ValueError(f"sentence {e.idx}: {len(e.words)} words but {len(e.tags)} tags")
        for n, tag in enumerate(e.tags):
            if tag not in index:
                raise ValueError(f"sentence {e.idx}, word {n} ({e.words[n]!r}): tag {tag!r} is not a tag of the "
                                 f"task: expected one of {', '.join(index)}")


def featurize_tagging(examples: list[TagExample], labels: tuple[str, ...], tokenizer,
                      max_seq_length: int) -> dict[str, np.ndarray]:
    """Sentences -> the rows of the module docstring (a long sentence makes several)."""
    if max_seq_length < 3:
        raise ValueError(f"data.max_seq_length={max_seq_length}: needs at least 3 ([CLS] word [SEP])")
    if not examples:
        raise ValueError("no sentences to featurize")
    index = {tag: i for i, tag in enumerate(labels)}
    _check_examples(examples, index)
    # One batched tokenizer call over every word of the set; a word the tokenizer drops whole (control
    # characters only) becomes [UNK], so every word has a first piece to carry its tag and prediction.
    room = max_seq_length - 2
    unk = np.array([tokenizer.unk_id], np.int32)
    pieces = [p[:room] if len(p) else unk
              for p in tokenizer.encode_arrays([w for e in examples for w in e.words])]
    rows = []  # (example, its first word's place in `pieces`, first word, stop word)
    w = 0
    for e in examples:
        sizes = [len(p) for p in pieces[w:w + len(e.words)]]
        rows.extend((e, w, first, stop) for first, stop in _rows_of(sizes, room))
        w += len(e.words)
    num, s = len(rows), max_seq_length
    input_ids = np.full((num, s), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((num, s), np.int32)
    label = np.zeros((num, s), np.int32)
    label_weight = np.zeros((num, s), np.float32)
    word_index = np.full((num, s), -1, np.int32)
    idx = np.empty(num, np.int32)
    for r, (e, start, first, stop) in enumerate(rows):
        idx[r] = e.idx
        input_ids[r, 0], at = tokenizer.cls_id, 1
        for n in range(first, stop):
            p = pieces[start + n]
            input_ids[r, at:at + len(p)] = p
            word_index[r, at] = n
            if e.tags is not None:
                label[r, at], label_weight[r, at] = index[e.tags[n]], 1.0
            at += len(p)
        input_ids[r, at] = tokenizer.sep_id
        input_mask[r, :at + 1] = 1
    return {"input_ids": input_ids, "segment_ids": np.zeros((num, s), np.int32), "input_mask": input_mask,
            "label": label, "label_weight": label_weight, "word_index": word_index, "idx": idx,
            "example_weight": np.ones(num, np.float32)}


def tags_from_predictions(features: dict[str, np.ndarray], predicted: np.ndarray, labels: tuple[str, ...],
                          num_words_per_example) -> dict[int, list[str]]:
    """Each sentence's predicted tag per word, {idx: [tag, ...]}, read at the words' first pieces and
    reassembled across the sentence's rows.

    predicted: int [R, S] tag indices for the rows of `features` (argmax of the logits).
    num_words_per_example: {idx: number of words}, or the TagExamples themselves. Every word must get a
    tag: a word with no row means the features are not this set's.
    """
    if isinstance(num_words_per_example, dict):
        counts = {int(i): int(n) for i, n in num_words_per_example.items()}
    else:
        counts = {e.idx: len(e.words) for e in num_words_per_example}
    predicted = np.asarray(predicted)
    word_index = features["word_index"]
    if predicted.shape != word_index.shape:
        raise ValueError(f"predictions have shape {predicted.shape}, the features' rows {word_index.shape}")
    out = {i: [None] * n for i, n in counts.items()}
    real = features["example_weight"] > 0  # eval padding rows repeat a real row: they add nothing
    rows, positions = np.nonzero((word_index >= 0) & real[:, None])
    for r, s in zip(rows, positions):
        i, n, t = int(features["idx"][r]), int(word_index[r, s]), int(predicted[r, s])
        if i not in out or n >= len(out[i]):
            raise ValueError(f"row {r} holds word {n} of sentence {i}, which the set does not have: the "
                             "features are not this set's")
        if not 0 <= t < len(labels):
            raise ValueError(f"row {r}, position {s}: predicted tag index {t}, the task has {len(labels)} tags")
        out[i][n] = labels[t]
    missing = next(((i, n) for i, tags in out.items() for n, t in enumerate(tags) if t is None), None)
    if missing is not None:
        raise ValueError(f"sentence {missing[0]}: word {missing[1]} has no row: the features are not this set's")
    return out
