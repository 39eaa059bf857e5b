"""Embedding distillation (contrastive.loss=distill_mse): the loss against sentence-transformers' MSELoss,
the teacher's targets against bertjax.load(teacher).embed, the fine-tuning program teaching a student
(a small BERT, 64 wide, a Dense to 32) the embeddings of a sentence-transformers teacher that a keyword
moves far (each text's, not their mean), and each bad input's one line."""

import json
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses as st_losses
from sentence_transformers.base.modules import Normalize
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

import bertjax
from bertjax.data import demo
from bertjax.models import contrastive_losses
from bertjax.runs import finetuning, task_data
from bertjax.tasks import demo_tasks
from configs.finetune import common as finetune_configs


def test_the_loss_is_sentence_transformers_mse():
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(6, 8)).astype(np.float32), rng.normal(size=(6, 8)).astype(np.float32)
    ours, sums = contrastive_losses.embedding_loss({"query": jnp.asarray(student)}, {"target": jnp.asarray(teacher)},
                                                   loss="distill_mse", scale=20.0)
    model = SentenceTransformer(modules=[Pooling(8, "mean")], device="cpu")
    reference = st_losses.MSELoss(model).compute_loss_from_embeddings([torch.tensor(student)], [torch.tensor(teacher)])
    np.testing.assert_allclose(float(ours), float(reference), rtol=1e-6)
    assert float(reference) == pytest.approx(float(torch.nn.MSELoss()(torch.tensor(student), torch.tensor(teacher))))
    assert float(sums["count"]) == 6


@pytest.fixture(scope="module")
def teacher(pretrained, tmp_path_factory):
    """A sentence-transformers directory: a random transformers BERT 32 wide on the pretrained model's
    vocabulary, mean pooling."""
    import transformers  # here: the one fixture that builds a transformers model

    root = tmp_path_factory.mktemp("teacher")
    vocab = str(pathlib.Path(pretrained["workdir"]) / "vocab.txt")
    size = len(pathlib.Path(vocab).read_text(encoding="utf-8").splitlines())
    config = transformers.BertConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(root / "hf")
    transformers.BertTokenizer(vocab).save_pretrained(root / "hf")
    model = SentenceTransformer(modules=[Transformer(str(root / "hf")), Pooling(32, "mean")], device="cpu")
    model.save(str(root / "st"))
    return str(root / "st")


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def demo_texts(root: pathlib.Path) -> dict:
    """120 sentences of the demo corpus: 80 train, 40 dev; every third row's teacher text the sentence
    backwards (a 'translation': target_text)."""
    sentences = [s for doc in demo.demo_documents(300) for s in doc if 6 <= len(s.split()) <= 20][:120]
    rows = [{"text": s} if n % 3 else {"text": s, "target_text": " ".join(reversed(s.split()))}
            for n, s in enumerate(sentences)]
    return {"train": write_jsonl(root / "texts.jsonl", rows[:80]),
            "validation": write_jsonl(root / "dev.jsonl", rows[80:])}


def distill_config(pretrained, teacher: str, files: dict, **changes):
    """configs/finetune/contrastive.py with distill_mse from `pretrained`: 80 texts in batches of 16 for 4
    epochs, 20 steps, the dev set scored every 5."""
    config = finetune_configs.contrastive_config()
    config.train.init_from = pretrained["workdir"]
    config.data.update(max_seq_length=32, **files)
    config.train.update(batch_size=16, epochs=4.0)
    config.optimizer.learning_rate = 2e-3
    config.logging.update(log_every=1, eval_every=5, eval_batch_size=40)
    config.contrastive.update(loss="distill_mse", teacher=teacher, dense_features=32, dense_activation="identity",
                              normalize=False)
    for key, value in changes.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def test_the_targets_are_the_teachers_embed(pretrained, teacher, tmp_path):
    files = demo_texts(tmp_path)
    config = distill_config(pretrained, teacher, files)
    task = task_data.task_from_config(config)
    train, dev, _ = task_data.split_features(task, bertjax.load(pretrained["workdir"]).tokenizer, config)
    rows = [json.loads(line) for line in pathlib.Path(files["train"]).read_text().splitlines()]
    targets = [r.get("target_text", r["text"]) for r in rows]
    expected = bertjax.load(teacher).embed(targets)
    assert train.features["target"].dtype == np.float32 and train.features["target"].shape == (80, 32)
    np.testing.assert_array_equal(train.features["target"], expected)
    assert not np.array_equal(expected[0], bertjax.load(teacher).embed([rows[0]["text"]])[0])  # target_text counted
    assert dev["validation"].features["target"].shape == (40, 32) and set(train.features) == {
        "query_ids", "query_mask", "idx", "example_weight", "target"}


@pytest.fixture(scope="module")
def keyword_teacher(pretrained, tmp_path_factory):
    """A sentence-transformers teacher whose embedding one keyword moves: a transformers BERT 32 wide on
    the pretrained vocabulary, every weight zero but the word embedding of the keyword's tokens ("return",
    "returned", ...) and the LayerNorms; its last LayerNorm has scale 60 and bias c = 0.5 everywhere. Each
    token's state is then its own (no attention reaches it): c for every other token, c plus 60 times a
    zero-mean unit vector (orthogonal to c) for the keyword. Mean pooling and Normalize: a text without
    the keyword embeds as c / |c|, one with it near the keyword's direction."""
    import transformers  # here: the fixture builds a transformers model

    root = tmp_path_factory.mktemp("keyword-teacher")
    vocab_path = pathlib.Path(pretrained["workdir"]) / "vocab.txt"
    vocab = vocab_path.read_text(encoding="utf-8").splitlines()
    keyword = [i for i, token in enumerate(vocab) if token.startswith(demo_tasks.KEYWORD)]
    assert keyword, "the keyword is a token of the vocabulary"
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.embeddings.word_embeddings.weight[keyword] = torch.randn(32)
        layer = model.encoder.layer[0]
        model.embeddings.LayerNorm.weight.fill_(1.0)
        layer.attention.output.LayerNorm.weight.fill_(1.0)
        layer.output.LayerNorm.weight.fill_(60.0)
        layer.output.LayerNorm.bias.fill_(0.5)
    model.save_pretrained(root / "hf")
    transformers.BertTokenizer(str(vocab_path)).save_pretrained(root / "hf")
    SentenceTransformer(modules=[Transformer(str(root / "hf")), Pooling(32, "mean"), Normalize()],
                        device="cpu").save(str(root / "st"))
    return str(root / "st")


def keyword_texts(pretrained, root: pathlib.Path) -> dict:
    """The keyword task's sentences (about half with the keyword): 80 train, 40 dev, as {text} rows."""
    rows = [json.loads(line) for line in pathlib.Path(pretrained["files"]["train"]).read_text().splitlines()]
    texts = [{"text": r["text"]} for r in rows[:120]]
    return {"train": write_jsonl(root / "texts.jsonl", texts[:80]),
            "validation": write_jsonl(root / "dev.jsonl", texts[80:])}


def unit_cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.slow
def test_the_program_teaches_the_student_the_teachers_embeddings(pretrained, finetuned, keyword_teacher, tmp_path):
    """The keyword teacher's embeddings vary strongly across texts (with the keyword or not). The student,
    conftest's keyword classifier (its [CLS] state tells the keyword apart; cls pooling, a fresh Dense to
    the teacher's width), learns them in 20 steps: each dev text's cosine to its teacher's embedding well
    above that of the best constant prediction (the teacher's mean embedding), with the keyword or not."""
    files = keyword_texts(pretrained, tmp_path)
    config = distill_config(pretrained, keyword_teacher, files, **{"train.init_from": finetuned["workdir"],
                                                                   "contrastive.pooling": ("cls",)})
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    dev = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
           if '"split"' in line]
    assert [r["step"] for r in dev] == [5, 10, 15, 20]
    assert all({"mse", "neg_mse", "teacher_cosine"} <= set(r) for r in dev)
    assert summary["main_metric"] == "neg_mse" and summary["best"]["value"] == max(r["neg_mse"] for r in dev)
    texts = [json.loads(line)["text"] for line in pathlib.Path(files["validation"]).read_text().splitlines()]
    wanted = bertjax.load(keyword_teacher).embed(texts)
    with_keyword = np.array([demo_tasks.KEYWORD in t.lower() for t in texts])
    assert 10 <= with_keyword.sum() <= 30  # both kinds of text in the dev set
    assert unit_cosines(wanted[with_keyword], wanted[~with_keyword][:1]).max() < 0.7  # the keyword moves it far
    constant = float(np.mean(unit_cosines(wanted.mean(0, keepdims=True), wanted)))  # the best constant's
    student = bertjax.load(str(tmp_path / "run" / "best"))
    assert student.embedding.dense["features"] == 32 and not student.embedding.normalize
    found = student.embed(texts)
    np.testing.assert_allclose(float(np.mean(np.square(found - wanted))), -summary["best"]["value"], rtol=1e-3)
    learned = unit_cosines(found, wanted)
    print(f"per-text cosine to the teacher: student {learned.mean():.3f}, the teacher's mean {constant:.3f}")
    assert learned.mean() > constant + 0.1  # it learned each text's embedding, not their mean
    assert learned[with_keyword].mean() > 0.9 and learned[~with_keyword].mean() > 0.9
    cosines = (tmp_path / "run" / "predictions" / "validation_teacher_cosines.tsv").read_text().splitlines()
    assert cosines[0] == "index\tteacher_cosine" and len(cosines) == 41


def test_bad_inputs_are_one_line(pretrained, teacher, tmp_path):
    good = demo_texts(tmp_path)
    cases = [
        ({"data.train": write_jsonl(tmp_path / "bad.jsonl", [{"text": "a b"}, {"query": "c d"}])},
         "bad.jsonl:2: missing field 'text'"),
        ({"contrastive.teacher": str(tmp_path / "nowhere")},
         f"contrastive.teacher={tmp_path / 'nowhere'} does not load"),
        ({"contrastive.dense_features": None}, "embeds in 32 features, the student in 64: set "
                                               "contrastive.dense_features=32"),
        ({"contrastive.teacher": ""}, "contrastive.loss=distill_mse needs contrastive.teacher=PATH"),
    ]
    for changes, fragment in cases:
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            finetuning.finetune(distill_config(pretrained, teacher, good, **changes), str(tmp_path / "bad"))
        assert "\n" not in str(error.value) and not (tmp_path / "bad").exists()
