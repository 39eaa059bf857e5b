"""Fine-tuning data: task table, readers (TFDS mocked, JSON lines), features, batches, submission files."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from bertjax.tasks import batches, features, readers, registry, submission
from bertjax.tasks.examples import ChoiceExample, Example
from bertjax.text import templates
from bertjax.text.tokenizers import load_tokenizer

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", ".", "##s", "is", "not"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    return load_tokenizer("wordpiece", str(path))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


# ----------------------------------------------------------------------------------------------------
# Task table
# ----------------------------------------------------------------------------------------------------


def test_glue_table():
    assert set(registry.TASKS) >= {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "hellaswag"}
    mnli = registry.TASKS["mnli"]
    assert mnli.eval_splits == ("validation_matched", "validation_mismatched")
    assert mnli.submission_file("test_mismatched") == "MNLI-mm.tsv"
    assert registry.TASKS["mrpc"].main_metric == "f1" and registry.TASKS["mrpc"].positive_index == 1
    assert registry.TASKS["stsb"].kind == "regression" and registry.TASKS["stsb"].num_labels == 1
    assert registry.TASKS["cola"].main_metric == "matthews_corr"
    assert registry.TASKS["hellaswag"].num_choices == 4
    for task in registry.TASKS.values():
        if task.kind == "classification":
            assert len(task.submission_labels) == len(task.labels), task.name


def test_labels_follow_the_installed_tfds_builders():
    for name in ("cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "wnli"):
        task = registry.TASKS[name]
        info_features = tfds.builder(task.tfds_name).info.features
        assert tuple(info_features["label"].names) == task.labels, name
        assert set(task.text_features) <= set(info_features), name


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown task 'mrcp': known tasks are cola, .*mrpc.*classification"):
        registry.get_task("mrcp")


def test_generic_tasks_take_their_labels_from_the_config():
    task = registry.get_task("classification", labels=["neg", "pos"])
    assert task.labels == ("neg", "pos") and task.metrics == ("accuracy", "f1") and task.positive_index == 1
    assert registry.get_task("classification", labels=["a", "b", "c"]).metrics == ("accuracy",)
    assert registry.get_task("multiple_choice", num_choices=3).num_choices == 3
    assert registry.get_task("regression").kind == "regression"
    with pytest.raises(ValueError, match="set data.labels"):
        registry.get_task("classification")
    with pytest.raises(ValueError, match="set data.num_choices"):
        registry.get_task("multiple_choice")
    with pytest.raises(ValueError, match="task mrpc has fixed labels"):
        registry.get_task("mrpc", labels=["x", "y"])


# ----------------------------------------------------------------------------------------------------
# Features
# ----------------------------------------------------------------------------------------------------


def _truncate_seq_pair(tokens_a, tokens_b, max_length):
    """google-research/bert's run_classifier._truncate_seq_pair, restated: pop from the longer
    list (B when equal) until the pair fits."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


@pytest.mark.parametrize("len_a, len_b, max_length", [
    (3, 2, 10), (10, 2, 8), (2, 10, 8), (5, 5, 7), (5, 5, 8), (9, 4, 7), (4, 9, 7), (6, 7, 9), (0, 12, 5),
    (12, 0, 5), (3, 3, 0), (1, 1, 1),
])
def test_pair_truncation_matches_the_published_algorithm(len_a, len_b, max_length):
    a, b = list(range(len_a)), list(range(len_b))
    _truncate_seq_pair(a, b, max_length)
    assert tuple(int(n) for n in features.truncated_lengths(len_a, len_b, max_length)) == (len(a), len(b))


def test_pair_truncation_on_arrays_matches_the_published_algorithm():
    rng = np.random.default_rng(0)
    len_a, len_b = rng.integers(0, 40, 500), rng.integers(0, 40, 500)
    new_a, new_b = features.truncated_lengths(len_a, len_b, 29)
    for i in range(500):
        a, b = list(range(len_a[i])), list(range(len_b[i]))
        _truncate_seq_pair(a, b, 29)
        assert (new_a[i], new_b[i]) == (len(a), len(b))


BERT = templates.bert_template(2, 3)


def test_encode_pair_layout():
    f = features.encode_pair([10, 11, 12], [20, 21], 10, template=BERT, pad_id=0)
    np.testing.assert_array_equal(f["input_ids"], [2, 10, 11, 12, 3, 20, 21, 3, 0, 0])
    np.testing.assert_array_equal(f["segment_ids"], [0, 0, 0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(f["input_mask"], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
    assert all(v.dtype == np.int32 for v in f.values())
    # A too-long pair: the longer segment (A) loses its tail.
    f = features.encode_pair([10, 11, 12, 13, 14], [20, 21], 8, template=BERT, pad_id=0)
    np.testing.assert_array_equal(f["input_ids"], [2, 10, 11, 12, 3, 20, 21, 3])
    single = features.encode_pair([10, 11, 12, 13], None, 5, template=BERT, pad_id=0)
    np.testing.assert_array_equal(single["input_ids"], [2, 10, 11, 12, 3])
    np.testing.assert_array_equal(single["segment_ids"], [0] * 5)
    # RoBERTa's template: <s> A </s></s> B </s>, one segment; the two separators leave A and B one token less.
    roberta = templates.Template((0,), (2, 2), (2,), 0)
    f = features.encode_pair([10, 11, 12, 13, 14], [20, 21], 8, template=roberta, pad_id=1)
    np.testing.assert_array_equal(f["input_ids"], [0, 10, 11, 2, 2, 20, 21, 2])
    np.testing.assert_array_equal(f["segment_ids"], [0] * 8)
    single = features.encode_pair([10, 11], None, 5, template=roberta, pad_id=1)
    np.testing.assert_array_equal(single["input_ids"], [0, 10, 11, 2, 1])


def test_featurize_pairs_and_singles(tokenizer):
    task = registry.get_task("classification", labels=["no", "yes"])
    examples = [Example(0, "The cat sat.", "A dog ran far away.", 1), Example(1, "cats", None, None)]
    f = features.featurize(examples, task, tokenizer, max_seq_length=12)
    assert f["input_ids"].shape == f["segment_ids"].shape == f["input_mask"].shape == (2, 12)
    assert tokenizer.convert_ids_to_tokens(f["input_ids"][0][:9]) == [
        "[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "dog", "ran"]
    assert f["input_ids"][0][-1] == tokenizer.sep_id  # B cut to fit, still closed by [SEP]
    np.testing.assert_array_equal(f["segment_ids"][0], [0] * 6 + [1] * 6)
    assert tokenizer.convert_ids_to_tokens(f["input_ids"][1][:4]) == ["[CLS]", "cat", "##s", "[SEP]"]
    np.testing.assert_array_equal(f["label"], [1, -1])  # -1: no label
    np.testing.assert_array_equal(f["example_weight"], [1.0, 1.0])


def test_featurize_multiple_choice(tokenizer):
    task = registry.get_task("multiple_choice", num_choices=3)
    examples = [ChoiceExample(0, "the cat", ("sat", "ran", "is not"), 2)] * 2
    f = features.featurize(examples, task, tokenizer, max_seq_length=8)
    assert f["input_ids"].shape == (2, 3, 8) and f["label"].tolist() == [2, 2]
    assert tokenizer.convert_ids_to_tokens(f["input_ids"][0, 2][:7]) == [
        "[CLS]", "the", "cat", "[SEP]", "is", "not", "[SEP]"]
    np.testing.assert_array_equal(f["segment_ids"][0, 2], [0, 0, 0, 0, 1, 1, 1, 0])


# ----------------------------------------------------------------------------------------------------
# TFDS (mocked: offline)
# ----------------------------------------------------------------------------------------------------


def test_tfds_glue_pairs_to_batches(tokenizer):
    task = registry.TASKS["mrpc"]
    with tfds.testing.mock_data(num_examples=7):
        examples = readers.read_split(task, "validation")
    assert len(examples) == 7
    assert all(isinstance(e.text, str) and isinstance(e.text_pair, str) and e.label in (0, 1) for e in examples)
    f = features.featurize(examples, task, tokenizer, max_seq_length=16)
    batch = next(batches.train_batches(f, batch_size=4, seed=0))
    assert batch["input_ids"].shape == (4, 16) and batch["label"].shape == (4,)
    evals = list(batches.eval_batches(f, batch_size=4))
    assert [b["input_ids"].shape for b in evals] == [(4, 16), (4, 16)]
    with pytest.raises(ValueError, match="no split 'dev'"):
        readers.read_tfds(task, "dev")


def _hellaswag_as_dataset(self, split, **kwargs):
    rows = [{"context": f"the cat {i}", "endings": ["sat", "ran", "is not", "a dog"], "label": i % 4,
             "activity_label": "", "split_type": "indomain", "source_id": ""} for i in range(5)]
    return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=self.info.features.get_tensor_spec())


def test_tfds_multiple_choice_to_batches(tokenizer):
    task = registry.TASKS["hellaswag"]
    with tfds.testing.mock_data(as_dataset_fn=_hellaswag_as_dataset):
        examples = readers.read_split(task, "validation")
    assert examples[1] == ChoiceExample(1, "the cat 1", ("sat", "ran", "is not", "a dog"), 1)
    f = features.featurize(examples, task, tokenizer, max_seq_length=10)
    batch = next(batches.eval_batches(f, batch_size=8))
    assert batch["input_ids"].shape == (8, 4, 10)
    np.testing.assert_array_equal(batch["example_weight"], [1] * 5 + [0] * 3)


# ----------------------------------------------------------------------------------------------------
# JSON lines
# ----------------------------------------------------------------------------------------------------


def test_jsonl_classification_and_regression(tmp_path):
    mnli = registry.TASKS["mnli"]
    path = _write(tmp_path / "mnli.jsonl", [
        json.dumps({"text": "a", "text_pair": "b", "label": "neutral"}), "",
        json.dumps({"text": "c", "text_pair": "d", "label": 2}),
    ])
    assert readers.read_jsonl(path, mnli) == [Example(0, "a", "b", 1), Example(1, "c", "d", 2)]
    path = _write(tmp_path / "scores.jsonl",
                  [json.dumps({"text": "a", "label": 3.7}), json.dumps({"text": "b", "label": 1})])
    assert [e.label for e in readers.read_jsonl(path, registry.get_task("regression"))] == [3.7, 1.0]
    test_set = _write(tmp_path / "test.jsonl", [json.dumps({"text": "a", "text_pair": "b"})])
    assert readers.read_jsonl(test_set, mnli, labeled=False)[0].label is None


def test_jsonl_multiple_choice(tmp_path):
    path = _write(tmp_path / "mc.jsonl", [json.dumps({"context": "c", "choices": ["x", "y"], "label": 1})])
    task = registry.get_task("multiple_choice", num_choices=2)
    assert readers.read_jsonl(path, task) == [ChoiceExample(0, "c", ("x", "y"), 1)]


SST2 = registry.TASKS["sst2"]
GOOD = json.dumps({"text": "fine", "label": "positive"})


@pytest.mark.parametrize("task, lines, message", [
    (SST2, [GOOD, "{not json"], r":2: invalid JSON"),
    (SST2, [GOOD, "[1, 2]"], r":2: expected a JSON object, got list"),
    (SST2, [json.dumps({"label": 1})], r":1: missing field 'text'"),
    (SST2, [GOOD, json.dumps({"text": "x"})], r":2: missing field 'label'"),
    (SST2, [json.dumps({"text": "x", "label": "entailment"})],
     r":1: label \"entailment\" is not a class of task sst2: expected one of negative, positive \(or its index 0-1\)"),
    (SST2, [json.dumps({"text": "x", "label": 2})], r":1: label 2 is not a class of task sst2"),
    (SST2, [json.dumps({"text": "x", "text_pair": "y", "label": 1})], r":1: task sst2 takes single sentences"),
    (registry.TASKS["mrpc"], [json.dumps({"text": "x", "label": 1})], r":1: missing field 'text_pair'"),
    (registry.TASKS["stsb"], [json.dumps({"text": "x", "text_pair": "y", "label": "high"})],
     r":1: label \"high\" is not a number: task stsb is a regression"),
    (registry.get_task("multiple_choice", num_choices=3), [json.dumps({"context": "c", "choices": ["a"], "label": 0})],
     r":1: 1 choices, task multiple_choice expects 3"),
    (registry.get_task("multiple_choice", num_choices=2),
     [json.dumps({"context": "c", "choices": ["a", "b"], "label": 5})],
     r":1: label 5 is not a choice index: expected 0-1"),
])
def test_jsonl_bad_input_is_one_line_naming_file_and_line(tmp_path, task, lines, message):
    path = _write(tmp_path / "data.jsonl", lines)
    with pytest.raises(ValueError, match=message) as error:
        readers.read_jsonl(path, task)
    assert str(error.value).startswith(path + ":") and "\n" not in str(error.value)


def test_jsonl_missing_and_empty_files(tmp_path):
    with pytest.raises(ValueError, match=r"nothere.jsonl: no such file"):
        readers.read_jsonl(str(tmp_path / "nothere.jsonl"), SST2)
    empty = _write(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(ValueError, match=r"empty.jsonl: empty file"):
        readers.read_jsonl(empty, SST2)
    with pytest.raises(ValueError, match=r"task classification reads the user's JSON-lines files: set data.train"):
        readers.read_split(registry.get_task("classification", labels=["a", "b"]), "train")


# ----------------------------------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------------------------------


def _toy_features(n):
    return {"idx": np.arange(n, dtype=np.int32), "example_weight": np.ones(n, np.float32)}


def test_shuffling_is_a_pure_function_of_seed_and_epoch():
    np.testing.assert_array_equal(batches.epoch_order(50, seed=3, epoch=2), batches.epoch_order(50, seed=3, epoch=2))
    assert not np.array_equal(batches.epoch_order(50, 3, 0), batches.epoch_order(50, 3, 1))
    assert not np.array_equal(batches.epoch_order(50, 3, 0), batches.epoch_order(50, 4, 0))


@pytest.mark.parametrize("n, batch_size", [(50, 8), (10, 32), (48, 8)])
def test_each_epoch_covers_every_example_once(n, batch_size):
    f = _toy_features(n)
    stream = batches.train_batches(f, batch_size, seed=1)
    steps = batches.num_train_steps(n, batch_size, epochs=3)
    seen = np.concatenate([next(stream)["idx"] for _ in range(steps)])[: 3 * n]
    for epoch in range(3):
        np.testing.assert_array_equal(np.sort(seen[epoch * n:(epoch + 1) * n]), np.arange(n))


def test_resume_at_step_n_gives_the_same_batches():
    f = _toy_features(37)
    stream = batches.train_batches(f, 8, seed=5)
    first = [next(stream)["idx"] for _ in range(12)]
    resumed = batches.train_batches(f, 8, seed=5, start_step=7)
    for step in range(7, 12):
        np.testing.assert_array_equal(next(resumed)["idx"], first[step])


def test_eval_batches_in_order_with_zero_weight_padding():
    evals = list(batches.eval_batches(_toy_features(10), batch_size=4))
    assert len(evals) == 3
    np.testing.assert_array_equal(np.concatenate([b["idx"] for b in evals])[:10], np.arange(10))
    np.testing.assert_array_equal(evals[-1]["example_weight"], [1, 1, 0, 0])


# ----------------------------------------------------------------------------------------------------
# GLUE submission
# ----------------------------------------------------------------------------------------------------


def test_submission_files():
    mnli = registry.TASKS["mnli"]
    assert submission.file_name(mnli, "test_matched") == "MNLI-m.tsv"
    assert submission.submission_lines(mnli, [2, 0, 1], [2, 0, 1]) == [
        "index\tprediction", "0\tentailment", "1\tneutral", "2\tcontradiction"]
    assert submission.submission_lines(registry.TASKS["mrpc"], [0, 1], [1, 0]) == ["index\tprediction", "0\t1", "1\t0"]
    assert submission.submission_lines(registry.TASKS["wnli"], [0], [1]) == ["index\tprediction", "0\t1"]
    assert submission.submission_lines(registry.TASKS["stsb"], [0, 1], [3.14159, 0.5]) == [
        "index\tprediction", "0\t3.142", "1\t0.500"]
    with pytest.raises(ValueError, match="no submission file for split 'validation'"):
        registry.TASKS["rte"].submission_file("validation")
    with pytest.raises(ValueError, match="indices repeat"):
        submission.submission_lines(registry.TASKS["rte"], [0, 0], [1, 1])


def test_processes_share_each_global_batch():
    f = _toy_features(11)
    whole = next(batches.train_batches(f, 4, seed=2, start_step=3))["idx"]
    parts = [next(batches.train_batches(f, 4, seed=2, start_step=3, process_index=i, process_count=2))["idx"]
             for i in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    last = [list(batches.eval_batches(f, 4, process_index=i, process_count=2))[-1] for i in range(2)]
    np.testing.assert_array_equal(np.concatenate([b["example_weight"] for b in last]), [1, 1, 1, 0])
    with pytest.raises(ValueError, match="batch_size=5 does not divide among 2 processes"):
        next(batches.train_batches(f, 5, seed=0, process_count=2))
