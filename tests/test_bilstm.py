"""The BiLSTM student of task distillation (Tang et al. 2019; bertjax/models/bilstm.py) and the paper's augmented
data (bertjax/tasks/augmentation.py): the network against torch's bidirectional LSTM on the same weights, the soft
loss against one written by hand, a short distillation run from conftest's fine-tuned teacher (the loss goes down;
export, bertjax.load and predict give the run's logits; the compression report reads it), the one-line errors,
and the augmentation's shares of masked, swapped and cut words and copies."""

import json
import pathlib
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from conftest import finetune_config

from bertjax.compression import distillation
from bertjax.models import bilstm, heads
from bertjax.runs import compression_report as report
from bertjax.runs import config_checks, console, exporting, finetuning
from bertjax.tasks import augmentation
from bertjax.tasks.examples import Example
from bertjax.text import templates
from bertjax.training import checkpoint
from configs.finetune import common as finetune_configs

# ---------------------------------------------------------------------------------------------------
# The network, against torch.nn.LSTM
# ---------------------------------------------------------------------------------------------------

CLS, SEP, PAD = 2, 3, 0


def random_params(cfg: bilstm.BiLSTMConfig, seed: int = 0) -> dict:
    """The network's params, every one drawn (the biases too, which init leaves at 0)."""
    shapes = nn.unbox(jax.eval_shape(lambda: bilstm.BiLSTMClassifier(cfg).init(
        jax.random.key(0), **heads.dummy_inputs("classification", 1, 4))["params"]))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda a: rng.normal(0.0, 0.5, a.shape).astype(np.float32), shapes)


def torch_lstm(params: dict, cfg: bilstm.BiLSTMConfig) -> torch.nn.LSTM:
    """torch's bidirectional LSTM with the same weights: its rows are the gates in the order input, forget,
    cell, output (i, f, g, o); flax keeps one kernel per gate, the recurrent one with the bias."""
    lstm = torch.nn.LSTM(cfg.embedding_size, cfg.hidden_size, batch_first=True, bidirectional=True)

    def stacked(cell, part, key):  # [in, 4H]: the gates' kernels (or biases) side by side, torch's order
        return torch.tensor(np.concatenate([cell[part + gate][key] for gate in ("i", "f", "g", "o")], axis=-1))

    with torch.no_grad():
        for suffix, name in (("", "lstm_forward"), ("_reverse", "lstm_backward")):
            getattr(lstm, f"weight_ih_l0{suffix}").copy_(stacked(params[name], "i", "kernel").T)
            getattr(lstm, f"weight_hh_l0{suffix}").copy_(stacked(params[name], "h", "kernel").T)
            getattr(lstm, f"bias_ih_l0{suffix}").zero_()
            getattr(lstm, f"bias_hh_l0{suffix}").copy_(stacked(params[name], "h", "bias"))
    return lstm


def by_hand(params: dict, cfg: bilstm.BiLSTMConfig, ids, segments, mask) -> np.ndarray:
    """The logits of each row, every sentence run alone (no padding) through torch's LSTM, max-pooled, then the
    ReLU layer and the output layer in numpy."""
    lstm, table = torch_lstm(params, cfg), params["embedding"]["embedding"]

    def pooled(tokens):
        if not len(tokens):
            return np.zeros(2 * cfg.hidden_size, np.float32)
        with torch.no_grad():
            states, _ = lstm(torch.tensor(table[tokens])[None])  # [1, n, 2H]
        return states[0].numpy().max(axis=0)

    out = []
    for row, seg, real in zip(ids, segments, mask.astype(bool)):
        if cfg.pairs:
            h1, h2 = pooled(row[real & (seg == 0)]), pooled(row[real & (seg == 1)])
            features = np.concatenate([h1, h2, h1 * h2, np.abs(h1 - h2)])
        else:
            features = pooled(row[real])
        hidden = np.maximum(features @ params["mlp"]["kernel"] + params["mlp"]["bias"], 0.0)
        out.append(hidden @ params["classifier"]["kernel"] + params["classifier"]["bias"])
    return np.stack(out)


def rows(pairs: bool):
    """Rows as the features hold them: [CLS] A [SEP] (B [SEP]) and padding, of several lengths; a pair model
    also given one sentence (its second empty)."""
    rng = np.random.default_rng(1)
    texts = [(rng.integers(5, 40, n), rng.integers(5, 40, m) if pairs else None) for n, m in ((3, 4), (1, 7), (6, 1),
                                                                                            (9, 3), (2, 0))]
    seq_len = 16
    ids, segments, mask = (np.zeros((len(texts), seq_len), np.int32) for _ in range(3))
    for r, (a, b) in enumerate(texts):
        tokens = [CLS, *a, SEP] + ([*b, SEP] if b is not None and len(b) else [])
        ids[r, :len(tokens)], mask[r, :len(tokens)] = tokens, 1
        segments[r, len(a) + 2:len(tokens)] = 1
    return ids, segments, mask


@pytest.mark.parametrize("pairs", [False, True], ids=["one-sentence", "pairs"])
def test_the_network_is_torchs_bidirectional_lstm_max_pooled(pairs):
    cfg = bilstm.BiLSTMConfig(vocab_size=40, num_labels=3, embedding_size=6, hidden_size=5, mlp_size=7, pairs=pairs)
    params = random_params(cfg)
    ids, segments, mask = rows(pairs)
    logits = jax.jit(bilstm.BiLSTMClassifier(cfg).apply)({"params": params}, ids, segments, mask)
    np.testing.assert_allclose(np.asarray(logits), by_hand(params, cfg, ids, segments, mask), rtol=1e-5, atol=1e-5)
    assert set(params) == {"embedding", "lstm_forward", "lstm_backward", "mlp", "classifier"}
    assert params["mlp"]["kernel"].shape == ((8 if pairs else 2) * cfg.hidden_size, cfg.mlp_size)


# ---------------------------------------------------------------------------------------------------
# The soft loss, by hand
# ---------------------------------------------------------------------------------------------------


def test_the_soft_loss_is_the_squared_distance_of_the_logits():
    rng = np.random.default_rng(0)
    logits, teacher = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 6).astype(np.int32)
    weights = np.array([1, 1, 1, 1, 1, 0], np.float32)  # the last row: padding
    real = weights > 0
    mse = np.mean(np.sum((logits - teacher) ** 2, axis=-1)[real])  # Tang et al. eq. 2, the mean over rows
    nll = np.log(np.sum(np.exp(logits), -1)) - logits[np.arange(6), labels]
    loss = lambda **k: distillation.task_distillation_loss(  # noqa: E731
        logits, labels, weights, teacher, gold_loss=heads.classification_loss, kind="classification",
        temperature=2.0, soft_loss="mse", **k)
    value, sums = loss(alpha=1.0)
    assert float(value) == pytest.approx(mse, rel=1e-6)
    assert float(sums["soft_loss_sum"]) == pytest.approx(5 * mse, rel=1e-6)
    value, _ = loss(alpha=0.3)
    assert float(value) == pytest.approx(0.7 * np.mean(nll[real]) + 0.3 * mse, rel=1e-6)
    # Augmented rows (gold_weight 0) have no gold label: the gold loss is the originals', the soft loss every row's.
    gold = np.array([1, 0, 1, 0, 1, 1], np.float32)
    value, sums = loss(alpha=0.3, gold_weights=gold)
    assert float(value) == pytest.approx(0.7 * np.mean(nll[real & (gold > 0)]) + 0.3 * mse, rel=1e-6)
    assert set(sums) == {"count", "soft_loss_sum"} and float(sums["count"]) == 5
    # Regression: one logit, the squared difference of the values (as task distillation had it).
    value, _ = distillation.task_distillation_loss(
        logits[:, :1], logits[:, 1], weights, teacher[:, :1], gold_loss=heads.regression_loss, kind="regression",
        temperature=2.0, alpha=1.0)
    assert float(value) == pytest.approx(np.mean(((logits[:, 0] - teacher[:, 0]) ** 2)[real]), rel=1e-6)


# ---------------------------------------------------------------------------------------------------
# A short distillation run from conftest's fine-tuned teacher
# ---------------------------------------------------------------------------------------------------

WIDTHS = dict(bilstm_embedding_size=16, bilstm_hidden_size=12, bilstm_mlp_size=16)


def bilstm_config(pretrained, teacher: str, files: dict, **distill):
    config = finetune_config("classification", pretrained, labels=("no", "yes"), **files)
    config.train.init_from = None
    config.logging.log_every = 1
    config.checkpoint.async_save = False
    config.distill.update(teacher=teacher, student="bilstm", alpha=1.0, bilstm_learning_rate=1e-2,
                          **{**WIDTHS, **distill})
    return config


@pytest.fixture(scope="module")
def student_run(pretrained, finetuned, tmp_path_factory):
    """conftest's fine-tuned keyword classifier (2 layers, hidden 64) teaching a BiLSTM on 96 of its training
    examples and one augmented copy of each, 5 epochs of batches of 16; the student exported as params."""
    root = tmp_path_factory.mktemp("bilstm")
    files = {}
    for split, lines in (("train", slice(0, 96)), ("validation", slice(0, 32))):
        files[split] = str(root / f"{split}.jsonl")
        pathlib.Path(files[split]).write_text(
            "\n".join(pathlib.Path(pretrained["files"][split]).read_text().splitlines()[lines]) + "\n")
    config = bilstm_config(pretrained, finetuned["workdir"], files, augment_copies=1)
    config.train.epochs = 5.0
    workdir = root / "run"
    summary = finetuning.finetune(config, str(workdir))
    exported = exporting.export(str(workdir), str(root / "export"), "params")
    return dict(workdir=workdir, summary=summary, exported=exported, files=files, teacher=finetuned["workdir"],
                config=config)


def test_the_student_learns_the_teachers_logits(student_run):
    lines = [json.loads(x) for x in (student_run["workdir"] / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "split" not in x]
    losses = [x["loss"] for x in train]
    # 96 examples and their copies (the few equal to their example dropped): about 12 steps of 16 an epoch.
    assert 50 <= len(train) == student_run["summary"]["steps"] <= 60
    assert np.mean(losses[-6:]) < 0.5 * np.mean(losses[:6]), losses
    assert all(x["soft_loss"] == pytest.approx(x["loss"]) for x in train)  # alpha=1: the soft loss alone
    assert "accuracy" not in train[0]  # the copies have no gold label to be accurate on
    params, meta = checkpoint.restore_params(str(student_run["workdir"] / checkpoint.BEST_DIR))
    student = bilstm.from_record(meta.distill)
    assert student == bilstm.BiLSTMConfig(vocab_size=meta.model["vocab_size"], num_labels=2, pairs=False, **{
        k.removeprefix("bilstm_"): v for k, v in WIDTHS.items()})
    assert set(params) == {"embedding", "lstm_forward", "lstm_backward", "mlp", "classifier"}
    assert meta.distill["teacher"] == student_run["teacher"] and meta.task.kind == "classification"


def test_the_exported_student_loads_and_predicts_the_runs_logits(student_run):
    import bertjax
    from bertjax.tasks.kinds import classification

    workdir = student_run["workdir"]
    texts = [json.loads(x)["text"] for x in pathlib.Path(student_run["files"]["validation"]).read_text().splitlines()]
    predicted = [x.split("\t")[1] for x in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    config = json.loads((pathlib.Path(student_run["exported"]) / "config.json").read_text())
    assert config["distill"]["student"] == "bilstm" and "BiLSTM student" in (
        pathlib.Path(student_run["exported"]) / "README.md").read_text()
    params, meta = checkpoint.restore_params(str(workdir / checkpoint.BEST_DIR))
    net = bilstm.BiLSTMClassifier(bilstm.from_record(meta.distill))
    for path in (student_run["exported"], str(workdir)):
        model = bertjax.load(path)
        assert isinstance(model, bertjax.inference.LoadedBiLSTM) and "a BiLSTM student" in repr(model)
        assert [p["label"] for p in model.predict(texts)] == predicted
        features = classification.encode_texts(model, texts)
        expected = net.apply({"params": params}, *(features[k] for k in ("input_ids", "segment_ids", "input_mask")))
        np.testing.assert_allclose(model.task_logits(features), np.asarray(expected), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="encode: .* is a BiLSTM student .* it has predict and task_logits"):
        model.encode(["a text"])
    with pytest.raises(ValueError, match="is a BiLSTM student .* load it without quantize"):
        bertjax.load(student_run["exported"], quantize="int8")
    with pytest.raises(ValueError, match="--format=hf: .* is a BiLSTM student .* export it with --format=params"):
        exporting.export(str(workdir), str(workdir.parent / "hf"), "hf")


def test_the_compression_report_reads_the_student(student_run):
    import bertjax

    out = report.compression_report(report.Model("teacher", student_run["teacher"]),
                                     [report.Model("bilstm", student_run["exported"])],
                                     dev_path=student_run["files"]["validation"], batch_sizes=(1,), repeats=3,
                                     warmup=1)
    teacher, student = out["rows"]
    s = bilstm.from_record(json.loads((pathlib.Path(student_run["exported"]) / "config.json").read_text())["distill"])
    e, h, m = s.embedding_size, s.hidden_size, s.mlp_size
    by_hand = (s.vocab_size * e + 2 * 4 * (e * h + h * h + h) + (2 * h * m + m) + (m * 2 + 2))
    assert student.parameters == by_hand == bertjax.load(student_run["exported"]).num_params()
    assert student.size_bytes == 4 * by_hand and student.parameters < teacher.parameters
    assert student.latency_ms[1] > 0 and 0 <= student.score <= 1
    assert out["table"][3].startswith("| bilstm | " + f"{by_hand:,}")


def test_a_bert_student_learns_from_augmented_data_too(student_run, pretrained, tmp_path):
    """Augmentation is the distillation run's, whatever the student: a BERT student (train.init_from) on the copies
    too, data.packing off, the gold loss its originals' alone (so no training accuracy is logged)."""
    config = finetune_config("classification", pretrained, labels=("no", "yes"), **student_run["files"])
    config.distill.update(teacher=student_run["teacher"], augment_copies=1)
    config.logging.log_every = 1
    summary = finetuning.finetune(config, str(tmp_path / "bert"))
    lines = [json.loads(x) for x in (tmp_path / "bert" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "split" not in x]
    assert len(train) == summary["steps"] >= 11 and "accuracy" not in train[0]
    assert all(np.isfinite(x["soft_loss"]) and x["loss"] > 0 for x in train)
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["data"]["packing"] is False


def test_a_student_is_no_teacher(student_run, pretrained, finetuned, tmp_path):
    """A BiLSTM workdir named as a BERT student's teacher, or resumed as a student of another shape: one line each."""
    config = finetune_config("classification", pretrained, labels=("no", "yes"), **student_run["files"])
    config.distill.teacher = str(student_run["workdir"])
    with pytest.raises(ValueError, match="is a BiLSTM student .*, not a fine-tuned encoder"):
        finetuning.finetune(config, str(tmp_path / "bert"))
    from conftest import copy_of

    workdir = copy_of(student_run["workdir"], tmp_path / "resumed")
    other = bilstm_config(pretrained, finetuned["workdir"], student_run["files"], bilstm_mlp_size=8)
    with pytest.raises(ValueError, match="checkpoint at step .* is a BiLSTM .* MLP 16.*, this run trains a BiLSTM .* "
                                         "MLP 8.*: use a new workdir"):
        finetuning.finetune(other, str(workdir))


# ---------------------------------------------------------------------------------------------------
# One line for what a BiLSTM student cannot do, nothing written
# ---------------------------------------------------------------------------------------------------


def refused(config, tmp_path, capsys) -> str:
    """The line the program's error path says for `config`, having written nothing."""
    workdir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        console.finish(finetuning.finetune_or_sweep, config, str(workdir))
    assert stop.value.code == 2 and not workdir.exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_bilstm_students_dry_run_is_the_runs_check(student_run, capsys):
    from bertjax import finetune

    config_checks.dry_run(finetune.check, student_run["config"])
    assert capsys.readouterr().out.strip().endswith("--dry_run: the config is valid; nothing was built or written")


@pytest.mark.parametrize("kind", ["span", "tagging", "multiple_choice", "contrastive", "rerank"])
def test_a_bilstm_student_refuses_kinds_it_has_no_logits_for(kind, tmp_path, capsys):
    config = {"span": finetune_configs.span_config, "tagging": finetune_configs.tagging_config,
              "contrastive": finetune_configs.contrastive_config, "rerank": finetune_configs.rerank_config}.get(
        kind, finetune_configs.finetune_config)(kind)
    config.data.update(labels=("O", "B-X", "I-X") if kind == "tagging" else None,
                       num_choices=4 if kind == "multiple_choice" else None)
    config.distill.update(teacher=str(tmp_path), student="bilstm")
    line = refused(config, tmp_path, capsys)
    assert f"distill.student=bilstm: the BiLSTM student makes classification and regression logits, not those of " \
           f"task {kind} ({kind})" in line


@pytest.mark.parametrize("change, message", [
    ({"distill.student": "lstm"}, "distill.student='lstm': choose one of bert, bilstm"),
    ({"distill.teacher": None}, "distill.student=bilstm learns from a teacher's logits: set distill.teacher"),
    ({"distill.teacher": "/nowhere"}, "distill.teacher=/nowhere does not exist"),
    ({"distill.alpha_hidden": 1.0}, "has no transformer layers to compare .* alpha_pkd to 0"),
    ({"train.init_from": "/elsewhere"}, "starts from fresh weights .*: unset train.init_from"),
    ({"data.packing": True}, "distill.student=bilstm reads unpacked rows: set data.packing=False"),
    ({"sweep": True}, "config.sweep tries optimizer.learning_rate .*: set config.sweep=False"),
    ({"distill.bilstm_hidden_size": 0}, "distill.bilstm_hidden_size=0: a positive whole number"),
    ({"distill.augment_copies": 2, "distill.augment_p_mask": 0.6, "distill.augment_p_pos": 0.6},
     "distill.augment_p_mask \\+ augment_p_pos = 1.2: at most 1"),
    ({"distill.augment_copies": -1}, "distill.augment_copies=-1: a whole number of copies"),
])
def test_a_bilstm_config_says_what_to_change(change, message, tmp_path, capsys):
    import re

    config = finetune_configs.finetune_config("classification")
    config.data.labels = ("no", "yes")
    config.distill.update(teacher=str(tmp_path), student="bilstm")
    for key, value in change.items():
        *section, name = key.split(".")
        (config[section[0]] if section else config)[name] = value
    assert re.search(message, refused(config, tmp_path, capsys))


def test_the_students_form_is_its_training_datas():
    """The siamese form where the training split has pairs, which need a template that puts B in segment 1."""
    from bertjax.runs import finetuning_compression
    from bertjax.runs.task_data import TaskStart
    from bertjax.tasks.kinds.base import Split

    config = finetune_configs.finetune_config("classification")
    config.distill.update(student="bilstm", **WIDTHS)
    pairs = Split([Example(0, "a", "b", 1), Example(1, "c", None, 0)], {}, True)
    bert = types.SimpleNamespace(vocab_size=1000)
    start = lambda template: TaskStart(bert, {}, types.SimpleNamespace(template=template), None, False)  # noqa: E731
    student = finetuning_compression.bilstm_student(config, start(templates.bert_template(CLS, SEP)), 3, pairs)
    assert student == bilstm.BiLSTMConfig(1000, 3, 16, 12, 16, pairs=True)
    single = Split([Example(0, "a", None, 1)], {}, True)
    assert not finetuning_compression.bilstm_student(config, start(templates.bert_template(CLS, SEP)), 3, single).pairs
    roberta = templates.Template((CLS,), (SEP, SEP), (SEP,), 0)
    with pytest.raises(ValueError, match="reads a pair's sentences apart by their segment ids"):
        finetuning_compression.bilstm_student(config, start(roberta), 3, pairs)


def test_augmentation_refuses_kinds_of_other_shapes(tmp_path, capsys):
    config = finetune_configs.span_config("span")
    config.distill.update(teacher=str(tmp_path), augment_copies=4)
    assert "distill.augment_copies augments sentences and pairs (classification, regression tasks), not task span " \
           "(span): set distill.augment_copies=0" in refused(config, tmp_path, capsys)


# ---------------------------------------------------------------------------------------------------
# Augmentation (Tang et al. 2019, section 3.2)
# ---------------------------------------------------------------------------------------------------

VOCAB, CONTINUATIONS, MASK = 2000, 1500, 1999  # ids below CONTINUATIONS start words; MASK never in text
WORD_START = np.arange(VOCAB) < CONTINUATIONS
WORD_START[MASK] = True


def corpus(count: int, seed: int = 0, least: int = 8, pairs: bool = False) -> list:
    """`count` examples of least..20 words, each word a Zipf-drawn word-start token and, one in three, a
    continuation token: [(ids_a, ids_b or None)]."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, CONTINUATIONS - 9) ** 1.1  # word-start tokens 4 .. CONTINUATIONS - 6

    def sentence():
        starts = rng.choice(len(zipf), size=rng.integers(least, 21), p=zipf / zipf.sum()) + 4
        words = [[int(t)] + ([int(rng.integers(CONTINUATIONS, CONTINUATIONS + 100))] if rng.random() < 1 / 3 else [])
                 for t in starts]
        return np.array([t for w in words for t in w], np.int32)

    return [(sentence(), sentence() if pairs else None) for _ in range(count)]


def augmented(sentences, seed=0, **settings):
    return augmentation.augment(sentences, augmentation.Settings(**settings), word_start=WORD_START, mask_id=MASK,
                                seed=seed, keep_duplicates=True)


def words(ids):
    return [tuple(w) for w in augmentation.split_words(ids, WORD_START)]


def test_words_are_masked_and_swapped_at_their_rates():
    sentences = corpus(3000)
    copies, stats = augmented(sentences, copies=2, p_mask=0.1, p_pos=0.1, p_ng=0.0)
    assert len(copies) == stats["copies"] == stats["kept"] == 6000
    counts = {}
    for ids, _ in sentences:
        for w in words(ids):
            counts[w] = counts.get(w, 0) + 1
    ranked = np.sort(np.array(list(counts.values())))[::-1]  # counts by rank, the most frequent first
    total = masked = swapped = 0
    for i, ids, second in copies:
        assert second is None
        before, after = words(sentences[i][0]), words(ids)
        assert len(before) == len(after)  # a mask or a swap is one word for one word
        for old, new in zip(before, after):
            total += 1
            if new == (MASK,):
                masked += 1
            elif new != old:
                swapped += 1
                # A word of the old one's frequency band: its count among the counts of the ranks about its band.
                ranks = np.flatnonzero(ranked == counts[old])
                band = ranked[ranks[0] // 100 * 100: (ranks[-1] // 100 + 2) * 100]
                assert new in counts and band.min() <= counts[new] <= band.max()
    assert (total, masked, swapped) == (stats["words"], stats["masked"], stats["swapped"])
    assert abs(masked / total - 0.1) < 0.006 and abs(swapped / total - 0.1) < 0.006, (masked / total, swapped / total)


def test_copies_are_cut_to_ngrams_at_their_rate():
    sentences = corpus(3000, least=6)
    copies, stats = augmented(sentences, copies=4, p_mask=0.0, p_pos=0.0, p_ng=0.25)
    lengths = []
    for i, ids, _ in copies:
        before, after = words(sentences[i][0]), words(ids)
        if len(after) < len(before):  # cut: a run of the example's words
            assert any(before[s:s + len(after)] == after for s in range(len(before) - len(after) + 1))
            lengths.append(len(after))
        else:
            assert after == before
    assert len(lengths) == stats["ngrams"] and abs(len(lengths) / len(copies) - 0.25) < 0.02
    shares = np.bincount(lengths, minlength=6)[1:] / len(lengths)  # n uniform in 1..5
    assert np.all(np.abs(shares - 0.2) < 0.04), shares


def test_a_pairs_copies_cycle_through_its_sentences():
    sentences = corpus(300, pairs=True)
    copies, _ = augmented(sentences, copies=6, p_mask=0.2, p_pos=0.2, p_ng=0.25)
    changed = np.zeros((6, 2), int)
    for c, (i, a, b) in enumerate(copies):
        changed[c % 6] += [not np.array_equal(a, sentences[i][0]), not np.array_equal(b, sentences[i][1])]
    # Copies 0 and 3 augment the first sentence only, 1 and 4 the second only, 2 and 5 both.
    assert changed[[0, 3], 1].sum() == 0 and changed[[1, 4], 0].sum() == 0
    assert np.all(changed[[0, 3], 0] > 250) and np.all(changed[[1, 4], 1] > 250) and np.all(changed[[2, 5]] > 250)


def test_augmentation_is_drawn_from_the_seed_and_adds_nothing_at_probability_zero():
    sentences = corpus(200)
    first, _ = augmented(sentences, seed=3, copies=3)
    again, _ = augmented(sentences, seed=3, copies=3)
    other, _ = augmented(sentences, seed=4, copies=3)
    same = lambda x, y: all(i == j and np.array_equal(a, b) for (i, a, _), (j, b, _) in zip(x, y))  # noqa: E731
    assert same(first, again) and not same(first, other)
    # The features of a split: each kept copy after the examples, with its example's label and idx and gold weight 0.
    tokenizer = types.SimpleNamespace(
        encode_arrays=lambda texts: [np.array([int(t) for t in text.split()], np.int32) for text in texts],
        word_start=WORD_START, mask_id=MASK, template=templates.bert_template(CLS, SEP), pad_id=PAD)
    examples = [Example(i, " ".join(map(str, a)), None, i % 2) for i, (a, _) in enumerate(sentences[:50])]
    features = {"input_ids": np.zeros((50, 24), np.int32), "segment_ids": np.zeros((50, 24), np.int32),
                "input_mask": np.zeros((50, 24), np.int32), "label": np.arange(50, dtype=np.int32) % 2,
                "idx": np.arange(50, dtype=np.int32), "example_weight": np.ones(50, np.float32)}
    out, stats = augmentation.augmented_features(features, examples, tokenizer, 24,
                                                 augmentation.Settings(copies=2), seed=0)
    kept = stats["kept"]
    assert 80 <= kept <= 100 and len(out["input_ids"]) == 50 + kept
    np.testing.assert_array_equal(out["gold_weight"], np.r_[np.ones(50), np.zeros(kept)])
    np.testing.assert_array_equal(out["label"][50:], out["idx"][50:] % 2)
    assert np.all(out["input_ids"][50:, 0] == CLS) and np.all(out["example_weight"] == 1)
    # Every probability 0: every copy is its example, each dropped; the features as they were.
    nothing, stats = augmentation.augmented_features(features, examples, tokenizer, 24, augmentation.Settings(
        copies=5, p_mask=0.0, p_pos=0.0, p_ng=0.0), seed=0)
    assert nothing is features and "gold_weight" not in nothing
    assert stats["copies"] == 250 and stats["kept"] == stats["masked"] == stats["swapped"] == stats["ngrams"] == 0
