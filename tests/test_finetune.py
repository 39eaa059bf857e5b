"""python -m bertjax.finetune, in-process (and one subprocess for the error line): a classification task
built from real text learns above its majority baseline from a small BERT; metrics.jsonl dev lines,
the best checkpoint, predictions files and the summary; regression and multiple choice on the user's
files; a Hugging Face directory as init_from; the learning-rate sweep; resume; bad input."""

import json
import pathlib
import re
import shutil
import signal
import sys

import jax
import numpy as np
import pytest
from conftest import config_flags, copy_of, finetune_config, run_command, start_command, tiny_config, wait_for

from bertjax.runs import finetuning
from bertjax.tasks import steps
from bertjax.training import checkpoint
from bertjax.interop import hf
from bertjax.models.config import BertConfig
from bertjax.tasks import demo_tasks
from configs.finetune import common as finetune_configs


def keyword_sentences(seed=0):
    """Sentences of the demo corpus (Python's documentation prose), half with the keyword, balanced."""
    return demo_tasks.keyword_examples(seed)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


small_config = finetune_config  # (task, pretrained, **data): the runs' settings here, in conftest for the shared run


def read_lines(workdir):
    return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def classification_run(finetuned):
    """conftest's finetuned: the keyword classifier fine-tuned from `pretrained` for 4 epochs (small_config's
    settings), made once per test run. Read-only."""
    return finetuned


def test_a_classifier_learns_above_its_majority_baseline(classification_run, pretrained):
    summary = classification_run["summary"]
    labels = pretrained["dev_labels"]
    majority = max(labels.count("yes"), labels.count("no")) / len(labels)
    accuracy = summary["best"]["metrics"]["validation"]["accuracy"]
    assert accuracy >= majority + 0.15, (accuracy, majority)
    assert summary["main_metric"] == "accuracy" and summary["steps"] == 125  # ceil(4 x 500 / 16)


def test_outputs_of_a_run(classification_run, pretrained):
    workdir = pathlib.Path(classification_run["workdir"])
    lines = read_lines(workdir)
    dev = [r for r in lines if r.get("split") == "validation"]
    assert [r["step"] for r in dev] == [32, 64, 96, 125]  # every epoch (32 steps) and the last
    assert all({"accuracy", "f1"} <= set(r) for r in dev)
    train_lines = [r for r in lines if "split" not in r]
    assert train_lines and all({"loss", "learning_rate", "accuracy"} <= set(r) for r in train_lines)
    best = classification_run["summary"]["best"]
    assert best["value"] == max(r["accuracy"] for r in dev)
    # The best checkpoint is kept and is what bertjax.load-style readers find.
    params, meta = checkpoint.restore_params(str(workdir / "best"))
    assert meta.step == best["step"] and meta.task.labels == ("no", "yes")
    assert set(params) == {"bert", "classifier"} and meta.tokenizer.path == "vocab.txt"
    assert (workdir / "vocab.txt").exists() and (workdir / "config.json").exists()
    # Predictions: the dev split and the unlabelled test file, GLUE's TSV form, every example once.
    dev_tsv = (workdir / "predictions" / "validation.tsv").read_text().splitlines()
    test_tsv = (workdir / "predictions" / "test.tsv").read_text().splitlines()
    assert dev_tsv[0] == "index\tprediction" and len(dev_tsv) == 1 + 120
    assert len(test_tsv) == 1 + 40 and {
        line.split("\t")[1] for line in test_tsv[1:]} <= {"no", "yes"}
    predicted = [line.split("\t")[1] for line in dev_tsv[1:]]
    agreement = np.mean([p == y for p, y in zip(predicted, pretrained["dev_labels"])])
    assert agreement == pytest.approx(best["value"])  # the files are the best checkpoint's
    assert json.loads((workdir / "summary.json").read_text())["best"]["step"] == best["step"]
    # bertjax.load reads the best checkpoint back and predicts what the prediction file says.
    import bertjax

    model = bertjax.load(workdir)
    assert model.task.labels == ("no", "yes")
    assert [p["label"] for p in model.predict(dev_texts(pretrained)[:8])] == predicted[:8]


def dev_texts(pretrained) -> list[str]:
    return [json.loads(line)["text"]
            for line in pathlib.Path(pretrained["files"]["validation"]).read_text().splitlines()]


def test_a_finished_run_rerun_resumes_at_its_end(classification_run, tmp_path):
    workdir = copy_of(classification_run["workdir"], tmp_path / "run")
    before = read_lines(workdir)
    summary = finetuning.finetune(classification_run["config"], str(workdir))
    assert json.loads(json.dumps(summary["best"])) == classification_run["summary"]["best"]
    assert read_lines(workdir) == before  # nothing trained twice, nothing logged twice


def test_task_distillation_from_the_fine_tuned_run_then_load_and_export(classification_run, pretrained, tmp_path):
    """The program's task distillation (distill.teacher: the run above): the teacher's soft loss is logged,
    the checkpoints hold the student alone, and the student loads and exports as any fine-tuned model."""
    import bertjax
    from bertjax.runs import exporting

    config = small_config("classification", pretrained, labels=("no", "yes"), **pretrained["files"])
    config.distill.update(teacher=classification_run["workdir"], alpha=0.5, temperature=2.0)
    workdir = tmp_path / "student"
    summary = finetuning.finetune(config, str(workdir))
    train_lines = [r for r in read_lines(workdir) if "split" not in r]
    assert train_lines and all(np.isfinite(r["soft_loss"]) and r["soft_loss"] >= 0 for r in train_lines)
    params, meta = checkpoint.restore_params(str(workdir / checkpoint.BEST_DIR))
    assert set(params) == {"bert", "classifier"} and meta.step == summary["best"]["step"]
    # The student predicts what its prediction file says, loaded from the workdir and from a params export.
    predicted = [line.split("\t")[1]
                 for line in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    exported = exporting.export(str(workdir), str(tmp_path / "exported"), "params")
    for model in (bertjax.load(str(workdir)), bertjax.load(exported)):
        assert [p["label"] for p in model.predict(dev_texts(pretrained)[:8])] == predicted[:8]
    # A teacher that was not fine-tuned on the task: one line naming the setting.
    config.distill.teacher = pretrained["workdir"]
    with pytest.raises(ValueError, match=r"distill\.teacher=.* is not a model fine-tuned on"):
        finetuning.finetune(config, str(tmp_path / "other"))


@pytest.mark.mesh
def test_regression_and_multiple_choice_on_the_users_files(pretrained, tmp_path):
    rng = np.random.default_rng(1)
    sentences = [s for s, _ in keyword_sentences(2)][:96]
    root = tmp_path
    reg = [{"text": s, "label": float(len(s.split()))} for s in sentences]
    config = small_config("regression", pretrained, train=write_jsonl(root / "r-train.jsonl", reg[:64]),
                          validation=write_jsonl(root / "r-dev.jsonl", reg[64:]))
    summary = finetuning.finetune(config, str(root / "regression"))
    assert set(summary["best"]["metrics"]["validation"]) == {"pearson", "spearman"}
    choice = [{"context": s, "choices": [s, sentences[(i + 7) % 96], sentences[(i + 11) % 96]], "label": 0}
              for i, s in enumerate(sentences)]
    for row in choice:  # the right answer (a copy of the context) at a random place
        k = int(rng.integers(3))
        row["choices"][0], row["choices"][k] = row["choices"][k], row["choices"][0]
        row["label"] = k
    config = small_config("multiple_choice", pretrained, num_choices=3,
                          train=write_jsonl(root / "c-train.jsonl", choice[:64]),
                          validation=write_jsonl(root / "c-dev.jsonl", choice[64:]))
    summary = finetuning.finetune(config, str(root / "choice"))
    assert set(summary["best"]["metrics"]["validation"]) == {"accuracy"}
    tsv = (root / "choice" / "predictions" / "validation.tsv").read_text().splitlines()
    assert len(tsv) == 1 + 32 and {int(line.split("\t")[1]) for line in tsv[1:]} <= {0, 1, 2}


def test_from_a_hugging_face_directory_and_the_sweep(pretrained, tmp_path):
    hf_dir = tmp_path / "hf"
    hf.save_hf_checkpoint(hf_dir, pretrained["cfg"], pretrained["params"],
                          vocab_path=str(pathlib.Path(pretrained["workdir"]) / "vocab.txt"))
    files = pretrained["files"]
    config = small_config("classification", pretrained, labels=("no", "yes"), train=files["train"],
                          validation=files["validation"])
    config.train.init_from = str(hf_dir)
    config.sweep_learning_rates = [1e-4, 1e-3]
    out = finetuning.sweep(config, str(tmp_path / "sweep"))
    runs = out["runs"]
    assert set(runs) == {"0.0001", "0.001"}
    assert out["best"]["value"] == max(r["best"]["value"] for r in runs.values())
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["best_learning_rate"] == \
        out["best_learning_rate"]
    assert (tmp_path / "sweep" / "lr-0.001" / "best").is_dir()


def test_trained_short_and_evaluated_long(pretrained, tmp_path):
    """data.eval_max_seq_length: training rows cut at data.max_seq_length, dev and test rows at the eval length;
    the checkpoint's task records it, so bertjax.load's predict cuts there too and gives the prediction file."""
    import bertjax
    from bertjax.runs import task_data

    config = small_config("classification", pretrained, labels=("no", "yes"), **pretrained["files"])
    config.data.update(max_seq_length=12, eval_max_seq_length=48)
    task = task_data.task_from_config(config)
    train, dev, test = task_data.split_features(task, bertjax.load(pretrained["workdir"]).tokenizer, config)
    assert train.features["input_ids"].shape[1] == 12
    assert dev["validation"].features["input_ids"].shape[1] == test["test"].features["input_ids"].shape[1] == 48
    assert dev["validation"].features["input_mask"].sum(1).max() > 12  # dev texts longer than the training rows

    config.train.epochs = 0.25
    finetuning.finetune(config, str(tmp_path / "run"))
    model = bertjax.load(tmp_path / "run")
    assert model.task.max_seq_length == 48
    dev_tsv = (tmp_path / "run" / "predictions" / "validation.tsv").read_text().splitlines()[1:]
    assert [p["label"] for p in model.predict(dev_texts(pretrained))] == [line.split("\t")[1] for line in dev_tsv]
    too_long = small_config("classification", pretrained, labels=("no", "yes"), eval_max_seq_length=96,
                            **pretrained["files"])
    with pytest.raises(ValueError,
                       match=re.escape("data.eval_max_seq_length=96 is longer than the 64 positions of the model")):
        finetuning.finetune(too_long, str(tmp_path / "too-long"))
    span = small_config("squad", pretrained, eval_max_seq_length=96)
    with pytest.raises(ValueError, match=re.escape("data.eval_max_seq_length is for classification, regression, "
                                                   "multiple_choice, tagging tasks; task squad is span")):
        finetuning.finetune(span, str(tmp_path / "span"))


def test_bad_input_is_one_line(pretrained, tmp_path):
    files = pretrained["files"]
    cases = [
        (small_config("sst3", pretrained), "unknown task 'sst3'"),
        (small_config("classification", pretrained, labels=("neg", "pos"), train=files["train"],
                      validation=files["validation"]),
         'train.jsonl:1: label "yes" is not a class of task classification'),
        (small_config("classification", pretrained, labels=("no", "yes"),
                      train=write_jsonl(tmp_path / "empty.jsonl", []), validation=files["validation"]), "empty"),
    ]
    for config, fragment in cases:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            finetuning.finetune(config, str(tmp_path / "bad"))
    # A checkpoint whose vocabulary is larger than its model's: another vocabulary size.
    small = tmp_path / "small-vocab"
    shutil.copytree(pretrained["workdir"], small)
    (small / "vocab.txt").write_text((small / "vocab.txt").read_text() + "".join(f"extra{i}\n" for i in range(50)))
    old_spelling = small_config("classification", pretrained, labels=("no", "yes"), **files)
    old_spelling.train.init_from, old_spelling.init_from = None, str(small)  # the older key, still read
    with pytest.raises(ValueError, match="another vocabulary size"):
        finetuning.finetune(old_spelling, str(tmp_path / "bad2"))
    # Through the program: one line, exit 2, no traceback.
    result = run_command(
        [sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune/classification.py",
         f"--config.train.init_from={pretrained['workdir']}", f"--config.data.train={files['train']}",
         f"--config.data.validation={files['validation']}", "--config.data.labels=('neg', 'pos')",
         f"--workdir={tmp_path / 'bad3'}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("finetune.py: error:")]
    assert len(errors) == 1 and "train.jsonl:1:" in errors[0] and "expected one of neg, pos" in errors[0], \
        result.stderr


@pytest.mark.parametrize("missing", ["train", "validation", "test"])
def test_a_missing_data_file_is_said_before_the_model_loads(tmp_path, missing):
    """init_from names nothing that exists: the data file's line comes first, so nothing was loaded."""
    data = {split: write_jsonl(tmp_path / f"{split}.jsonl", [{"text": "a b", "label": "no"}])
            for split in ("train", "validation", "test")}
    data[missing] = str(tmp_path / "nowhere.jsonl")
    config = finetune_configs.finetune_config("classification")
    config.train.init_from = str(tmp_path / "no-model")
    config.data.update(labels=("no", "yes"), **data)
    with pytest.raises(FileNotFoundError,
                       match=r"^" + re.escape(f"data.{missing}={tmp_path / 'nowhere.jsonl'} does not exist") + "$"):
        finetuning.finetune(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------------
# The shared training core: gradient accumulation, SIGTERM and resume
# --------------------------------------------------------------------------------------------------


@pytest.mark.mesh
def test_gradient_accumulation_gives_the_updates_of_the_whole_batch():
    """train.grad_accum_steps=2 through the fine-tuning loss: the same losses and parameters as 1 (no
    dropout: each microbatch draws its own mask)."""
    import functools

    import optax

    from bertjax.models import heads
    from bertjax.training import sharding, state as train_state

    cfg = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    net = heads.network("classification", cfg, 3)
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:2])
    rules = sharding.logical_rules(finetune_configs.finetune_config("classification").logical_axis_rules)
    data_sharding = sharding.batch_sharding(mesh, rules)
    rng = np.random.default_rng(0)
    batches = [{"input_ids": rng.integers(1, 64, (8, 16)).astype(np.int32),
                "segment_ids": np.zeros((8, 16), np.int32), "input_mask": np.ones((8, 16), np.int32),
                "label": rng.integers(0, 3, (8,)).astype(np.int32), "example_weight": np.ones((8,), np.float32)}
               for _ in range(3)]
    loss = functools.partial(steps.task_loss, net=net, loss=heads.head("classification").loss)

    def run(k):
        init_key, dropout_key = train_state.root_keys(0)
        setup = train_state.Setup.create(net, heads.dummy_inputs("classification", 1, 16), optax.adam(1e-3), None,
                                         mesh, rules, init_key)
        step = setup.compile_train_step(loss, data_sharding, k)
        state, losses = setup.init(init_key), []
        with jax.set_mesh(mesh):
            for b in batches:
                state, sums = step(state, sharding.global_batch(b, data_sharding), dropout_key)
                losses.append(float(sums["loss_sum"]))
                assert float(sums["count"]) == 8 and float(sums["real_tokens"]) == 8 * 16
        return np.array(losses), state.params

    losses, params = run(1)
    acc_losses, acc_params = run(2)
    np.testing.assert_allclose(acc_losses, losses, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(acc_params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def preemption_settings(pretrained):
    """A 1-epoch run (32 steps) of the keyword classifier, logging every step and evaluating every 8."""
    files = pretrained["files"]
    return {"train.init_from": pretrained["workdir"], "data.train": files["train"],
            "data.validation": files["validation"], "data.labels": ("no", "yes"), "data.max_seq_length": 48,
            "train.batch_size": 16, "train.epochs": 1.0, "optimizer.learning_rate": 1e-3,
            "optimizer.bias_correction": True, "logging.log_every": 1, "logging.eval_every": 8,
            "logging.eval_batch_size": 32}


def dev_lines(workdir):
    return {r["step"]: {k: r[k] for k in ("accuracy", "f1")} for r in read_lines(workdir)
            if r.get("split") == "validation"}


@pytest.mark.slow
def test_sigterm_saves_exits_0_and_the_rerun_resumes_exactly(pretrained, tmp_path, capsys):
    """The program preempted (it compiles what this process compiles: conftest.program_env), then the same
    run re-run, and the run never stopped, both in this process."""
    settings = preemption_settings(pretrained)
    workdir = tmp_path / "preempted"
    proc = start_command([sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune/classification.py",
                          f"--workdir={workdir}", *config_flags(settings)])
    wait_for(lambda: (workdir / "metrics.jsonl").exists() and len([r for r in read_lines(workdir) if "loss" in r]) >= 3,
             proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    saved = int(out.split("SIGTERM: saved the checkpoint of step ")[1].split(";")[0])
    assert (workdir / "checkpoints" / str(saved) / "params").is_dir() and saved < 32
    assert not (workdir / "summary.json").exists()  # stopped: no predictions of a half-trained model

    config = tiny_config(settings, "configs/finetune/classification.py")
    finetuning.finetune(config, str(workdir))
    assert f"resumed from step {saved}" in capsys.readouterr().out
    whole = tmp_path / "whole"
    finetuning.finetune(config, str(whole))
    expected, got = dev_lines(whole), dev_lines(workdir)
    later = [step for step in expected if step > saved]
    assert later and {s: got[s] for s in later} == {s: expected[s] for s in later}
