"""python -m bertjax.evaluate: every task of the suite that has data fine-tuned in-process (GLUE tasks
from TFDS, mocked offline), one table in the paper's layout; skipped tasks and mistakes in one line."""

import dataclasses
import json
import re

import pytest
import tensorflow_datasets as tfds

from bertjax import evaluate
from bertjax.data.tasks import readers
from test_finetune import pretrained  # noqa: F401  (the small pretrained workdir fixture)


def test_the_glue_table_of_the_tasks_with_data(pretrained, tmp_path, monkeypatch, capsys):  # noqa: F811
    ready = {"sst2", "stsb"}
    monkeypatch.setattr(evaluate, "available", lambda task, data_dir: None if task in ready else f"{task} not prepared")
    # Mocked TFDS draws its idx feature at random; GLUE's are unique, as the prediction files need.
    read_tfds = readers.read_tfds
    monkeypatch.setattr(readers, "read_tfds", lambda *a, **k: [dataclasses.replace(e, idx=i)
                                                                 for i, e in enumerate(read_tfds(*a, **k))])
    with tfds.testing.mock_data(num_examples=24):
        out = evaluate.evaluate(pretrained["workdir"], "glue", str(tmp_path / "glue"), epochs=1.0, batch_size=8,
                                max_seq_length=32)
    printed = capsys.readouterr().out
    assert "skipped mnli: mnli not prepared" in printed and "skipped rte: rte not prepared" in printed
    heading, rule, values = out["table"]
    assert heading == "| MNLI-(m/mm) | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average |"
    cells = [c.strip() for c in values.strip("|").split("|")]
    sst2 = 100 * out["scores"]["sst2"]["validation"]["accuracy"]
    stsb = 100 * out["scores"]["stsb"]["validation"]["spearman"]
    assert cells == ["-", "-", "-", f"{sst2:.1f}", "-", f"{stsb:.1f}", "-", "-", f"{(sst2 + stsb) / 2:.1f}"]
    # Each number is that task's own fine-tuning summary.
    for task in ready:
        summary = json.loads((tmp_path / "glue" / task / "summary.json").read_text())
        assert summary["best"]["metrics"] == out["scores"][task]
    saved = json.loads((tmp_path / "glue" / "glue.json").read_text())
    assert saved["table"] == out["table"] and set(saved["skipped"]) == {"mnli", "qqp", "qnli", "cola", "mrpc", "rte"}
    assert (tmp_path / "glue" / "glue.md").read_text().splitlines() == out["table"]


def test_mistakes_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--suite=superglue: choose one of glue"):
        evaluate.evaluate(str(tmp_path), "superglue", str(tmp_path))
    with pytest.raises(ValueError, match=re.escape("--tasks: swag not in suite glue")):
        evaluate.evaluate(str(tmp_path), "glue", str(tmp_path), tasks=["swag"])
    monkeypatch.setattr(evaluate, "available", lambda task, data_dir: "not prepared")
    with pytest.raises(ValueError, match="no task of suite glue has its data prepared"):
        evaluate.evaluate(str(tmp_path), "glue", str(tmp_path))
