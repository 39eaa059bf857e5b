"""The metric writer against independent readers (TensorFlow's event reader, TensorBoard's, json), the
step timer and the console line.

TensorFlow's own summary_iterator and tensorboard's EventAccumulator are the reference for the event
files, which are written without TensorFlow.
"""

import glob
import json
import logging
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax.training import writers

REPO = pathlib.Path(__file__).resolve().parents[1]


# --- Throughput and the console line --------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_step_timer_rates_over_the_last_interval():
    clock = FakeClock()
    timer = writers.StepTimer(total_steps=1000, start_step=100, clock=clock)
    clock.now += 10.0
    rates = timer.update(200, real_tokens=50_000)
    assert rates == pytest.approx({"tokens_per_second": 5000.0, "steps_per_second": 10.0, "eta_seconds": 80.0})
    clock.now += 4.0  # faster now: the rate is the last interval's, not the average since the start
    rates = timer.update(300, real_tokens=40_000)
    assert rates == pytest.approx({"tokens_per_second": 10_000.0, "steps_per_second": 25.0, "eta_seconds": 28.0})
    clock.now += 100.0  # e.g. an evaluation, not counted after restart
    timer.restart(300)
    clock.now += 1.0
    assert timer.update(1100, real_tokens=1)["eta_seconds"] == 0.0  # past the end: no negative ETA
    with pytest.raises(ValueError, match="no steps"):
        timer.update(1100, real_tokens=1)


def test_step_timer_default_clock_is_real():
    timer = writers.StepTimer(total_steps=10)
    rates = timer.update(1, real_tokens=10)
    assert rates["tokens_per_second"] > 0 and math.isfinite(rates["eta_seconds"])


@pytest.mark.parametrize(
    "seconds, text", [(3731, "1:02:11"), (0, "0:00:00"), (59.6, "0:01:00"), (90000, "25:00:00")]
)
def test_format_duration(seconds, text):
    assert writers.format_duration(seconds) == text


def test_format_duration_rejects_nonsense():
    with pytest.raises(ValueError):
        writers.format_duration(float("nan"))
    with pytest.raises(ValueError):
        writers.format_duration(-1)


def test_console_line():
    values = {
        "eta_seconds": 3731, "mfu": 0.3124, "tokens_per_second": 41_234.0, "grad_norm": 1.031,
        "learning_rate": 1.2e-4, "nsp_accuracy": 0.62, "mlm_accuracy": 0.1214, "loss": 6.2141,
        "custom": 0.123456, "count": np.int32(7),
    }
    line = writers.format_console_line(1200, values)
    assert line == (
        "step 1200 | loss 6.214 | mlm_acc 0.121 | nsp_acc 0.620 | lr 1.2e-04 | grad_norm 1.03"
        " | 41.2k tok/s | mfu 31.2% | eta 1:02:11 | custom 0.1235 | count 7"
    )
    eval_line = writers.format_console_line(
        5, {"padding_efficiency": 0.9123, "loss": float("nan"), "tokens_per_second": 2.5e6}, split="eval")
    assert eval_line == "step 5 [eval] | loss nan | 2.50M tok/s | real 91.2%"


# --- Event files ---------------------------------------------------------------------------------------


def read_events(path):
    import tensorflow as tf
    return list(tf.compat.v1.train.summary_iterator(path))


def scalars_by_step(events):
    return {e.step: {v.tag: v.simple_value for v in e.summary.value} for e in events if e.summary.value}


def test_event_file_read_by_tensorflow(tmp_path):
    with writers.MetricWriter(str(tmp_path), console=False) as writer:
        writer.write(10, {"loss": 6.25, "learning_rate": 1e-4, "big": 1e300})
        writer.write(20, {"loss": np.float32(5.5), "mlm_accuracy": 0.125, "steps": np.int64(3)})
        writer.write(20, {"loss": 7.0, "mlm_accuracy": float("nan")}, split="eval")

    (train_path,) = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*.bertjax"))
    (eval_path,) = glob.glob(str(tmp_path / "tensorboard" / "eval" / "events.out.tfevents.*.bertjax"))

    events = read_events(train_path)
    assert events[0].file_version == "brain.Event:2"
    assert len(events) == 3
    assert events[1].wall_time > 1e9
    assert scalars_by_step(events) == {
        10: {"loss": 6.25, "learning_rate": pytest.approx(1e-4, rel=1e-6), "big": math.inf},
        20: {"loss": 5.5, "mlm_accuracy": 0.125, "steps": 3.0},
    }
    eval_events = read_events(eval_path)
    assert eval_events[0].file_version == "brain.Event:2"
    (step_20,) = [e for e in eval_events if e.summary.value]
    assert step_20.step == 20
    values = {v.tag: v.simple_value for v in step_20.summary.value}
    assert values["loss"] == 7.0 and math.isnan(values["mlm_accuracy"])


def test_event_file_encodes_large_and_negative_steps(tmp_path):
    writer = writers.EventFileWriter(str(tmp_path))
    writer.add_scalars(2**40 + 3, {"a": 1.0})
    writer.add_scalars(-5, {"b": -2.0})
    writer.close()
    events = read_events(writer.path)
    assert [(e.step, [(v.tag, v.simple_value) for v in e.summary.value]) for e in events[1:]] == [
        (2**40 + 3, [("a", 1.0)]),
        (-5, [("b", -2.0)]),
    ]


def test_event_file_read_by_tensorboard(tmp_path):
    import tensorboard.backend.event_processing.event_accumulator as event_accumulator
    with writers.MetricWriter(str(tmp_path), console=False) as writer:
        for step in (1, 2, 3):
            writer.write(step, {"loss": 10.0 / step})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    # Newer tensorboard migrates simple_value scalars to tensors on load.
    if "loss" in accumulator.Tags().get("scalars", []):
        points = [(s.step, s.value) for s in accumulator.Scalars("loss")]
    else:
        points = [(t.step, float(np.asarray(t.tensor_proto.float_val)[0])) for t in accumulator.Tensors("loss")]
    assert points == [(1, 10.0), (2, 5.0), (3, pytest.approx(10.0 / 3))]


# --- metrics.jsonl, console, enabled ----------------------------------------------------------------------


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]  # json.loads accepts NaN; check validity separately


def test_jsonl_one_valid_object_per_write(tmp_path):
    with writers.MetricWriter(str(tmp_path), console=False, tensorboard=False) as writer:
        writer.write(1, {"loss": 6.5, "nsp_accuracy": np.float32(0.5), "examples": np.int64(256)})
        writer.write(2, {"loss": float("nan"), "grad_norm": float("inf")})
        writer.write(2, {"loss": 7.25}, split="eval")
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    lines = [json.loads(line, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
             for line in text.splitlines()]
    assert len(lines) == 3
    assert [line["step"] for line in lines] == [1, 2, 2]
    assert "split" not in lines[0] and lines[2]["split"] == "eval"
    assert lines[0]["loss"] == 6.5 and lines[0]["nsp_accuracy"] == 0.5
    assert lines[0]["examples"] == 256 and isinstance(lines[0]["examples"], int)
    assert lines[1]["loss"] is None and lines[1]["grad_norm"] is None
    assert all(line["wall_time"] > 1e9 for line in lines)
    assert not (tmp_path / "tensorboard").exists()


def test_jsonl_is_flushed_at_each_write_and_appended_on_resume(tmp_path):
    writer = writers.MetricWriter(str(tmp_path), console=False)
    writer.write(1, {"loss": 1.0})
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 1  # readable before close
    (event_path,) = glob.glob(str(tmp_path / "tensorboard" / "events.*"))
    assert len(read_events(event_path)) == 2  # so is the event file
    writer.close()
    writer.close()  # harmless
    with pytest.raises(ValueError, match="after close"):
        writer.write(2, {"loss": 1.0})
    with writers.MetricWriter(str(tmp_path), console=False) as resumed:
        resumed.write(2, {"loss": 0.5})
    assert [line["step"] for line in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_disabled_writer_writes_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    workdir = tmp_path / "run"
    with writers.MetricWriter(str(workdir), enabled=False) as writer:
        writer.write(1, {"loss": 1.0})
        writer.write(1, {"loss": 1.0}, split="eval")
    assert not workdir.exists()
    assert "loss" not in caplog.text


def test_console_line_is_printed(tmp_path, capsys):
    with writers.MetricWriter(str(tmp_path), tensorboard=False) as writer:
        writer.write(7, {"loss": 2.5, "mfu": 0.5})
    assert "step 7 | loss 2.5 | mfu 50.0%" in capsys.readouterr().out
    with writers.MetricWriter(str(tmp_path), console=False, tensorboard=False) as writer:
        writer.write(8, {"loss": 2.5})
    assert "step 8" not in capsys.readouterr().out


def test_writer_rejects_bad_input(tmp_path):
    with writers.MetricWriter(str(tmp_path), console=False) as writer:
        with pytest.raises(ValueError, match="reserved"):
            writer.write(1, {"step": 1.0})
        with pytest.raises(ValueError, match="split"):
            writer.write(1, {"loss": 1.0}, split="../elsewhere")
        with pytest.raises(ValueError, match="scalars"):
            writer.write(1, {"loss": np.ones(3)})


def test_config_is_written_as_text_and_hparams(tmp_path):
    import tensorboard.backend.event_processing.event_accumulator as event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    config = {"model": {"hidden_size": 128, "dtype": "bfloat16"}, "train": {"init_from": None},
              "logical_axis_rules": [["batch", ["data", "fsdp"]]], "data": {"lower_case": True}}
    with writers.MetricWriter(str(tmp_path), console=False) as writer:
        writer.write_config(config)
        writer.write(1, {"loss": 1.0})
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    (text,) = accumulator.Tensors("config/text_summary")
    assert json.loads(text.tensor_proto.string_val[0].decode()) == config
    content = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["model.hidden_size"].number_value == 128
    assert hparams["model.dtype"].string_value == "bfloat16"
    assert hparams["data.lower_case"].bool_value is True
    assert hparams["logical_axis_rules"].string_value == '[["batch", ["data", "fsdp"]]]'
    assert "_hparams_/experiment" in content


def test_write_config_disabled_writes_nothing(tmp_path):
    with writers.MetricWriter(str(tmp_path / "a"), enabled=False) as writer:
        writer.write_config({"a": 1})
    with writers.MetricWriter(str(tmp_path / "b"), console=False, tensorboard=False) as writer:
        writer.write_config({"a": 1})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "tensorboard").exists()


# --- No heavy imports ----------------------------------------------------------------------------------


def test_import_pulls_in_no_heavy_framework():
    code = (
        "import sys, bertjax.training.writers, bertjax.training.flops\n"
        "heavy = [m for m in ('tensorflow', 'tensorboard', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """After a resume from the checkpoint of step 4, the earlier run's steps 5 and 6 leave metrics.jsonl
    and TensorBoard (which a SessionLog START at step 5 tells to drop them), and the file says where."""
    import tensorboard.backend.event_processing.event_accumulator as event_accumulator

    with writers.MetricWriter(str(tmp_path), console=False) as first:
        for step in range(1, 7):
            first.write(step, {"loss": 10.0 - step})
    with writers.MetricWriter(str(tmp_path), console=False) as second:
        second.resumed(4)
        for step in (5, 6):
            second.write(step, {"loss": 100.0 + step})
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.get("resumed_from") for r in records] == [None, None, None, None, 4, None]
    assert [r["loss"] for r in records if r["step"] > 4] == [105.0, 106.0]
    accumulator = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"), purge_orphaned_data=True)
    accumulator.Reload()
    if "loss" in accumulator.Tags().get("scalars", []):
        losses = {e.step: e.value for e in accumulator.Scalars("loss")}
    else:  # newer tensorboard migrates simple_value scalars to tensors on load
        losses = {t.step: float(np.asarray(t.tensor_proto.float_val)[0]) for t in accumulator.Tensors("loss")}
    assert losses == {1: 9.0, 2: 8.0, 3: 7.0, 4: 6.0, 5: 105.0, 6: 106.0}
