"""SQuAD pre- and post-processing: every token's characters in the context (Unicode, punctuation,
whitespace), windows over a context longer than one window and their max-context rule against a literal
re-statement of run_squad.py's, training labels, answers decoded back to the exact original text, the
v2.0 no-answer rule, and bad SQuAD files."""

import json
import unicodedata

import numpy as np
import pytest

from bertjax.data import demo
from bertjax.tasks import squad
from bertjax.text import tokenizers
from bertjax.text import vocab_learning as vocabularies

CONTEXT = ("Le  Café\tNaïve, au cœur de São Paulo — it returns “None” (not False).\n"
           "ÀBC résumé: the function   returns 42; naïve users écrivent «bonjour» à l’heure.")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("squad") / "vocab.txt"
    sentences = [s for doc in demo.demo_documents(200) for s in doc]
    vocabularies.learn_wordpiece_vocab(iter(sentences), 600, True, str(path))
    return tokenizers.load_tokenizer("wordpiece", str(path), lower_case=True)


def _fold(text: str) -> str:
    """What the uncased tokenizer makes of text, spaces removed: lower-cased, accents stripped."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFC", text).lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn" and not c.isspace())


def test_every_token_knows_its_characters_in_the_context(tokenizer):
    context = squad.tokenize_contexts([CONTEXT], tokenizer)[CONTEXT]
    assert len(context.ids) > 40
    tokens = tokenizer.convert_ids_to_tokens(context.ids)
    exact = 0
    for token, start, end in zip(tokens, context.starts, context.ends):
        covered = CONTEXT[start:end]
        assert covered and covered == covered.strip(), (token, covered)  # never a space at either end
        if token == "[UNK]":
            assert len(covered) == 1 or not any(c in covered for c in "«»’“”")  # a basic word: no punctuation
            exact += 1
        elif _fold(covered) == token.removeprefix("##"):
            exact += 1
    # Every token spells its own characters; an [UNK] stands for one basic word.
    assert exact == len(tokens)
    assert "[UNK]" in tokens
    # In order, never overlapping, and each word's characters covered once.
    assert np.all(context.starts[1:] >= context.ends[:-1]) or np.all(np.diff(context.starts) >= 0)
    assert tokens[:3] == tokenizer.convert_ids_to_tokens(tokenizer.encode(["Le Café"])[0])[:3]


def test_an_answer_maps_back_to_its_exact_text_with_accents_and_inner_whitespace(tokenizer):
    context = squad.tokenize_contexts([CONTEXT], tokenizer)[CONTEXT]
    for answer in ("Café\tNaïve", "São Paulo", "“None”", "function   returns 42", "écrivent «bonjour»",
                   "résumé", "Naïve"):
        start = CONTEXT.index(answer)
        first, last = squad.answer_tokens(context, start, start + len(answer))
        assert CONTEXT[context.starts[first]:context.ends[last]] == answer


def _run_squad_windows(num_tokens, window, stride):
    """run_squad.py's doc spans and _check_is_max_context, written out as there (the reference)."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, window)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    best_of = {}
    for position in range(num_tokens):
        best_score, best_index = None, None
        for index, (s, length) in enumerate(spans):
            end = s + length - 1
            if position < s or position > end:
                continue
            score = min(position - s, end - position) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best_index = score, index
        best_of[position] = best_index
    return spans, best_of


@pytest.mark.parametrize("num_tokens,window,stride", [(10, 4, 2), (37, 12, 5), (12, 12, 4), (5, 12, 3), (50, 9, 9),
                                                      (29, 10, 3)])
def test_windows_and_max_context_follow_run_squad(num_tokens, window, stride):
    spans, best_of = _run_squad_windows(num_tokens, window, stride)
    starts = squad.window_starts(num_tokens, window, stride)
    assert starts == [s for s, _ in spans]
    best = squad.max_context(starts, window, num_tokens)
    for w, (s, length) in enumerate(spans):
        for j in range(window):
            assert best[w, j] == (j < length and best_of[s + j] == w)


def _long_examples():
    """Two questions on a context several windows long, answers near its end and in its middle."""
    sentences = [s for doc in demo.demo_documents(40) for s in doc][:14]
    context = " ".join(sentences) + " Finally, «the answer is here» — señor Müller said."
    late = "the answer is here"
    middle = sentences[6].split()[2]
    return [squad.SquadExample("late", "Where is the answer?", context, (late,), (context.index(late),)),
            squad.SquadExample("middle", "Which word?", context, (middle,), (context.index(" " + middle) + 1,))]


def test_long_contexts_are_windowed_and_labels_spell_the_answer(tokenizer):
    examples = _long_examples()
    settings = squad.Settings(max_seq_length=64, max_query_length=8, doc_stride=24)
    f = squad.featurize_squad(examples, tokenizer, settings)
    for number, example in enumerate(examples):
        rows = np.flatnonzero(f["idx"] == number)
        assert len(rows) > 3  # the context needs several windows
        # Every context token has exactly one window where it has the most context.
        assert sum(int(f["max_context"][r].sum()) for r in rows) == len(
            squad.tokenize_contexts([example.context], tokenizer)[example.context].ids)
        labelled = [r for r in rows if tuple(f["label"][r]) != (0, 0)]
        assert labelled, "the answer lies wholly inside at least one window"
        for r in labelled:
            start, end = f["label"][r]
            assert f["segment_ids"][r, start] == 1 and f["segment_ids"][r, end] == 1
            assert example.context[f["token_start"][r, start]:f["token_end"][r, end]] == example.answers[0]
        for r in rows:  # [CLS] question [SEP] context [SEP]
            ids = f["input_ids"][r]
            assert ids[0] == tokenizer.cls_id and np.sum(ids == tokenizer.sep_id) == 2
            assert f["input_mask"][r].sum() == np.flatnonzero(ids == tokenizer.sep_id)[-1] + 1


def _logits_pointing_at(f, settings_rows, example_rows):
    """Start/end logits that favour each example's labelled span (and [CLS] elsewhere)."""
    starts = np.random.default_rng(0).normal(0, 0.1, f["input_ids"].shape).astype(np.float32)
    ends = starts.copy()
    for r in example_rows:
        s, e = f["label"][r]
        starts[r, s] += 8
        ends[r, e] += 8
    return starts, ends


def test_decoding_recovers_the_exact_original_answer_across_windows(tokenizer):
    examples = _long_examples()
    settings = squad.Settings(max_seq_length=64, max_query_length=8, doc_stride=24)
    f = squad.featurize_squad(examples, tokenizer, settings)
    starts, ends = _logits_pointing_at(f, settings, range(len(f["idx"])))
    answers = squad.decode_answers(examples, f, starts, ends, settings, squad.V1)
    assert answers.text == {"late": "the answer is here", "middle": examples[1].answers[0]}
    nbest = answers.nbest["late"]
    assert nbest[0]["text"] == "the answer is here" and len(nbest) <= settings.n_best
    assert abs(sum(e["probability"] for e in nbest) - 1) < 1e-6
    assert len({e["text"] for e in nbest}) == len(nbest)  # each text once


def test_spans_obey_the_length_limit_and_stay_in_the_context(tokenizer):
    examples = _long_examples()[:1]
    settings = squad.Settings(max_seq_length=64, max_query_length=8, doc_stride=24, max_answer_length=3)
    f = squad.featurize_squad(examples, tokenizer, settings)
    starts = np.zeros(f["input_ids"].shape, np.float32)
    ends = np.zeros_like(starts)
    starts[:, 1] = 50  # a question token: never an answer
    r = int(np.flatnonzero(f["label"][:, 0])[0])
    s, e = f["label"][r]
    starts[r, s], ends[r, e] = 10, 10  # the labelled span: 4 words, more than 3 tokens
    ends[r, s + 1] = 5
    answers = squad.decode_answers(examples, f, starts, ends, settings, squad.V1)
    text = answers.text["late"]
    assert text in examples[0].context and text != "the answer is here"
    assert len(tokenizer.encode([text])[0]) <= 3


def test_v2_answers_nothing_when_the_null_score_wins_by_more_than_the_threshold(tokenizer):
    examples = _long_examples()
    settings = squad.Settings(max_seq_length=64, max_query_length=8, doc_stride=24)
    f = squad.featurize_squad(examples, tokenizer, settings)
    starts, ends = _logits_pointing_at(f, settings, range(len(f["idx"])))
    rows = np.flatnonzero(f["idx"] == 0)
    starts[rows, 0] += 12  # the null score of "late": its lowest [CLS] start + end over windows
    ends[rows, 0] += 12
    answers = squad.decode_answers(examples, f, starts, ends, settings, squad.V2)
    span_score = max(e["start_logit"] + e["end_logit"] for e in answers.nbest["late"] if e["text"])
    null = min(starts[r, 0] + ends[r, 0] for r in rows)
    assert answers.null_odds["late"] == pytest.approx(null - span_score, abs=1e-4)
    assert answers.text["late"] == "" and answers.best_span["late"] == "the answer is here"
    assert answers.text["middle"] == examples[1].answers[0] and answers.null_odds["middle"] < 0
    assert "" in [e["text"] for e in answers.nbest["middle"]]  # the no-answer choice is always listed
    raised = squad.with_threshold(answers, answers.null_odds["late"] + 1)
    assert raised["late"] == "the answer is here"


def _squad_file(path, qas, context="The cat sat on the mat."):
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_reading_squad_files(tmp_path):
    good = _squad_file(tmp_path / "good.json", [
        {"id": "a", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
        {"id": "b", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15},
                                                       {"text": "on the mat", "answer_start": 12}]}])
    examples = squad.read_squad_json(good, squad.V1)
    assert [e.id for e in examples] == ["a", "b"] and examples[1].answers == ("the mat", "on the mat")
    impossible = _squad_file(tmp_path / "v2.json", [
        {"id": "c", "question": "Who flew?", "answers": [], "is_impossible": True}])
    assert squad.read_squad_json(impossible, squad.V2)[0].is_impossible
    with pytest.raises(ValueError, match=r"v1\.1 set"):
        squad.read_squad_json(impossible, squad.V1)


@pytest.mark.parametrize("content,message", [
    ("", r"empty file"),
    ("{\"data\": [", r":1: invalid JSON"),
    ("[1, 2]", r"a 'data' list"),
])
def test_bad_squad_files_give_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        squad.read_squad_json(str(path), squad.V1)


def test_an_answer_not_at_its_offset_names_the_file_and_line(tmp_path):
    path = _squad_file(tmp_path / "off.json", [
        {"id": "a", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
        {"id": "q-off", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 14}]}])
    line = next(n for n, text in enumerate(open(path, encoding="utf-8"), 1) if '"q-off"' in text)
    with pytest.raises(ValueError, match=rf"off\.json:{line} \(question q-off\): answer 'the mat' is not at its "
                                         r"offset 14 .*' the ma'"):
        squad.read_squad_json(path, squad.V1)
    with pytest.raises(ValueError, match="no such file"):
        squad.read_squad_json(str(tmp_path / "missing.json"), squad.V1)
