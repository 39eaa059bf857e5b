"""Span question answering (SQuAD v1.1 and v2.0): examples, windows over long contexts, answers back to text.

Pre-processing follows google-research/bert's run_squad.py: the context is split at whitespace into
words, each word is tokenized on its own, the question is cut to max_query_length tokens, and a
context longer than a window is covered by overlapping windows doc_stride tokens apart:

    [CLS] question [SEP] context window [SEP] [PAD] ...   segment ids 0 ... 0 1 ... 1 0 ...

A training answer is labelled by its first and last token; where the answer does not lie wholly inside
a window (or there is none, v2.0) the label is [CLS] (0, 0), as there.

Every context token also carries its character span in the context: the characters of its word that
the tokenizer's normalisation (lower-casing, accent stripping, NFC/NFKC) turned into the token's
text, found by normalising the word one character at a time. A predicted span therefore maps back to
the exact original text, accents, punctuation and inner whitespace included; an [UNK] takes the
characters of the basic word it replaced. Where a word's pieces do not spell its normalised characters
(a normalisation that joins characters, say) each of its pieces takes the whole word's span.

Post-processing follows run_squad.py too: over all windows of an example, the n_best highest start
and end logits of each window make candidate spans that must lie in the context, start at a token
whose window gives it the most context (the score min(left, right) + 0.01 * window length), end at
or after the start, and span at most max_answer_length tokens; the best start + end logit wins. For
v2.0 the no-answer score is the lowest [CLS] start + end logit over the windows; the question is
answered "" when that score beats the best span's by more than a threshold tuned on the dev set.

Features (F windows, S max_seq_length):
  input_ids, segment_ids, input_mask  int32 [F, S]
  label           int32 [F, 2] (start, end) token positions of the answer; (0, 0): none in this window
  idx             int32 [F] the window's example: its position in the example list
  example_weight  float32 [F] 1 for a real window; eval batching pads with 0
  token_start, token_end  int32 [F, S] the token's characters in the context, [start, end); -1 outside it
  max_context     bool [F, S] the window gives the token its most context (post-processing's rule)
"""

import collections
import dataclasses
import functools
import json
import math
import os
import unicodedata

import numpy as np

from bertjax.text import files, tf_cpu


V1 = "v1.1"
V2 = "v2.0"


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question on one context.

    answers / answer_starts: the gold answer texts and their character offsets in the context (all of
    them, as the dev sets list several annotators'); () for an unanswerable v2.0 question or a set
    without answers. The first answer is the one training labels.
    """

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]
    is_impossible: bool = False


@dataclasses.dataclass(frozen=True)
class Settings:
    """The windowing and decoding settings of run_squad.py (its defaults in configs/finetune/squad.py)."""

    max_seq_length: int = 384
    max_query_length: int = 64
    doc_stride: int = 128
    n_best: int = 20
    max_answer_length: int = 30


# ----------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------


def _line_of(text: str, question_id: str) -> int:
    """The line of the file where the question's id is written (1 if it cannot be found)."""
    at = text.find(json.dumps(question_id))
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _checked_answers(qa: dict, context: str, where, require_offsets: bool) -> tuple[tuple[str, ...], tuple[int, ...]]:
    texts, starts = [], []
    for answer in qa.get("answers") or ():
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
            raise ValueError(f"{where()}: each answer needs a 'text' string")
        start = answer.get("answer_start")
        if not isinstance(start, int) or isinstance(start, bool):
            raise ValueError(f"{where()}: answer {answer['text']!r} needs an integer 'answer_start'")
        found = context[start:start + len(answer["text"])]
        if require_offsets and found != answer["text"]:
            raise ValueError(f"{where()}: answer {answer['text']!r} is not at its offset {start} in the context "
                             f"(the context has {found!r} there)")
        texts.append(answer["text"])
        starts.append(start)
    return tuple(texts), tuple(starts)


def read_squad_json(path: str, version: str, labeled: bool = True) -> list[SquadExample]:
    """A SQuAD-format JSON file ({"data": [{"paragraphs": [{"context", "qas": [...]}]}]}) -> examples.

    Every answer's text must stand at its answer_start in the context; v2.0 questions may be
    "is_impossible" with no answers. Problems are one ValueError line naming the file and line.
    """
    path = os.fspath(path)
    text = files.read_text(path, "a SQuAD-format JSON file")
    if not text.strip():
        raise ValueError(f"{path}: empty file: expected SQuAD-format JSON")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{path}: expected SQuAD-format JSON, an object with a 'data' list of articles")
    examples, seen = [], set()
    for article in data["data"]:
        for paragraph in (article or {}).get("paragraphs", []):
            context = paragraph.get("context")
            if not isinstance(context, str):
                raise ValueError(f"{path}: a paragraph has no 'context' string")
            for qa in paragraph.get("qas", []):
                qid = str(qa.get("id", ""))
                where = functools.partial(lambda q: f"{path}:{_line_of(text, q)} (question {q})", qid)
                if not qid or not isinstance(qa.get("question"), str):
                    raise ValueError(f"{where()}: each question needs an 'id' and a 'question' string")
                if qid in seen:
                    raise ValueError(f"{where()}: question id {qid} appears twice")
                seen.add(qid)
                impossible = bool(qa.get("is_impossible", False))
                if impossible and version == V1:
                    raise ValueError(f"{where()}: an unanswerable question (is_impossible) in a v1.1 set: set "
                                     "data.squad_version='v2.0'")
                answers, starts = _checked_answers(qa, context, where, require_offsets=True)
                if labeled and not answers and not impossible:
                    raise ValueError(f"{where()}: no answers: give at least one, or mark the question "
                                     "is_impossible (v2.0)")
                examples.append(SquadExample(qid, qa["question"], context, answers, starts,
                                             impossible or (labeled and not answers)))
    if not examples:
        raise ValueError(f"{path}: no questions found")
    return examples


def read_tfds_squad(version: str, split: str, data_dir: str | None = None) -> list[SquadExample]:
    """TFDS squad/v1.1 or squad/v2.0. Training answers not found at their offsets are left out (a few
    in the published training set), as run_squad.py leaves them out; dev answers are only compared as
    text, so they all count."""
    tfds = tf_cpu.import_tensorflow_datasets()  # here: the task kinds import this module without TensorFlow

    name = f"squad/{version}"
    rows = list(tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)))
    if not rows:
        raise ValueError(f"TFDS {name} split {split} is empty")
    text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)  # noqa: E731
    examples, dropped = [], 0
    for row in rows:
        context = text(row["context"])
        answers = tuple(text(a) for a in row["answers"]["text"])
        starts = tuple(int(s) for s in row["answers"]["answer_start"])
        impossible = bool(row.get("is_impossible", False)) or not answers
        if split == "train" and answers and context[starts[0]:starts[0] + len(answers[0])] != answers[0]:
            dropped += 1
            continue
        examples.append(SquadExample(text(row["id"]), text(row["question"]), context, answers, starts, impossible))
    if not examples:
        raise ValueError(f"TFDS {name} split {split}: no answer is at its offset in any example ({dropped} left out)")
    return examples


# ----------------------------------------------------------------------------------------------------
# Words, tokens and their characters
# ----------------------------------------------------------------------------------------------------


def _is_whitespace(c: str) -> bool:
    # run_squad.py's word separators (U+202F, the narrow no-break space, included).
    return c in " \t\r\n" or ord(c) == 0x202F


def split_words(context: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The context's whitespace-separated words and each one's [start, end) characters."""
    words, spans, start = [], [], None
    for i, c in enumerate(context + " "):
        if _is_whitespace(c):
            if start is not None:
                words.append(context[start:i])
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    return words, spans


@functools.lru_cache(maxsize=1 << 16)
def _normalized_char(c: str, kind: str, lower_case: bool) -> str:
    """What the tokenizer's normalisation makes of one character ("" for dropped ones: controls and
    separators, which the tokenizer splits at or removes)."""
    category = unicodedata.category(c)
    if c == "\ufffd" or category.startswith("Z") or c in "\t\n\r" or (category.startswith("C")):
        return ""
    if kind == "sentencepiece":
        out = unicodedata.normalize("NFKC", c)
        return out.lower() if lower_case else out
    out = unicodedata.normalize("NFC", c)
    if lower_case:
        out = "".join(ch for ch in unicodedata.normalize("NFD", out.lower()) if unicodedata.category(ch) != "Mn")
    return out


def _piece_text(token: str, kind: str) -> str | None:
    """The characters a vocabulary entry spells (None for [UNK]: it stands for a whole basic word)."""
    if token == "[UNK]":
        return None
    if kind == "sentencepiece":
        return token.replace("\u2581", "")
    return token[2:] if token.startswith("##") else token


def _splits_alone(c: str) -> bool:
    """Characters WordPiece's basic tokenizer makes a word of their own: punctuation (ASCII symbols
    included, as the original BERT) and CJK ideographs (the ranges of bertjax.text.tokenizers)."""
    code = ord(c)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    if unicodedata.category(c).startswith("P"):
        return True
    return any(lo <= code <= hi for lo, hi in _CJK_RANGES)


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def piece_spans(word: str, word_start: int, pieces: list[str], kind: str, lower_case: bool) -> list[tuple[int, int]]:
    """Each piece's [start, end) characters in the context, for the pieces of one whitespace word.

    The word is normalised a character at a time (remembering which character each normalised one
    came from) and the pieces are laid over it in order; an [UNK] covers the rest of the basic word
    (a run between punctuation) it starts, as WordPiece puts it in for a whole basic word.
    """
    whole = [(word_start, word_start + len(word))] * len(pieces)
    texts = [_piece_text(p, kind) for p in pieces]
    normalized, origin, group = [], [], []  # normalised chars, the word char each came from, its basic word
    current = 0
    for i, c in enumerate(word):
        n = _normalized_char(c, kind, lower_case)
        alone = kind == "wordpiece" and _splits_alone(c)
        if not n or alone:
            current += 1  # a dropped character or a lone punctuation mark ends the basic word
        for ch in n:
            normalized.append(ch)
            origin.append(i)
            group.append(current)
        if alone:
            current += 1
    spans, at = [], 0
    for t in texts:
        if t is None:  # [UNK]: the rest of this basic word
            if at >= len(normalized):
                return whole
            stop = at
            while stop < len(normalized) and group[stop] == group[at]:
                stop += 1
            t_len = stop - at
        else:
            if "".join(normalized[at:at + len(t)]) != t:
                return whole
            t_len = len(t)
        if t_len == 0:  # an empty piece (SentencePiece's lone word marker) starts where the next one does
            position = word_start + (origin[at] if at < len(origin) else len(word))
            spans.append((position, position))
            continue
        spans.append((word_start + origin[at], word_start + origin[at + t_len - 1] + 1))
        at += t_len
    return spans if at == len(normalized) else whole


@dataclasses.dataclass
class _Context:
    """A context as tokens: ids and each token's character span."""

    ids: np.ndarray  # int32 [T]
    starts: np.ndarray  # int32 [T]
    ends: np.ndarray  # int32 [T]


def tokenize_contexts(contexts: list[str], tokenizer) -> dict[str, _Context]:
    """Each distinct context tokenized word by word, with every token's character span."""
    distinct = list(dict.fromkeys(contexts))
    split = [split_words(c) for c in distinct]
    all_words = [w for words, _ in split for w in words]
    word_ids = tokenizer.encode_arrays(all_words) if all_words else []
    kind = getattr(tokenizer, "kind", "wordpiece")
    out, w = {}, 0
    for context, (words, spans) in zip(distinct, split):
        ids, starts, ends = [], [], []
        for word, (start, _) in zip(words, spans):
            pieces = word_ids[w]
            w += 1
            if len(pieces) == 0:
                continue  # a word of dropped characters only: no token, no answer can start there
            ids.extend(int(p) for p in pieces)
            for s, e in piece_spans(word, start, tokenizer.convert_ids_to_tokens(pieces), kind, tokenizer.lower_case):
                starts.append(s)
                ends.append(e)
        out[context] = _Context(np.array(ids, np.int32), np.array(starts, np.int32), np.array(ends, np.int32))
    return out


# ----------------------------------------------------------------------------------------------------
# Windows
# ----------------------------------------------------------------------------------------------------


def window_starts(num_tokens: int, window: int, stride: int) -> list[int]:
    """run_squad.py's doc spans: from 0, stride apart, until one reaches the end of the context."""
    starts, start = [], 0
    while True:
        starts.append(start)
        if start + window >= num_tokens:
            return starts
        start += min(window, stride)


def max_context(starts: list[int], window: int, num_tokens: int) -> np.ndarray:
    """bool [len(starts), window]: whether window w gives its token at offset j the most context of all
    the windows holding that token (score min(left, right) + 0.01 * the window's length; first wins)."""
    best = np.full(num_tokens, -1)
    best_score = np.full(num_tokens, -np.inf)
    for w, start in enumerate(starts):
        length = min(window, num_tokens - start)
        positions = np.arange(start, start + length)
        score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
        better = score > best_score[positions]
        best[positions[better]] = w
        best_score[positions[better]] = score[better]
    out = np.zeros((len(starts), window), bool)
    for w, start in enumerate(starts):
        length = min(window, num_tokens - start)
        out[w, :length] = best[start:start + length] == w
    return out


def answer_tokens(context: _Context, start_char: int, end_char: int) -> tuple[int, int] | None:
    """The first and last token of the characters [start_char, end_char); None if no token overlaps."""
    overlap = np.flatnonzero((context.starts < end_char) & (context.ends > start_char))
    if len(overlap) == 0:
        return None
    return int(overlap[0]), int(overlap[-1])


def featurize_squad(examples: list[SquadExample], tokenizer, settings: Settings) -> dict[str, np.ndarray]:
    """Examples -> the window features in the module docstring."""
    if not examples:
        raise ValueError("no questions to featurize")
    seq = settings.max_seq_length
    contexts = tokenize_contexts([e.context for e in examples], tokenizer)
    questions = tokenizer.encode_arrays([e.question for e in examples])
    rows = collections.defaultdict(list)
    for number, (example, question) in enumerate(zip(examples, questions)):
        question = np.asarray(question[:settings.max_query_length], np.int32)
        window = seq - len(question) - 3  # [CLS] question [SEP] ... [SEP]
        if window < 1:
            raise ValueError(f"data.max_seq_length={seq} leaves no room for the context after a question of "
                             f"{len(question)} tokens: raise it or lower data.max_query_length")
        context = contexts[example.context]
        num_tokens = len(context.ids)
        answer = None
        if example.answers and not example.is_impossible:
            start_char = example.answer_starts[0]
            answer = answer_tokens(context, start_char, start_char + len(example.answers[0]))
        starts = window_starts(num_tokens, window, settings.doc_stride)
        best = max_context(starts, window, num_tokens)
        offset = len(question) + 2  # where the context starts in a row
        for w, start in enumerate(starts):
            length = min(window, num_tokens - start)
            ids = np.full(seq, tokenizer.pad_id, np.int32)
            ids[0], ids[1:offset - 1], ids[offset - 1] = tokenizer.cls_id, question, tokenizer.sep_id
            ids[offset:offset + length] = context.ids[start:start + length]
            ids[offset + length] = tokenizer.sep_id
            segments = np.zeros(seq, np.int32)
            segments[offset:offset + length + 1] = 1
            mask = np.zeros(seq, np.int32)
            mask[:offset + length + 1] = 1
            token_start = np.full(seq, -1, np.int32)
            token_end = np.full(seq, -1, np.int32)
            token_start[offset:offset + length] = context.starts[start:start + length]
            token_end[offset:offset + length] = context.ends[start:start + length]
            in_window = answer is not None and start <= answer[0] and answer[1] < start + length
            label = (answer[0] - start + offset, answer[1] - start + offset) if in_window else (0, 0)
            is_best = np.zeros(seq, bool)
            is_best[offset:offset + length] = best[w, :length]
            for key, value in (("input_ids", ids), ("segment_ids", segments), ("input_mask", mask),
                               ("label", np.array(label, np.int32)), ("idx", number), ("token_start", token_start),
                               ("token_end", token_end), ("max_context", is_best)):
                rows[key].append(value)
    out = {key: np.stack(values) if key != "idx" else np.array(values, np.int32) for key, values in rows.items()}
    out["example_weight"] = np.ones(len(out["idx"]), np.float32)
    return out


# ----------------------------------------------------------------------------------------------------
# Answers from logits
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Answers:
    """Post-processing's result, keyed by question id.

    text:      the answer (v2.0: "" for no answer at the given threshold)
    best_span: the best non-empty answer, whatever the threshold
    null_odds: v2.0: no-answer score minus the best span's score (the official scorer's na_prob input)
    nbest:     [{"text", "probability", "start_logit", "end_logit", "start", "end" (its characters in the
               context; -1 for no answer)}] best first
    """

    text: dict[str, str]
    best_span: dict[str, str]
    null_odds: dict[str, float]
    nbest: dict[str, list[dict]]


def _top(values: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-values, kind="stable")[:n]


def decode_answers(examples: list[SquadExample], features: dict[str, np.ndarray], start_logits: np.ndarray,
                   end_logits: np.ndarray, settings: Settings, version: str, null_threshold: float = 0.0) -> Answers:
    """The answer of every example from its windows' start and end logits (float [F, S] each, the rows
    of `features`), by the rules in the module docstring."""
    windows = collections.defaultdict(list)
    for f, number in enumerate(features["idx"]):
        windows[int(number)].append(f)
    text, best_span, null_odds, nbest = {}, {}, {}, {}
    for number, example in enumerate(examples):
        candidates = []  # (score, start logit, end logit, start char, end char)
        null = None  # (score, start logit, end logit)
        for f in windows.get(number, ()):
            starts, ends = start_logits[f], end_logits[f]
            if version == V2:
                score = float(starts[0] + ends[0])
                if null is None or score < null[0]:
                    null = (score, float(starts[0]), float(ends[0]))
            token_start, token_end, best = (features[key][f] for key in ("token_start", "token_end", "max_context"))
            for s in _top(starts, settings.n_best):
                if token_start[s] < 0 or not best[s]:
                    continue
                for e in _top(ends, settings.n_best):
                    if token_end[e] < 0 or e < s or e - s + 1 > settings.max_answer_length:
                        continue
                    candidates.append((float(starts[s] + ends[e]), float(starts[s]), float(ends[e]),
                                       int(token_start[s]), int(token_end[e])))
        if null is not None:  # the no-answer candidate competes for a place in the n-best list, as a span would
            candidates.append((null[0], null[1], null[2], None, None))
        candidates.sort(key=lambda c: -c[0])
        entries, seen = [], set()
        for _score, s_logit, e_logit, start_char, end_char in candidates:
            answer = "" if start_char is None else example.context[start_char:end_char]
            if answer in seen:
                continue
            seen.add(answer)
            entries.append({"text": answer, "start_logit": s_logit, "end_logit": e_logit,
                            "start": -1 if start_char is None else start_char,
                            "end": -1 if end_char is None else end_char})
            if len(entries) == settings.n_best:
                break
        if null is not None and "" not in seen:
            entries.append({"text": "", "start_logit": null[1], "end_logit": null[2], "start": -1, "end": -1})
        if not entries:
            entries.append({"text": "", "start_logit": 0.0, "end_logit": 0.0, "start": -1, "end": -1})
        scores = np.array([e["start_logit"] + e["end_logit"] for e in entries])
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        for entry, p in zip(entries, probabilities):
            entry["probability"] = float(p)
        nbest[example.id] = entries
        spans = [e for e in entries if e["text"]]
        best_span[example.id] = spans[0]["text"] if spans else ""
        if version == V2:
            span_score = spans[0]["start_logit"] + spans[0]["end_logit"] if spans else -math.inf
            odds = (null[0] if null else 0.0) - span_score
            null_odds[example.id] = float(odds) if math.isfinite(odds) else 1e9
            text[example.id] = "" if null_odds[example.id] > null_threshold else best_span[example.id]
        else:
            text[example.id] = best_span[example.id]
    return Answers(text, best_span, null_odds, nbest)


def with_threshold(answers: Answers, threshold: float) -> dict[str, str]:
    """v2.0 answers at another no-answer threshold (the one tuned on the dev set)."""
    return {q: "" if answers.null_odds.get(q, -math.inf) > threshold else span for q, span in answers.best_span.items()}
