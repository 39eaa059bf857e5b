"""Embedding distillation (contrastive.loss=distill_mse): the loss against sentence-transformers' MSELoss,
the teacher's targets against bertjax.load(teacher).embed, the fine-tuning program teaching a student
(bertjax's small pretrained BERT, 64 wide, a Dense to 32) a sentence-transformers teacher's embeddings
(a random BERT 32 wide, mean pooling), and each bad input's one line."""

import json
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import train_losses
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses as st_losses
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

import bertjax
from bertjax.data import demo
from bertjax.models import contrastive_losses
from bertjax.runs import finetuning, task_data
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


@pytest.mark.slow
def test_the_program_teaches_the_student_the_teachers_embeddings(pretrained, teacher, tmp_path):
    files = demo_texts(tmp_path)
    summary = finetuning.finetune(distill_config(pretrained, teacher, files), str(tmp_path / "run"))
    dev = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
           if '"split"' in line]
    assert [r["step"] for r in dev] == [5, 10, 15, 20]
    assert all({"mse", "neg_mse", "teacher_cosine"} <= set(r) for r in dev)
    assert summary["main_metric"] == "neg_mse" and summary["best"]["value"] == max(r["neg_mse"] for r in dev)
    assert dev[-1]["mse"] < 0.5 * dev[0]["mse"] and dev[-1]["teacher_cosine"] > dev[0]["teacher_cosine"]
    texts = [json.loads(line)["text"] for line in pathlib.Path(files["validation"]).read_text().splitlines()]
    targets = [json.loads(line).get("target_text", t)
               for line, t in zip(pathlib.Path(files["validation"]).read_text().splitlines(), texts)]
    wanted = bertjax.load(teacher).embed(targets)
    student = bertjax.load(str(tmp_path / "run" / "best"))
    assert student.embedding.dense["features"] == 32 and not student.embedding.normalize
    found = float(np.mean(np.square(student.embed(texts) - wanted)))
    np.testing.assert_allclose(found, -summary["best"]["value"], rtol=1e-3)  # best/ embeds as the dev scores
    before = train_losses(tmp_path / "run")[1]  # step 1's loss: the untrained student (0.40 here), dropout on
    assert found < 0.5 * dev[0]["mse"] and found < 0.1 * before  # 0.021 here (0.014: the teachers' mean's)
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
