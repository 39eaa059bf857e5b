"""The compression report (bertjax/runs/compression_report.py, python -m bertjax.evaluate compress): one table
of a teacher and its int8 and int4-g128 variants on the keyword task's dev set, each figure checked against the same
data through another path; the command line's variants and mistakes."""

import json

import numpy as np
import pytest

from bertjax.compression import quantize
from bertjax.runs import compression_report as report
from bertjax.runs import suite_evaluation
from test_quantize import classifier, keyword_sentences  # noqa: F401  (the keyword task's classifier)

HEADINGS = ["model", "parameters", "size MB", "size ratio", "kernels MB", "kernel ratio", "dev accuracy", "retained",
            "batch 1 ms", "speed-up 1", "batch 4 ms", "speed-up 4"]


@pytest.fixture(scope="module")
def dev_file(classifier, tmp_path_factory):  # noqa: F811
    rows = keyword_sentences()[300:400]  # the dev rows of the classifier fixture
    path = tmp_path_factory.mktemp("report") / "dev.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in rows), encoding="utf-8")
    return str(path)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def measured(classifier, dev_file):  # noqa: F811
    return report.compression_report(report.Model("float32", classifier["workdir"]),
                                     [report.Model("int8", classifier["workdir"], "int8"),
                                      report.Model("int4", classifier["workdir"], "int4-g128")], dev_path=dev_file,
                                     batch_sizes=(1, 4), repeats=3, warmup=1)


def test_the_table_of_a_teacher_and_its_int8_variant(classifier, measured):  # noqa: F811
    out = measured
    heading, rule, teacher, int8, int4 = out["table"]
    assert cells(heading) == HEADINGS and rule == "|" + "---|" * len(HEADINGS)
    assert out["metric"] == "accuracy" and out["examples"] == 100 and out["max_seq_length"] == 48
    # The scores are the dev accuracy of each model's logits, computed here from the models themselves.
    float_model = classifier["float"]
    labels = np.array(classifier["labels"])
    float_accuracy = np.mean(float_model.task_logits(classifier["features"]).argmax(-1) == labels)
    rows = {r.name: r for r in out["rows"]}
    assert rows["float32"].score == pytest.approx(float_accuracy)
    assert cells(teacher)[:8] == ["float32", f"{float_model.num_params():,}",
                                  f"{quantize.weight_bytes(float_model.params) / 1e6:.2f}", "1.00x",
                                  f"{quantize.weight_bytes(float_model.params, kernels_only=True) / 1e6:.2f}",
                                  "1.00x", f"{100 * float_accuracy:.2f}", "100.0%"]
    # int8: the same parameters, fewer bytes (int8 kernels, float32 embeddings), the retained share.
    assert rows["int8"].parameters == rows["float32"].parameters
    ratio = rows["float32"].size_bytes / rows["int8"].size_bytes
    assert 1.0 < ratio < 4.0 and cells(int8)[3] == f"{ratio:.2f}x"
    assert cells(int8)[7] == f"{100 * rows['int8'].score / rows['float32'].score:.1f}%"
    # The dense kernels alone: int8 a quarter of float32 (and its scales), int4-g128 packed two a byte,
    # with a scale per 64 or 128 inputs: over 6x smaller.
    kernels = {name: rows["float32"].kernel_bytes / row.kernel_bytes for name, row in rows.items()}
    assert 3.5 < kernels["int8"] < 4.0 and kernels["int4"] > 6.0, kernels
    assert cells(int4)[5] == f"{kernels['int4']:.2f}x" and rows["int4"].parameters == rows["float32"].parameters
    assert cells(int4)[7] == f"{100 * rows['int4'].score / rows['float32'].score:.1f}%"
    for row in out["rows"]:
        assert set(row.latency_ms) == {1, 4} and all(ms > 0 for ms in row.latency_ms.values())
    speed_up = rows["float32"].latency_ms[4] / rows["int8"].latency_ms[4]
    assert cells(int8)[11] == f"{speed_up:.2f}x"


def test_the_command_line_reads_variants_and_says_what_is_wrong(classifier, dev_file, measured, tmp_path,  # noqa: F811
                                                               capsys, monkeypatch):
    assert suite_evaluation.parse_variant("q=runs/x+int8") == report.Model("q", "runs/x", "int8")
    assert suite_evaluation.parse_variant("q=runs/x+int8-dynamic") == report.Model("q", "runs/x", "int8-dynamic")
    assert suite_evaluation.parse_variant("q=runs/x+int4-g128") == report.Model("q", "runs/x", "int4-g128")
    assert suite_evaluation.parse_variant("student=runs/y") == report.Model("student", "runs/y", None)
    with pytest.raises(ValueError, match="quantize='int3-g128': choose one of"):
        suite_evaluation.parse_variant("q=runs/x+int3-g128")
    with pytest.raises(ValueError, match="--variant=runs/y: write NAME=DIR"):
        suite_evaluation.parse_variant("runs/y")
    # The program passes the flags on as they are, then prints and writes the library's table (measured
    # above: not measured again here).
    calls = []
    monkeypatch.setattr(report, "compression_report", lambda *a, **k: calls.append((a, k)) or measured)
    args = dict(task=dev_file, teacher=classifier["workdir"], variant=[f"int8={classifier['workdir']}+int8"],
                max_seq_length=None, repeats=3, tfds_data_dir=None, workdir=str(tmp_path / "out"))
    suite_evaluation.compress(**args)
    (teacher, variants), options = calls[0]
    assert teacher == report.Model("teacher", classifier["workdir"]) and variants == [
        report.Model("int8", classifier["workdir"], "int8")]
    assert options["dev_path"] == dev_file and options["repeats"] == 3
    printed = capsys.readouterr().out
    assert "classification: 100 dev examples (validation), sequence length 48" in printed
    assert "\n".join(measured["table"]) in printed
    assert (tmp_path / "out" / "compression.md").read_text().splitlines() == measured["table"]
    saved = json.loads((tmp_path / "out" / "compression.json").read_text())
    assert [r["name"] for r in saved["rows"]] == ["float32", "int8", "int4"]
    for change, message in [({"variant": []}, "at least one --variant"),
                            ({"task": "nowhere.jsonl"}, "--task=nowhere.jsonl: no such file; give the dev set")]:
        with pytest.raises(ValueError, match=message):
            suite_evaluation.compress(**{**args, **change})
    monkeypatch.undo()
    with pytest.raises(ValueError, match="model names must differ"):
        suite_evaluation.compress(**{**args, "variant": [f"teacher={classifier['workdir']}+int8"]})
