"""SPLADE (contrastive.representation=splade): its losses, FLOPS and regularizer warmup against
sentence-transformers' SpladeLoss, FlopsLoss and SpladeRegularizerWeightSchedulerCallback; packed GradCache
against the whole batch unpacked; its vectors against the SparseEncoder it exports (plain and
inference-free); the fine-tuning program end to end, and bad input as one line."""

import dataclasses
import functools
import json
import pathlib
import re
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder import losses as st_losses
from sentence_transformers.sparse_encoder.callbacks.splade_callbacks import SpladeRegularizerWeightSchedulerCallback
from conftest import untrained_contrastive_workdir  # tests/ is on sys.path under pytest
from test_contrastive import (TINY, assert_trees_close, contrastive_run_config, demo_pairs, metric_lines,
                              pair_features)
from transformers.trainer_callback import TrainerState

import bertjax
from bertjax.models import contrastive_losses, heads
from bertjax.runs import exporting, finetuning
from bertjax.tasks import contrastive_batches, contrastive_steps
from bertjax.tasks.kinds import contrastive as contrastive_kind
from bertjax.training import checkpoint
from bertjax.training.checkpoint_meta import CheckpointMeta, TokenizerRecord

# --------------------------------------------------------------------------------------------------
# The losses on sparse vectors against sentence-transformers' own
# --------------------------------------------------------------------------------------------------


class Columns(torch.nn.Module):
    """A stand-in model: each column's "features" are its embeddings, so SpladeLoss runs on given vectors."""

    def forward(self, features):
        return {"sentence_embedding": features["embeddings"]}


def sparse_vectors(rng, *shape):
    """Non-negative vectors with about 70% zeros, as SPLADE's are."""
    values = rng.random(shape).astype(np.float32) * 3
    return np.where(rng.random(shape) < 0.7, 0.0, values).astype(np.float32)


@pytest.mark.parametrize("loss", ["mnrl", "symmetric", "margin_mse", "kl"])
def test_losses_and_flops_as_sentence_transformers(loss):
    """On the same [B, V] vectors (queries, positives, two hard negatives each): bertjax's loss with the FLOPS
    regularizer equals SpladeLoss around the sparse loss, and flops equals FlopsLoss, within 1e-6."""
    rng = np.random.default_rng(0)
    q, p, n = sparse_vectors(rng, 6, 50), sparse_vectors(rng, 6, 50), sparse_vectors(rng, 6, 2, 50)
    teacher = rng.normal(size=(6, 3)).astype(np.float32) * 5
    model = Columns()
    base = {"mnrl": lambda: st_losses.SparseMultipleNegativesRankingLoss(model),
            "symmetric": lambda: st_losses.SparseMultipleNegativesRankingLoss(
                model, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"),
            "margin_mse": lambda: st_losses.SparseMarginMSELoss(model),
            "kl": lambda: st_losses.SparseDistillKLDivLoss(model, temperature=2.0)}[loss]()
    reference = st_losses.SpladeLoss(model, base, document_regularizer_weight=3e-2, query_regularizer_weight=5e-2)
    columns = [{"embeddings": torch.tensor(c)} for c in (q, p, n[:, 0], n[:, 1])]
    expected = sum(float(v) for v in reference(columns, torch.tensor(teacher)).values())
    settings = contrastive_kind.Settings(loss="mnrl" if loss == "symmetric" else loss, symmetric=loss == "symmetric",
                                         representation="splade", splade_lambda_query=5e-2,
                                         splade_lambda_document=3e-2).loss_settings()
    batch = {"negative_mask": jnp.ones((6, 2)), "teacher_scores": jnp.asarray(teacher)}
    found, _ = contrastive_losses.embedding_loss({"query": jnp.asarray(q), "passage": jnp.asarray(p),
                                                  "negative": jnp.asarray(n)}, batch, **settings)
    assert float(found) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    flops = st_losses.FlopsLoss(model)
    documents = np.concatenate([p, n[:, 0], n[:, 1]])
    for vectors in (q, documents):
        assert float(contrastive_losses.flops(jnp.asarray(vectors))) == pytest.approx(
            float(flops.compute_loss_from_embeddings(torch.tensor(vectors))), rel=1e-6)
    # A row's missing negative counts for nothing: weighted 0, the FLOPS of the documents without it.
    present = np.ones(len(documents), np.float32)
    present[-1] = 0
    assert float(contrastive_losses.flops(jnp.asarray(documents), jnp.asarray(present))) == pytest.approx(
        float(flops.compute_loss_from_embeddings(torch.tensor(documents[:-1]))), rel=1e-6)


@pytest.mark.parametrize("num_steps, fraction", [(30, 1 / 3), (7, 0.25), (2, 1 / 3)])
def test_regularizer_warmup_as_the_callback(num_steps, fraction):
    """The lambdas at each step (the steps done before it) are the callback's, quadratic over its warmup."""
    reference = st_losses.SpladeLoss(Columns(), st_losses.SparseMultipleNegativesRankingLoss(Columns()),
                                     document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    callback = SpladeRegularizerWeightSchedulerCallback(reference, warmup_ratio=fraction)
    state = TrainerState(max_steps=num_steps)
    callback.on_train_begin(None, state, None)
    warmup = contrastive_losses.regularizer_warmup_steps(num_steps, fraction)
    for step in range(num_steps):
        state.global_step = step
        callback.on_step_begin(None, state, None)
        factor = float(contrastive_losses.regularizer_warmup(step, warmup))
        assert 3e-5 * factor == pytest.approx(reference.document_regularizer_weight, rel=1e-6, abs=1e-12)
        assert 5e-5 * factor == pytest.approx(reference.query_regularizer_weight, rel=1e-6, abs=1e-12)
    assert factor == 1.0 and float(contrastive_losses.regularizer_warmup(0, warmup)) == 0.0


# --------------------------------------------------------------------------------------------------
# The step: packed rows and GradCache
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query_side, loss", [("static", "kl"), ("splade", "mnrl")])
def test_packed_gradcache_gives_the_whole_batchs_loss_and_gradient(query_side, loss):
    """SPLADE (queries through the encoder, on symmetric mnrl; or the static table, on kl) with the regularizer:
    8 pairs with 2 hard negatives (some missing) packed into rows and cached in 4 microbatches of 2, against
    the same pairs unpacked all at once: the same loss and gradient, the static table's included."""
    static = query_side == "static"
    net = heads.network("contrastive", TINY, embedding=dict(representation="splade", static_queries=static,
                                                           chunk_rows=3))
    params = nn.unbox(net.init(jax.random.key(0), **heads.dummy_inputs("contrastive", 1, 8))["params"])
    if static:
        params["static_query"]["weight"] = jnp.linspace(0.5, 1.5, TINY.vocab_size)
    features = {k: v for k, v in pair_features(4, size=8).items() if k != "target"}  # pairs, not distill_mse's texts
    features["teacher_scores"] = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    settings = dict(contrastive_kind.Settings(loss=loss, symmetric=not static, representation="splade",
                                              splade_query=query_side, splade_lambda_query=0.1,
                                              splade_lambda_document=0.2).loss_settings(), regularizer_weight=0.5)
    rows = contrastive_batches.packed_rows_needed(features, 8, 0, 1, max_sequences=4, num_chunks=4)
    chosen, texts, plan = contrastive_batches.packed_step_plan(
        features, contrastive_batches.text_lengths(features), 8, 0, 0, num_rows=4 * rows, max_sequences=4,
        num_chunks=4)
    packed = contrastive_batches.packed_batch(features, chosen, texts, plan, contrastive_batches.batch_keys(features))
    unpacked = {k: features[k][chosen] for k in contrastive_steps.batch_keys(features)}  # the step's pairs
    whole = jax.jit(jax.value_and_grad(functools.partial(contrastive_steps.contrastive_loss, net=net,
                                                         settings=settings), has_aux=True))
    (loss, _), grads = whole(params, unpacked, None)
    cached = jax.jit(functools.partial(contrastive_steps.cached_loss_and_grad, net=net, settings=settings,
                                       microbatch=2))
    (packed_loss, _), packed_grads = cached(params, packed, None)
    assert float(packed_loss) == pytest.approx(float(loss), rel=1e-5)
    assert_trees_close(packed_grads, grads, rtol=1e-4, atol=1e-6)
    assert float(jnp.max(jnp.abs(grads["mlm_head"]["output_bias"]))) > 1e-3
    assert not static or float(jnp.max(jnp.abs(grads["static_query"]["weight"]))) > 1e-3


# --------------------------------------------------------------------------------------------------
# The fine-tuning program, its checkpoint, embed and the SparseEncoder export
# --------------------------------------------------------------------------------------------------


def splade_settings(**changes) -> dict:
    return {"contrastive.representation": "splade", "contrastive.include_prompt": True,
            "contrastive.matryoshka_dims": (), "contrastive.splade_chunk_rows": 4, **changes}


@pytest.fixture(scope="module")
def splade_run(pretrained, tmp_path_factory):
    """The inference-free variant fine-tuned from `pretrained` (which has its masked-LM head) through the
    program, in process: 80 pairs in batches of 16 (packed, cached in microbatches of 8) for 1 epoch, the
    dev set scored at steps 3 and 5. {"workdir", "summary", "files"}."""
    root = tmp_path_factory.mktemp("splade")
    files = demo_pairs(root)
    rows = (root / "pairs.jsonl").read_text().splitlines()[:80]
    (root / "train80.jsonl").write_text("\n".join(rows) + "\n")
    files = {"train": str(root / "train80.jsonl"), "validation": files["validation"]}
    config = contrastive_run_config(pretrained, files, **splade_settings(**{
        "contrastive.splade_query": "static", "contrastive.splade_lambda_query": 0.0,
        "contrastive.splade_lambda_document": 3e-4, "train.epochs": 1.0, "logging.eval_every": 3,
        "optimizer.learning_rate": 2e-3}))
    summary = finetuning.finetune(config, str(root / "run"))
    return {"workdir": root / "run", "summary": summary, "files": files}


def test_the_program_trains_splade_reports_active_dimensions_and_exports(splade_run, tmp_path):
    """Dev lines with the active dimensions beside mrr_at_10; the checkpoint's records say SPLADE with a static
    query side and dot products; embed gives [N, V] vectors, queries through the table; the SparseEncoder
    export (a Router) encodes queries and documents as embed does."""
    workdir = splade_run["workdir"]
    lines = metric_lines(workdir)
    losses = [r["loss"] for r in lines if "loss" in r and "split" not in r]
    dev = [r for r in lines if r.get("split") == "validation"]
    assert len(losses) == 5 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert [r["step"] for r in dev] == [3, 5]
    assert all(0 < r["query_active_dims"] < 20 and 0 < r["document_active_dims"] and "mrr_at_10" in r for r in dev)
    assert all(0 < r["document_similarity"] < 1 for r in dev)
    _, meta = checkpoint.restore_params(str(workdir / "best"))
    assert (meta.embedding.representation, meta.embedding.splade_query, meta.embedding.similarity) == (
        "splade", "static", "dot")
    model = bertjax.load(str(workdir))
    assert set(model.params) == {"bert", "mlm_head", "static_query"}
    texts = [json.loads(line)["positive"] for line in open(splade_run["files"]["validation"])][:6] + [
        "music " * 40]
    documents, queries = model.embed(texts), model.embed(texts, task="query")
    assert documents.shape == queries.shape == (7, model.config.vocab_size) and (documents >= 0).all()
    weights = np.asarray(model.params["static_query"]["weight"])
    tokens = sorted(set(model.tokenizer.encode(["query: " + texts[0]])[0]))  # its prompt's too, no [CLS], [SEP]
    np.testing.assert_allclose(queries[0][tokens], weights[tokens], rtol=1e-6)
    assert np.count_nonzero(queries[0]) == len(tokens)
    exported = SparseEncoder(exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers"),
                             device="cpu")
    assert "model = SparseEncoder(" in (tmp_path / "st" / "README.md").read_text()  # the card loads its class
    assert np.abs(dense(exported.encode_document(texts)) - model.embed(texts, task="document")).max() < 1e-5
    assert np.abs(dense(exported.encode_query(texts)) - queries).max() < 1e-5


def dense(vectors) -> np.ndarray:
    """A SparseEncoder's vectors (a sparse torch tensor) as a numpy array [N, V]."""
    return vectors.to_dense().numpy()


def test_document_similarity_is_the_mean_cosine_of_every_two_documents():
    from bertjax.tasks.kinds import contrastive

    rng = np.random.default_rng(0)
    vectors = np.maximum(rng.normal(size=(7, 50)), 0.0)
    vectors[3] = 0.0  # an empty vector is like no other
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    pairs = [unit[i] @ unit[j] for i in range(7) for j in range(7) if i != j]
    assert contrastive.mean_pairwise_cosine(vectors) == pytest.approx(np.mean(pairs), rel=1e-12)
    assert contrastive.mean_pairwise_cosine(np.ones((4, 3))) == pytest.approx(1.0)


def test_splade_vectors_and_their_export_as_sentence_transformers(pretrained, tmp_path):
    """A SPLADE model (the pretrained masked-LM head as it is): embed, documents and queries (cut at the query
    length), equals the exported SparseEncoder (a fill-mask Transformer and SpladePooling) within 1e-5."""
    settings = contrastive_kind.Settings(representation="splade", query_prompt="query: ", max_query_length=8,
                                         max_seq_length=48)
    workdir = untrained_contrastive_workdir(pretrained, tmp_path / "run", settings,
                                            {k: pretrained["params"][k] for k in ("bert", "mlm_head")})
    model = bertjax.load(workdir)
    exported = SparseEncoder(exporting.export(workdir, str(tmp_path / "st"), "sentence-transformers"),
                             device="cpu")
    texts = ["the history of the city", "a", "music " * 60, "rivers and the sea, mountains and the plains"]
    vectors = model.embed(texts)
    assert vectors.shape == (4, pretrained["cfg"].vocab_size) and 0 < np.count_nonzero(vectors[0])
    assert np.abs(dense(exported.encode(texts)) - vectors).max() < 1e-5
    queries = model.embed(texts, task="query")
    assert np.abs(dense(exported.encode_query(texts)) - queries).max() < 1e-5
    assert np.abs(queries[2] - vectors[2]).max() > 1e-3  # the query cut at 8 tokens, after its prompt
    with pytest.raises(ValueError, match="pooling and normalize are a dense embedder's"):
        model.embed(texts, pooling="mean")


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def test_bad_splade_input_is_one_line(pretrained, tmp_path):
    """Each mistake is one line naming what to change, and nothing is written."""
    files = demo_pairs(tmp_path)
    dense_start = tmp_path / "embedder"
    saver = checkpoint.Checkpointer(str(dense_start), every_steps=1, keep=1, async_save=False)
    meta = CheckpointMeta(step=1, model=dataclasses.asdict(pretrained["cfg"]),
                          tokenizer=TokenizerRecord("wordpiece", "vocab.txt", True))
    shutil.copyfile(pathlib.Path(pretrained["workdir"]) / "vocab.txt", dense_start / "vocab.txt")
    saver.save(1, {"bert": pretrained["params"]["bert"]}, {"count": np.zeros((), np.int32)}, meta, force=True)
    saver.wait()
    saver.close()
    cases = [({"train.init_from": str(dense_start)}, "train.init_from has no masked-LM head"),
             ({"contrastive.representation": "sparse"},
              "contrastive.representation='sparse': choose one of dense, splade"),
             ({"contrastive.loss": "cosent"}, "contrastive.loss=cosent with contrastive.representation=splade"),
             ({"contrastive.include_prompt": False}, "contrastive.include_prompt=False is for dense embeddings"),
             ({"contrastive.splade_query": "idf"}, "contrastive.splade_query='idf': choose one of splade, static"),
             ({"contrastive.loss": "kl"}, "missing field 'scores'")]
    for changes, fragment in cases:
        config = contrastive_run_config(pretrained, files, **{**splade_settings(), **changes})
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            finetuning.finetune(config, str(tmp_path / "bad"))
        assert "\n" not in str(error.value) and not (tmp_path / "bad").exists(), fragment
    dense = contrastive_run_config(pretrained, files, **{"contrastive.splade_query": "static"})
    with pytest.raises(ValueError, match="contrastive.splade_query=static is for contrastive.representation=splade"):
        finetuning.finetune(dense, str(tmp_path / "bad"))
