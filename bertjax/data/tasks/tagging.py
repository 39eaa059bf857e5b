"""Token tagging data (CoNLL-2003 NER and the user's own CoNLL column files): words, tags and the rows the
encoder reads.

A sentence's words are tokenized one at a time; a word's tag sits at its first piece (the BERT paper's
choice, section 5.3) and the other pieces carry no label (weight 0 in the loss and no vote in the
prediction). A sentence whose pieces do not fit in one row is split into several rows at word
boundaries, so every word of every sentence is predicted and scored:

    [CLS] w1 ##p w2 w3 ##p ##p [SEP] [PAD] ...     label_weight  0 1 0 1 1 0 0 0 0 ...

Tags are read as BIO (IOB2): IOB1 files (CoNLL-2003's own, where B- appears only between two entities
of one type) are converted on reading, and BIO files pass through unchanged, so either scheme reads
right without being named.

Features (R rows, S max_seq_length):
  input_ids, segment_ids, input_mask  int32 [R, S]   (segment ids all 0: one sentence)
  label          int32 [R, S]  the word's tag index at its first piece, 0 elsewhere
  label_weight   float32 [R, S] 1 at each word's first piece (of a labelled set), 0 elsewhere
  word_index     int32 [R, S]  the word's position in its sentence at its first piece, -1 elsewhere
  idx            int32 [R]     the row's example (its idx)
  example_weight float32 [R]   1 for a real row; eval batching pads with 0
"""

import dataclasses
import os

import numpy as np

from bertjax.data.tasks import features as task_features
from bertjax.data.tasks.registry import CONLL2003_TAGS  # noqa: F401  (TFDS conll2003's tag set, as BIO)


@dataclasses.dataclass(frozen=True)
class TagExample:
    """A sentence: its words and their tags (None for a set without tags)."""

    idx: int
    words: tuple[str, ...]
    tags: tuple[str, ...] | None


def to_bio(tags) -> tuple[str, ...]:
    """IOB1 -> BIO: an I-X that does not continue an entity of type X begins one (B-X); BIO is unchanged."""
    out, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = tag
    return tuple(out)


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------


def read_conll(path: str, labels: tuple[str, ...] | None, labeled: bool = True) -> list[TagExample]:
    """CoNLL column files: a word per line, whitespace-separated columns, the word first and its tag in
    the last column (2-column "word tag", 4-column CoNLL-2003 "word POS chunk tag"); a blank line
    between sentences; -DOCSTART- lines skipped. A set read with labeled=False may be one column
    (words only). Every problem is one ValueError line naming the file and line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, expected a CoNLL column file")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: invalid UTF-8 ({e.reason})") from None
    examples, words, tags = [], [], []
    columns, first_line = None, None
    known = set(labels) if labels else None

    def close():
        if words:
            examples.append(TagExample(len(examples), tuple(words), to_bio(tags) if tags else None))
            words.clear()
            tags.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            close()
            continue
        if fields[0] == "-DOCSTART-":
            close()
            continue
        if columns is None:
            columns, first_line = len(fields), number
            if columns < 2 and labeled:
                raise ValueError(f"{path}:{number}: one column: expected the word and its tag (word ... tag)")
        elif len(fields) != columns:
            raise ValueError(f"{path}:{number}: {len(fields)} columns, expected {columns} as in line {first_line}")
        words.append(fields[0])
        if columns >= 2:
            tag = fields[-1]
            if known is not None and tag not in known and to_bio([tag])[0] not in known:
                raise ValueError(f"{path}:{number}: tag {tag!r} is not a tag of the task: expected one of "
                                 f"{', '.join(labels)}")
            tags.append(tag)
    close()
    if not examples:
        raise ValueError(f"{path}: no sentences: expected a word and its tag per line, a blank line between sentences")
    if not labeled:
        examples = [dataclasses.replace(e, tags=None) if columns < 2 else e for e in examples]
    return examples


def read_tfds_conll(split: str, data_dir: str | None = None) -> list[TagExample]:
    """TFDS conll2003's split (train, dev, test); its tags, IOB1 or BIO, read as BIO."""
    import tensorflow_datasets as tfds

    builder = tfds.builder("conll2003", data_dir=data_dir)
    names = builder.info.features["ner"].feature.names
    rows = list(tfds.as_numpy(tfds.load("conll2003", split=split, data_dir=data_dir, shuffle_files=False)))
    examples = []
    for row in rows:
        words = tuple(w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in row["tokens"])
        if words:
            examples.append(TagExample(len(examples), words, to_bio([names[int(t)] for t in row["ner"]])))
    if not examples:
        raise ValueError(f"TFDS conll2003 split {split} is empty")
    return examples


# ----------------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------------


def _rows_of(pieces: list[np.ndarray], room: int) -> list[tuple[int, int]]:
    """Words [first, stop) per row: greedy, at word boundaries, at most `room` pieces a row."""
    rows, first, used = [], 0, 0
    for n, p in enumerate(pieces):
        size = min(len(p), room)  # a word longer than a row keeps its first `room` pieces
        if used + size > room and n > first:
            rows.append((first, n))
            first, used = n, 0
        used += size
    rows.append((first, len(pieces)))
    return rows


def featurize_tagging(examples: list[TagExample], labels: tuple[str, ...], tokenizer,
                      max_seq_length: int) -> dict[str, np.ndarray]:
    """Sentences -> the rows in the module docstring."""
    if max_seq_length < 3:
        raise ValueError(f"data.max_seq_length={max_seq_length}: needs at least 3 ([CLS] word [SEP])")
    if not examples:
        raise ValueError("no sentences to featurize")
    index = {tag: i for i, tag in enumerate(labels)}
    all_words = [w for e in examples for w in e.words]
    word_pieces = task_features.tokenize_all(tokenizer, all_words)
    room = max_seq_length - 2
    out = {k: [] for k in ("input_ids", "segment_ids", "input_mask", "label", "label_weight", "word_index", "idx")}
    w = 0
    for e in examples:
        pieces = []
        for _ in e.words:
            p = word_pieces[w]
            w += 1
            # A word the tokenizer drops whole (control characters only) still needs a first piece.
            pieces.append(p if len(p) else np.array([tokenizer.unk_id], np.int32))
        for first, stop in _rows_of(pieces, room):
            ids = np.full(max_seq_length, tokenizer.pad_id, np.int32)
            label = np.zeros(max_seq_length, np.int32)
            weight = np.zeros(max_seq_length, np.float32)
            word_index = np.full(max_seq_length, -1, np.int32)
            ids[0], at = tokenizer.cls_id, 1
            for n in range(first, stop):
                p = pieces[n][:room]
                word_index[at] = n
                if e.tags is not None:
                    if e.tags[n] not in index:
                        raise ValueError(f"sentence {e.idx}, word {n} ({e.words[n]!r}): tag {e.tags[n]!r} is not a "
                                         f"tag of the task: expected one of {', '.join(labels)}")
                    label[at], weight[at] = index[e.tags[n]], 1.0
                ids[at:at + len(p)] = p
                at += len(p)
            ids[at] = tokenizer.sep_id
            mask = np.zeros(max_seq_length, np.int32)
            mask[:at + 1] = 1
            for key, value in (("input_ids", ids), ("segment_ids", np.zeros(max_seq_length, np.int32)),
                               ("input_mask", mask), ("label", label), ("label_weight", weight),
                               ("word_index", word_index), ("idx", e.idx)):
                out[key].append(value)
    features = {k: np.stack(v) if k != "idx" else np.array(v, np.int32) for k, v in out.items()}
    features["example_weight"] = np.ones(len(features["idx"]), np.float32)
    return features


def tags_from_predictions(features: dict[str, np.ndarray], predicted: np.ndarray, labels: tuple[str, ...],
                          examples: list[TagExample]) -> dict[int, list[str]]:
    """Each example's predicted tag per word (by idx), read at the words' first pieces across its rows.
    predicted: int [R, S] tag indices, the rows of `features`."""
    out = {e.idx: [None] * len(e.words) for e in examples}
    rows, positions = np.nonzero(features["word_index"] >= 0)
    for r, s in zip(rows, positions):
        out[int(features["idx"][r])][int(features["word_index"][r, s])] = labels[int(predicted[r, s])]
    missing = next(((i, n) for i, tags in out.items() for n, t in enumerate(tags) if t is None), None)
    if missing is not None:
        raise ValueError(f"sentence {missing[0]}: word {missing[1]} has no row: the features are not this set's")
    return out
