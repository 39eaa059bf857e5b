"""python -m bertjax.evaluate: every task of the suite that has data fine-tuned in-process (GLUE, SQuAD and
CoNLL-2003 from TFDS, mocked offline), one table in the paper's layout; skipped tasks and mistakes in one
line. --suite=sts: STS-B (mocked) and a JSON-lines set scored zero-shot, its correlations scipy's on
sentence-transformers' own cosines of the exported model."""

import dataclasses
import json
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from bertjax import inference
from bertjax.runs import suite_evaluation
from bertjax.tasks import readers, registry, retrieval
from test_finetune_spans import qa_articles, tagged_sentence, _sentences


def test_the_glue_table_of_the_tasks_with_data(pretrained, tmp_path, monkeypatch, capsys):  # noqa: F811
    ready = {"stsb"}
    monkeypatch.setattr(suite_evaluation, "available",
                        lambda task, data_dir: None if task in ready else f"{task} not prepared")
    # Mocked TFDS draws its idx feature at random; GLUE's are unique, as the prediction files need.
    read_tfds = readers.read_tfds
    monkeypatch.setattr(readers, "read_tfds", lambda *a, **k: [dataclasses.replace(e, idx=i)
                                                                 for i, e in enumerate(read_tfds(*a, **k))])
    with tfds.testing.mock_data(num_examples=16):
        out = suite_evaluation.evaluate(pretrained["workdir"], "glue", str(tmp_path / "glue"), epochs=1.0, batch_size=8,
                                max_seq_length=24)
    printed = capsys.readouterr().out
    assert "skipped mnli: mnli not prepared" in printed and "skipped rte: rte not prepared" in printed
    heading, rule, values = out["table"]
    assert heading == "| MNLI-(m/mm) | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average |"
    cells = [c.strip() for c in values.strip("|").split("|")]
    stsb = 100 * out["scores"]["stsb"]["validation"]["spearman"]
    assert cells == ["-", "-", "-", "-", "-", f"{stsb:.1f}", "-", "-", f"{stsb:.1f}"]
    # Each number is that task's own fine-tuning summary.
    for task in ready:
        summary = json.loads((tmp_path / "glue" / task / "summary.json").read_text())
        assert summary["best"]["metrics"] == out["scores"][task]
    saved = json.loads((tmp_path / "glue" / "glue.json").read_text())
    assert saved["table"] == out["table"] and set(saved["skipped"]) == {"mnli", "qqp", "qnli", "sst2", "cola", "mrpc",
                                                                        "rte"}
    assert (tmp_path / "glue" / "glue.md").read_text().splitlines() == out["table"]


def _squad_and_conll(self, split, **kwargs):
    """TFDS rows of squad/v1.1 and conll2003 built from the demo corpus (the mock's as_dataset)."""
    if self.name == "squad":
        paragraphs = qa_articles(40 if split == "train" else 12,
                                 seed=7 if split == "train" else 8)["data"][0]["paragraphs"]
        rows = [{"id": p["qas"][0]["id"], "title": "demo", "context": p["context"], "question": p["qas"][0]["question"],
                 "answers": {"text": [a["text"] for a in p["qas"][0]["answers"]],
                             "answer_start": [a["answer_start"] for a in p["qas"][0]["answers"]]}} for p in paragraphs]
        spec = {"id": tf.TensorSpec([], tf.string), "title": tf.TensorSpec([], tf.string),
                "context": tf.TensorSpec([], tf.string), "question": tf.TensorSpec([], tf.string),
                "answers": {"text": tf.TensorSpec([None], tf.string), "answer_start": tf.TensorSpec([None], tf.int32)}}
    else:
        names = list(self.info.features["ner"].feature.names)
        chosen = [s for s in _sentences() if s.count('"') == 2][: 40 if split == "train" else 12]
        rows = []
        for sentence in chosen:
            words, tags = tagged_sentence(sentence)
            rows.append({"tokens": words, "ner": [names.index(t.replace("CODE", "MISC")) for t in tags],
                         "pos": [0] * len(words), "chunks": [0] * len(words)})
        spec = {k: tf.TensorSpec([None], tf.string if k == "tokens" else tf.int64) for k in rows[0]}
    return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec)


def test_the_squad_and_conll_tables(pretrained, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(suite_evaluation, "available",
                        lambda task, data_dir: None if task in ("squad", "conll2003") else "no")
    with tfds.testing.mock_data(as_dataset_fn=_squad_and_conll):
        out = suite_evaluation.evaluate(pretrained["workdir"], "all", str(tmp_path / "all"),
                                        tasks=["squad", "conll2003"], epochs=1.0, batch_size=8, max_seq_length=64)
    squad, conll = out["suites"]["squad"], out["suites"]["conll"]
    assert squad["table"][0] == "| SQuAD 1.1 (EM/F1) | SQuAD 2.0 (EM/F1) |"
    v1 = squad["scores"]["squad"]["validation"]
    assert squad["table"][2] == f"| {100 * v1['exact_match']:.1f}/{100 * v1['f1']:.1f} | - |"
    assert conll["table"][0] == "| CoNLL-2003 NER (dev/test F1) |"
    scores = conll["scores"]["conll2003"]
    assert conll["table"][2] == f"| {100 * scores['dev']['f1']:.1f}/{100 * scores['test']['f1']:.1f} |"
    printed = capsys.readouterr().out
    assert "squad:" in printed and "conll:" in printed and "| SQuAD 1.1 (EM/F1)" in printed
    assert (tmp_path / "all" / "all.md").read_text().splitlines()[2:5] == squad["table"]
    predictions = json.loads((tmp_path / "all" / "squad" / "squad" / "predictions" / "validation_predictions.json")
                             .read_text())
    assert len(predictions) == 12


def test_mistakes_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--suite=superglue: choose one of glue"):
        suite_evaluation.evaluate(str(tmp_path), "superglue", str(tmp_path))
    with pytest.raises(ValueError, match=re.escape("--tasks: swag not in suite glue")):
        suite_evaluation.evaluate(str(tmp_path), "glue", str(tmp_path), tasks=["swag"])
    monkeypatch.setattr(suite_evaluation, "available", lambda task, data_dir: "not prepared")
    with pytest.raises(ValueError, match="no task of suite glue has its data prepared"):
        suite_evaluation.evaluate(str(tmp_path), "glue", str(tmp_path))


# ----------------------------------------------------------------------------------------------------
# --suite=sts: zero-shot similarity, no fine-tuning
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported_embedder(bpe_directories, tmp_path_factory):
    """conftest's byte-level BPE RoBERTa under mean pooling, read by bertjax and exported again as a
    sentence-transformers directory by python -m bertjax.export's code."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    import bertjax
    from bertjax.runs import exporting
    from test_embeddings import save_workdir

    root = tmp_path_factory.mktemp("sts")
    SentenceTransformer(modules=[Transformer(str(bpe_directories["roberta"]), max_seq_length=32),
                                 Pooling(32, pooling_mode="mean")], device="cpu").save(str(root / "st"))
    bert = bertjax.load(root / "st")
    workdir = save_workdir(root / "run", bert, bert.vocab_path, embedding=bert.embedding, kind="bpe")
    return exporting.export(str(workdir), str(root / "exported"), "sentence-transformers")


def test_the_sts_table_equals_scipy_on_sentence_transformers_cosines(exported_embedder, tmp_path, monkeypatch):
    import scipy.stats
    from sentence_transformers import SentenceTransformer

    rng = np.random.default_rng(0)
    words = "the river city north old museum bridge water school road tower".split()
    rows = []
    for _ in range(30):
        a = list(rng.choice(words, 5))
        shared = int(rng.integers(0, 6))
        rows.append({"text": " ".join(a), "text_pair": " ".join(a[:shared] + list(rng.choice(words, 3))),
                     "score": shared / 5})
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read_tfds = readers.read_tfds  # mocked TFDS draws GLUE's idx at random: unique ones, as GLUE's are
    monkeypatch.setattr(readers, "read_tfds", lambda *a, **k: [dataclasses.replace(e, idx=i)
                                                                 for i, e in enumerate(read_tfds(*a, **k))])
    with tfds.testing.mock_data(num_examples=12):
        stsb = readers.read_split(registry.get_task("stsb"), "validation")
        out = suite_evaluation.sts_suite(exported_embedder, ["stsb", str(tmp_path / "mine.jsonl")],
                                         str(tmp_path / "eval"))
    reference, model = SentenceTransformer(exported_embedder, device="cpu"), inference.load(exported_embedder)
    for name, pairs in (("stsb", [(e.text, e.text_pair, e.label) for e in stsb]),
                        ("mine", [(r["text"], r["text_pair"], r["score"]) for r in rows])):
        first, second = (reference.encode([p[i] for p in pairs], convert_to_tensor=True) for i in (0, 1))
        cosines = reference.similarity_pairwise(first, second).numpy()
        ours = retrieval.sts_similarities(lambda texts, kind: model.embed(texts), pairs)
        assert np.abs(ours - cosines).max() < 1e-5
        gold = [p[2] for p in pairs]
        assert out["scores"][name]["spearman"] == pytest.approx(scipy.stats.spearmanr(cosines, gold).statistic,
                                                                abs=1e-6)
        assert out["scores"][name]["pearson"] == pytest.approx(scipy.stats.pearsonr(cosines, gold).statistic, abs=1e-5)
        assert out["scores"][name]["pairs"] == len(pairs)
    heading, rule, first_row, second_row, average = out["table"]
    assert heading == "| Data set | Spearman | Pearson | Pairs |"
    assert first_row == (f"| stsb | {100 * out['scores']['stsb']['spearman']:.1f} | "
                         f"{100 * out['scores']['stsb']['pearson']:.1f} | 12 |")
    assert second_row.startswith("| mine |") and average.endswith(f"| {12 + len(rows)} |")
    assert (tmp_path / "eval" / "sts.md").read_text().splitlines() == out["table"]
    assert json.loads((tmp_path / "eval" / "sts.json").read_text())["scores"] == out["scores"]


@pytest.mark.parametrize("content, line", [
    ("", r"mine.jsonl: empty file: expected one JSON object per line"),
    ('{"text": "a", "score": 1}\n', r"mine.jsonl:1: missing field 'text_pair'"),
    ('{"text": "a", "text_pair": "b"}\n', r"mine.jsonl:1: missing field 'score' \(each line is"),
    ('{"text": "a", "text_pair": "b", "score": "high"}\n', r"mine.jsonl:1: score \"high\" is not a number"),
])
def test_bad_sts_input_is_one_line_before_the_model_loads(content, line, tmp_path):
    (tmp_path / "mine.jsonl").write_text(content)
    with pytest.raises(ValueError, match=line):
        suite_evaluation.sts_suite(str(tmp_path / "no-model"), [str(tmp_path / "mine.jsonl")], str(tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()
