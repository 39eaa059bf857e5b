"""Span QA and tagging through python -m bertjax.finetune's library, on data built from real text (the demo
corpus: Python's documentation prose, which quotes code in double quotes):

  QA       three sentences as the context, one of them quoting something; "What is quoted?" is answered
           by the quoted text. Baseline: the first sentence as the answer.
  tagging  a sentence's words; the words inside quotes are a CODE entity (B-CODE I-CODE ...), the rest O.
           Baseline: the most frequent tag, O everywhere (entity F1 0).

A small random BERT learns both clearly above the baselines; the outputs are the official scripts' files;
v2.0 questions without an answer tune and keep a no-answer threshold; the feature-based tagger trains only
its BiLSTM; bertjax.load(...).predict answers and tags."""

import json
import pathlib
import re

import numpy as np
import pytest

import bertjax
from bertjax.runs import finetuning
from bertjax.training import checkpoint
from bertjax.tasks import metrics
from bertjax.data import demo
from configs.finetune import common as finetune_configs
from conftest import shared_directory

QUOTED = re.compile(r'"([^"]{2,40})"')
QUESTION = "What is quoted?"


def _sentences():
    return [s for doc in demo.demo_documents() for s in doc if 20 <= len(s) <= 100]


def qa_articles(num, seed, unanswerable=0.0):
    """SQuAD-format articles: contexts of three sentences, one (or, unanswerable, none) quoting once."""
    sentences = _sentences()
    # Answers that normalise to nothing ("-", "the") are left out: the official scripts count such a
    # question as answerable yet score the empty answer right on it, which blurs the v2.0 checks.
    quoting = [s for s in sentences if s.count('"') == 2 and len(QUOTED.findall(s)) == 1
               and metrics.normalize_answer(QUOTED.search(s).group(1))]
    plain = [s for s in sentences if '"' not in s]
    rng = np.random.default_rng(seed)
    paragraphs = []
    for n in range(num):
        parts = list(rng.choice(plain, 3, replace=False))
        qa = {"id": f"q{seed}-{n}", "question": QUESTION, "answers": []}
        if rng.random() >= unanswerable:
            parts[int(rng.integers(3))] = str(rng.choice(quoting))
        context = " ".join(parts)
        found = QUOTED.search(context)
        if found:
            qa["answers"] = [{"text": found.group(1), "answer_start": found.start(1)}]
        else:
            qa["is_impossible"] = True
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "test", "data": [{"title": "demo", "paragraphs": paragraphs}]}


def write_json(path, data):
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    return str(path)


def first_sentence_baseline(articles, version):
    predictions, golds = {}, {}
    for paragraph in articles["data"][0]["paragraphs"]:
        qa = paragraph["qas"][0]
        predictions[qa["id"]] = re.split(r"(?<=[.:;?!])\s", paragraph["context"])[0]
        golds[qa["id"]] = [a["text"] for a in qa["answers"]]
    return metrics.squad_scores(predictions, golds, version=version)


def span_config(task, pretrained, files, **data):  # noqa: F811
    config = finetune_configs.span_config(task)
    config.train.init_from = pretrained["workdir"]
    config.data.update(max_seq_length=64, max_query_length=8, doc_stride=24, train=files["train"],
                       validation=files["validation"], **data)
    config.train.update(batch_size=16, epochs=8.0)
    config.optimizer.update(learning_rate=1e-3, bias_correction=True)  # a random small model: configs/tiny.py
    config.logging.update(log_every=20, eval_batch_size=32)
    return config


@pytest.fixture(scope="module")
def qa_run(pretrained, tmp_path_factory):  # noqa: F811
    """The span reader fine-tuned from `pretrained` on 400 questions, made once per test run (tests/test_export.py
    serves it too). Read-only."""
    dev = qa_articles(60, seed=2)

    def build(root):
        files = {"train": write_json(root / "train.json", qa_articles(400, seed=1)),
                 "validation": write_json(root / "dev.json", dev)}
        finetuning.finetune(span_config("span", pretrained, files), str(root / "run"))

    workdir = shared_directory(tmp_path_factory, "qa-run", build) / "run"
    return dict(summary=json.loads((workdir / "summary.json").read_text()), workdir=str(workdir), dev=dev)


def test_span_qa_learns_above_the_first_sentence_baseline(qa_run):
    summary = qa_run["summary"]
    scores = summary["best"]["metrics"]["validation"]
    baseline = first_sentence_baseline(qa_run["dev"], "v1.1")
    assert summary["main_metric"] == "f1"
    assert scores["f1"] >= baseline["f1"] + 0.25 and scores["exact_match"] >= baseline["exact_match"] + 0.2, (
        scores, baseline)


def test_span_qa_writes_the_official_scripts_files(qa_run):
    predictions_dir = pathlib.Path(qa_run["workdir"]) / "predictions"
    answers = json.loads((predictions_dir / "validation_predictions.json").read_text())
    nbest = json.loads((predictions_dir / "validation_nbest_predictions.json").read_text())
    paragraphs = qa_run["dev"]["data"][0]["paragraphs"]
    assert set(answers) == set(nbest) == {p["qas"][0]["id"] for p in paragraphs}
    # Each answer is a piece of its own context, character for character, and the n-best's first.
    for p in paragraphs:
        qid = p["qas"][0]["id"]
        assert answers[qid] in p["context"] and nbest[qid][0]["text"] == answers[qid]
    # The file scores as the summary says (the official scripts' algorithm on the file).
    golds = {p["qas"][0]["id"]: [a["text"] for a in p["qas"][0]["answers"]] for p in paragraphs}
    best = qa_run["summary"]["best"]
    rescored = metrics.squad_scores(answers, golds, version="v1.1")
    assert rescored["f1"] == pytest.approx(best["metrics"]["validation"]["f1"])


def test_the_loaded_qa_model_answers_a_question(qa_run):
    bert = bertjax.load(qa_run["workdir"])
    paragraph = qa_run["dev"]["data"][0]["paragraphs"][0]
    out = bert.predict(questions=[QUESTION], contexts=[paragraph["context"]])
    answers = json.loads((pathlib.Path(qa_run["workdir"]) / "predictions" / "validation_predictions.json").read_text())
    assert out[0]["answer"] == answers[paragraph["qas"][0]["id"]]
    start, end = out[0]["start"], out[0]["end"]
    assert paragraph["context"][start:end] == out[0]["answer"] and 0 <= out[0]["score"] <= 1


def test_squad_v2_tunes_and_keeps_a_no_answer_threshold(pretrained, tmp_path):  # noqa: F811
    dev = qa_articles(60, seed=4, unanswerable=0.5)
    files = {"train": write_json(tmp_path / "train.json", qa_articles(300, seed=3, unanswerable=0.5)),
             "validation": write_json(tmp_path / "dev.json", dev)}
    config = span_config("span", pretrained, files, squad_version="v2.0")
    config.train.epochs = 2.0
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    scores = summary["best"]["metrics"]["validation"]
    assert summary["main_metric"] == "best_f1"
    assert scores["best_f1"] >= scores["f1"] - 1e-9 and "has_ans_f1" in scores and "no_ans_f1" in scores
    # Saved with the model, and used by the predictions file and bertjax.load(...).predict.
    _, meta = checkpoint.restore_params(str(tmp_path / "run" / checkpoint.BEST_DIR))
    assert meta.task.null_threshold == pytest.approx(scores["best_f1_threshold"])
    predictions = tmp_path / "run" / "predictions"
    odds = json.loads((predictions / "validation_null_odds.json").read_text())
    answers = json.loads((predictions / "validation_predictions.json").read_text())
    threshold = scores["best_f1_threshold"]
    nbest = json.loads((predictions / "validation_nbest_predictions.json").read_text())
    for qid, value in odds.items():
        best_span = next((e["text"] for e in nbest[qid] if e["text"]), "")
        assert answers[qid] == ("" if value > threshold else best_span)
    golds = {p["qas"][0]["id"]: [a["text"] for a in p["qas"][0]["answers"]] for p in dev["data"][0]["paragraphs"]}
    assert metrics.squad_scores(answers, golds, version="v2.0")["f1"] == pytest.approx(scores["best_f1"])


# ----------------------------------------------------------------------------------------------------
# Tagging
# ----------------------------------------------------------------------------------------------------

TAGS = ("O", "B-CODE", "I-CODE")


def tagged_sentence(sentence):
    """The sentence's words (punctuation split off) and their tags: CODE inside quotes, the quotes O."""
    words, tags, inside, begin = [], [], False, False
    for token in re.findall(r'\w+|[^\w\s]', sentence):
        if token == '"':
            inside, begin = not inside, True
            words.append(token)
            tags.append("O")
            continue
        words.append(token)
        tags.append(("B-CODE" if begin else "I-CODE") if inside else "O")
        begin = False
    return words, tags


def write_conll(path, sentences, iob1=False):
    lines = ["-DOCSTART- -X- -X- O", ""]
    for sentence in sentences:
        words, tags = tagged_sentence(sentence)
        if iob1:  # CoNLL-2003's own scheme: B- only where an entity follows another of its type
            tags = ["I-" + t[2:] if t.startswith("B-") else t for t in tags]
        lines += [f"{w} X X {t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def tagging_sentences():
    """480 training and 80 dev sentences of the demo corpus, most of them quoting."""
    quoting = [s for s in _sentences() if s.count('"') >= 2 and s.count('"') % 2 == 0]
    plain = [s for s in _sentences() if '"' not in s]
    rng = np.random.default_rng(5)
    chosen = list(rng.choice(quoting, 420, replace=False)) + list(rng.choice(plain, 140, replace=False))
    rng.shuffle(chosen)
    return chosen[:480], chosen[480:]


def tagging_config(pretrained, files):  # noqa: F811
    config = finetune_configs.tagging_config("tagging")
    config.train.init_from = pretrained["workdir"]
    config.data.update(max_seq_length=48, labels=TAGS, train=files["train"], validation=files["validation"])
    config.train.update(batch_size=16, epochs=6.0)
    config.optimizer.update(learning_rate=1e-3, bias_correction=True)
    config.logging.update(log_every=20, eval_batch_size=32)
    return config


@pytest.fixture(scope="module")
def tagging_run(pretrained, tmp_path_factory):  # noqa: F811
    """The tagger fine-tuned from `pretrained` on 480 sentences (CoNLL-2003's IOB1 files), made once per test
    run (tests/test_export.py serves it too). Read-only."""
    train, dev = tagging_sentences()

    def build(root):
        write_conll(root / "train.txt", train, iob1=True)
        write_conll(root / "dev.txt", dev, iob1=True)
        files = {"train": str(root / "train.txt"), "validation": str(root / "dev.txt")}
        finetuning.finetune(tagging_config(pretrained, files), str(root / "run"))

    root = shared_directory(tmp_path_factory, "tagging-run", build)
    files = {"train": str(root / "train.txt"), "validation": str(root / "dev.txt")}
    return dict(summary=json.loads((root / "run" / "summary.json").read_text()), workdir=str(root / "run"),
                files=files, dev=[tagged_sentence(s) for s in dev])


def test_tagging_learns_entities_above_the_most_frequent_tag(tagging_run):
    gold = [tags for _, tags in tagging_run["dev"]]
    baseline = metrics.entity_scores(gold, [["O"] * len(t) for t in gold])
    scores = tagging_run["summary"]["best"]["metrics"]["validation"]
    assert baseline["f1"] == 0.0 and scores["f1"] >= 0.3, scores


def test_tagging_writes_conlleval_columns_that_score_as_the_summary(tagging_run):
    text = (pathlib.Path(tagging_run["workdir"]) / "predictions" / "validation_predictions.txt").read_text()
    sentences = [block.splitlines() for block in text.strip("\n").split("\n\n")]
    assert [[line.split()[0] for line in s] for s in sentences] == [words for words, _ in tagging_run["dev"]]
    gold = [[line.split()[1] for line in s] for s in sentences]
    predicted = [[line.split()[2] for line in s] for s in sentences]
    assert gold == [tags for _, tags in tagging_run["dev"]]  # IOB1 in the file, read as BIO
    assert metrics.entity_scores(gold, predicted)["f1"] == pytest.approx(
        tagging_run["summary"]["best"]["metrics"]["validation"]["f1"])


def test_the_loaded_tagger_tags_a_sentence(tagging_run):
    bert = bertjax.load(tagging_run["workdir"])
    words, _ = tagging_run["dev"][0]
    out = bert.predict([words])
    predicted = (pathlib.Path(tagging_run["workdir"]) / "predictions" / "validation_predictions.txt").read_text()
    first = [line.split()[2] for line in predicted.split("\n\n")[0].splitlines()]
    assert [w for w, _ in out[0]["tags"]] == list(words) and [t for _, t in out[0]["tags"]] == first
    assert all(set(e) == {"type", "start", "end", "text"} for e in out[0]["entities"])


def test_the_feature_based_tagger_trains_only_its_bilstm(pretrained, tagging_run, tmp_path):  # noqa: F811
    config = tagging_config(pretrained, tagging_run["files"])
    # 4 epochs at 1e-2 (measured: dev F1 0.84; 6 epochs at 5e-3, 0.81; 2 epochs at 5e-3, 0).
    config.feature_based.update(enabled=True, lstm_size=32, lstm_layers=1, layers=(-1, -2), learning_rate=1e-2)
    config.train.epochs = 4.0
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    params, meta = checkpoint.restore_params(str(tmp_path / "run" / checkpoint.BEST_DIR))
    assert meta.task.feature_based["layers"] == [-1, -2]
    assert set(params) == {"bert", "lstm_0_forward", "lstm_0_backward", "classifier"}
    # The encoder is the pretrained one, bit for bit: frozen, not even weight decay moved it.
    import jax

    same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), params["bert"], pretrained["params"]["bert"])
    assert all(jax.tree_util.tree_leaves(same))
    assert summary["best"]["metrics"]["validation"]["f1"] > 0.5
    # Layers the model does not have: one line saying which it has.
    config.feature_based.layers = (-1, -2, -3, -4)
    with pytest.raises(ValueError, match=r"layers=\(-1, -2, -3, -4\): the model has hidden states 0\.\.2"):
        finetuning.finetune(config, str(tmp_path / "other"))
