"""ColBERT (late interaction): MaxSim, its losses, multi-vector search and the sentence-transformers export,
each against an independent reference: sentence-transformers 6.3's multi_vector_encoder (torch), or a brute
force numpy MaxSim; and ColBERT through the contrastive program (contrastive.representation=colbert): its
step's loss against sentence-transformers', packed GradCache against the whole batch, the run's dev ranks,
embed_tokens against the MultiVectorEncoder it exports, and bad input as one line."""

import dataclasses
import functools
import json
import re
import shutil
import string

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers import MultiVectorEncoder
from sentence_transformers.multi_vector_encoder import losses as st_losses
from sentence_transformers.util.similarity import maxsim as st_maxsim
from sentence_transformers.util.similarity import maxsim_pairwise as st_maxsim_pairwise
from test_contrastive import (TINY, assert_trees_close, contrastive_run_config, demo_pairs, metric_lines,
                              pair_features)

import bertjax
from bertjax.interop import multivector_export
from bertjax.models import heads, multivector, multivector_losses
from bertjax.runs import exporting, finetuning
from bertjax.tasks import contrastive_batches, contrastive_steps, multivector_search
from bertjax.tasks.kinds import contrastive as contrastive_kind
from bertjax.tasks.multivector_texts import MultiVectorTexts, featurize
from bertjax.text.tokenizers import WordPieceTokenizer
from bertjax.training import checkpoint


def token_vectors(rng, count: int, tokens: int, width: int = 8, empty_rows=()):
    """Unit token vectors [count, tokens, width] and masks with 1 to `tokens` real tokens each (none for the
    rows in empty_rows)."""
    vectors = rng.normal(size=(count, tokens, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)
    lengths = rng.integers(1, tokens + 1, size=count)
    lengths[list(empty_rows)] = 0
    return vectors, np.arange(tokens)[None, :] < lengths[:, None]


def brute_maxsim(q, q_mask, d, d_mask) -> np.ndarray:
    """MaxSim of every query with every document, a pair at a time in float64."""
    out = np.empty((len(q), len(d)))
    for i in range(len(q)):
        for j in range(len(d)):
            sims = q[i][q_mask[i]].astype(np.float64) @ d[j][d_mask[j]].astype(np.float64).T
            out[i, j] = sims.max(axis=1).sum() if d_mask[j].any() else multivector.EMPTY_SCORE
    return out


def test_maxsim_equals_sentence_transformers():
    rng = np.random.default_rng(0)
    q, q_mask = token_vectors(rng, 5, 6)
    d, d_mask = token_vectors(rng, 7, 9, empty_rows=(3,))  # a document with no scored token
    scores = jax.jit(multivector.maxsim, static_argnames="chunk_size")
    ours = [np.asarray(scores(q, q_mask, d, d_mask, chunk_size=c)) for c in (None, 3, 7)]
    theirs = st_maxsim(torch.tensor(q), torch.tensor(d), a_mask=torch.tensor(q_mask), b_mask=torch.tensor(d_mask))
    for scores in ours:  # chunked by 3 (not dividing 7), whole, and the default
        np.testing.assert_allclose(scores, theirs.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours[0], brute_maxsim(q, q_mask, d, d_mask), rtol=0, atol=1e-5)
    candidates, c_mask = d[:5, None].repeat(2, 1), d_mask[:5, None].repeat(2, 1)  # [5, 2, Sd, D]
    pairs = st_maxsim_pairwise(torch.tensor(q), torch.tensor(d[:5]), a_mask=torch.tensor(q_mask),
                               b_mask=torch.tensor(d_mask[:5]))
    per_query = np.asarray(jax.jit(multivector.maxsim_candidates)(q, q_mask, candidates, c_mask))
    np.testing.assert_allclose(per_query, np.stack([pairs.numpy()] * 2, axis=1), rtol=0, atol=1e-5)


class StandIn(torch.nn.Module):
    """What sentence-transformers' multi-vector losses read of a model, given the token vectors and masks
    as features: its loss is then computed on exactly our vectors."""

    similarity = staticmethod(st_maxsim)
    similarity_pairwise = staticmethod(st_maxsim_pairwise)

    def forward(self, features, task=None):
        return {"token_embeddings": features["vectors"], "attention_mask": features["attention_mask"]}


def columns(*pairs):
    return [{"input_ids": torch.tensor(m.astype(np.int64)), "attention_mask": torch.tensor(m),
             "vectors": torch.tensor(v)} for v, m in pairs]


def test_losses_equal_sentence_transformers():
    rng = np.random.default_rng(1)
    q, q_mask = token_vectors(rng, 4, 6)
    docs = [token_vectors(rng, 4, 9) for _ in range(3)]  # positive, then two hard negatives a query
    d = np.stack([v for v, _ in docs], axis=1)  # [B, 3, Sd, D]
    d_mask = np.stack([m for _, m in docs], axis=1)
    features = columns((q, q_mask), *docs)
    mnrl = jax.jit(multivector_losses.mnrl_loss, static_argnames="scale")
    for scale in (1.0, 7.5):
        ours, sums = mnrl(q, q_mask, d[:, 0], d_mask[:, 0], d[:, 1:], d_mask[:, 1:], scale=scale)
        theirs = st_losses.MultiVectorMultipleNegativesRankingLoss(StandIn(), scale=scale)(features)
        assert abs(float(ours) - theirs.item()) < 1e-6 and float(sums["count"]) == 4
    teacher = rng.normal(scale=3.0, size=(4, 3)).astype(np.float32)
    distill = jax.jit(multivector_losses.distill_kl_loss, static_argnames=("temperature", "teacher_temperature"))
    for temperatures in ({"temperature": 1.0}, {"temperature": 2.0, "teacher_temperature": 0.5}):
        ours, _ = distill(q, q_mask, d, d_mask, teacher, **temperatures)
        theirs = st_losses.MultiVectorDistillKLDivLoss(StandIn(), **temperatures)(features, torch.tensor(teacher))
        assert abs(float(ours) - theirs.item()) < 1e-6
    margins = teacher[:, :1] - teacher[:, 1:]
    for labels in (teacher, margins):  # raw scores (positive first), or the margins themselves
        ours, _ = jax.jit(multivector_losses.margin_mse_loss)(q, q_mask, d, d_mask, labels)
        theirs = st_losses.MultiVectorMarginMSELoss(StandIn())(features, torch.tensor(labels))
        assert abs(float(ours) - theirs.item()) < 1e-6
    # A missing hard negative is no candidate: the loss is that of the batch without it.
    present = np.ones((4, 2), np.float32)
    present[:, 1] = 0
    without, _ = mnrl(q, q_mask, d[:, 0], d_mask[:, 0], d[:, 1:], d_mask[:, 1:], present)
    theirs = st_losses.MultiVectorMultipleNegativesRankingLoss(StandIn())(features[:3])
    assert abs(float(without) - theirs.item()) < 1e-6
    grads = jax.jit(jax.grad(lambda x: mnrl(x, q_mask, d[:, 0], d_mask[:, 0])[0]))(q)
    assert np.isfinite(np.asarray(grads)).all() and np.abs(np.asarray(grads)).sum() > 0


def test_search_and_rerank_equal_brute_force():
    rng = np.random.default_rng(2)
    q, q_mask = token_vectors(rng, 6, 5)
    d, d_mask = token_vectors(rng, 23, 7, empty_rows=(4,))
    d[11] = d[2]  # a tie: the earlier document comes first
    d_mask[11] = d_mask[2]
    brute = brute_maxsim(q, q_mask, d, d_mask)
    exclude = np.array([-1, 2, -1, -1, 0, -1])
    for chunk in (5, 23, 64):  # 5 does not divide 23
        scores, ids = multivector_search.search(q, q_mask, d, d_mask, k=4, exclude=exclude, chunk_size=chunk,
                                                query_batch_size=4)
        for i in range(len(q)):
            allowed = brute[i].copy()
            if exclude[i] >= 0:
                allowed[exclude[i]] = -np.inf
            order = np.argsort(-allowed, kind="stable")[:4]
            np.testing.assert_array_equal(ids[i], order)
            np.testing.assert_allclose(scores[i], allowed[order], rtol=0, atol=1e-5)
    _, ids = multivector_search.search(q, q_mask, d[:2], d_mask[:2], k=3, exclude=np.zeros(6, np.int32))
    assert ids.shape == (6, 2) and (ids[:, 0] == 1).all() and (ids[:, 1] == -1).all()  # k cut to the store
    candidates = rng.permutation(23)[None, :6].repeat(6, 0)
    candidates[1, 4] = -1  # a first stage that found fewer
    scores, ids = multivector_search.rerank(q, q_mask, d, d_mask, candidates, query_batch_size=4)
    for i in range(len(q)):
        found = [c for c in candidates[i] if c >= 0]
        expected = sorted(found, key=lambda c: -brute[i, c])
        assert list(ids[i][:len(found)]) == expected and (ids[i][len(found):] == -1).all()
        np.testing.assert_allclose(scores[i][:len(found)], brute[i, expected], rtol=0, atol=1e-5)


QUERIES = ["Where is the old river museum?", "the church", "a very long question about the king, the village, the "
           "bridge and the school, which goes on past the query's length!"]
DOCUMENTS = ["The museum (north of the river) was built in the early century.", "Bridge.", "The king's village "
             "had a church, a school, a market and a library; its tower stood by the forest, near the mountain "
             "and the station."]


def colbert_model(pretrained, tmp_path, markers: str):
    """(config, params, tokenizer, vocab path) of a ColbertEncoder of width 16 on the pretrained encoder; a
    vocabulary with [unused0] and [unused1] (and a fresh encoder of that size) for token markers."""
    cfg, vocab = pretrained["cfg"], f"{pretrained['workdir']}/vocab.txt"
    module = multivector.ColbertEncoder(cfg, dim=16)
    if markers == "token":
        vocab = tmp_path / "vocab.txt"
        vocab.write_text(open(f"{pretrained['workdir']}/vocab.txt").read() + "[unused0]\n[unused1]\n")
        cfg = dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 2)
        module = multivector.ColbertEncoder(cfg, dim=16)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = jax.tree_util.tree_map(np.asarray, module.init(jax.random.key(3), ids, ids, ids + 1)["params"])
    if markers != "token":  # a pretraining checkpoint's encoder starts it
        params = heads.with_pretrained_encoder(params, pretrained["params"])
    return cfg, params, WordPieceTokenizer(str(vocab), lower_case=True), str(vocab)


@pytest.mark.parametrize("markers, attend", [("prompt", False), ("token", True)])
def test_export_encodes_as_bertjax(pretrained, tmp_path, markers, attend):
    cfg, params, tokenizer, vocab = colbert_model(pretrained, tmp_path, markers)
    texts = MultiVectorTexts(markers=markers, query_length=12, document_length=20, attend_expansion=attend)
    encode = jax.jit(multivector.ColbertEncoder(cfg, dim=16).apply)
    ours, rows = {}, {}
    for kind, batch in (("query", QUERIES), ("document", DOCUMENTS)):
        rows[kind] = featurize(tokenizer, batch, kind, texts)
        vectors, mask = encode({"params": params}, *(rows[kind][key] for key in ("input_ids", "segment_ids",
                                                                                 "input_mask", "score_mask")))
        ours[kind] = (np.asarray(vectors), np.asarray(mask))
    assert ours["query"][1].all()  # every query position scored: its [MASK] expansion too
    assert (rows["query"]["input_mask"] == 0).any() != attend  # attended or not
    real = rows["document"]["input_mask"][0] > 0
    assert not ours["document"][1][0][real].all()  # the document's punctuation skipped
    multivector_export.save(str(tmp_path / "st"), cfg, params, texts, vocab)
    model = MultiVectorEncoder(str(tmp_path / "st"), device="cpu")
    theirs = {"query": model.encode_query(QUERIES), "document": model.encode_document(DOCUMENTS)}
    for kind in ("query", "document"):
        vectors, mask = ours[kind]
        for row, expected in enumerate(theirs[kind]):
            np.testing.assert_allclose(vectors[row][mask[row]], expected.numpy(), rtol=0, atol=1e-5)
    scores = jax.jit(multivector.maxsim)(*ours["query"], *ours["document"])
    np.testing.assert_allclose(scores, model.similarity(theirs["query"], theirs["document"]).numpy(), atol=1e-5)


def test_bad_settings_say_what_to_change(pretrained):
    with pytest.raises(ValueError, match="markers='brackets': choose prompt"):
        MultiVectorTexts(markers="brackets")
    tokenizer = WordPieceTokenizer(f"{pretrained['workdir']}/vocab.txt")
    with pytest.raises(ValueError, match=r"marker '\[unused0\]' is not in the vocabulary"):
        featurize(tokenizer, ["a"], "query", MultiVectorTexts(markers="token"))
    with pytest.raises(ValueError, match="query_length=3 leaves no token"):
        featurize(tokenizer, ["a"], "query", MultiVectorTexts(markers="token", query_marker="[MASK]", query_length=3))
    ids = jnp.zeros((1, 4), jnp.int32)
    shapes = lambda dim: jax.eval_shape(multivector.ColbertEncoder(pretrained["cfg"], dim=dim).init,  # noqa: E731
                                        jax.random.key(0), ids, ids, ids)["params"]
    trained = {"bert": pretrained["params"]["bert"], "projection": {"kernel": np.ones((64, 16), np.float32)}}
    with pytest.raises(ValueError, match="projection maps 64 -> 16, this model's 64 -> 8: set the projection width "
                                         "to 16"):
        multivector.with_trained_projection(shapes(8), trained)
    kept = nn.meta.unbox(multivector.with_trained_projection(shapes(16), {"params": trained}))
    np.testing.assert_array_equal(kept["projection"]["kernel"], trained["projection"]["kernel"])
    fresh = shapes(8)
    assert multivector.with_trained_projection(fresh, pretrained["params"]) is fresh  # none in the checkpoint
    assert set(string.punctuation) == set(MultiVectorTexts().skiplist)
    with pytest.raises(ValueError, match="loss 'kl': choose one of mnrl, distill_kl, margin_mse"):
        multivector_losses.check_settings("kl", 1.0, 1.0)


# --------------------------------------------------------------------------------------------------
# ColBERT through the contrastive program (contrastive.representation=colbert)
# --------------------------------------------------------------------------------------------------


def colbert_features(seed: int) -> dict:
    """pair_features' 8 pairs (queries of 3..8 tokens, passages and 2 hard negatives each of 3..12) as ColBERT's:
    every query position scored (its padding standing for the [MASK] expansion, scored but not attended), the
    documents' tokens whose id is a multiple of 5 skipped (a skiplist); every negative there."""
    features = {k: v for k, v in pair_features(seed, size=8).items() if k != "target"}
    features["negative_present"] = np.ones_like(features["negative_present"])
    features["query_score_mask"] = np.ones_like(features["query_mask"])
    for role in ("passage", "negative"):
        features[f"{role}_score_mask"] = features[f"{role}_mask"] * (features[f"{role}_ids"] % 5 != 0)
    features["teacher_scores"] = np.random.default_rng(seed).normal(scale=3.0, size=(8, 3)).astype(np.float32)
    return features


def test_the_step_is_sentence_transformers_loss_packed_and_cached():
    """The contrastive step of a ColbertEncoder: its loss on a batch equals sentence-transformers' multi-vector
    MNRL (and DistillKLDiv at temperature 2, MarginMSE) on the token vectors the encoder gives each text; the
    documents packed into rows and the batch cached in 4 microbatches of 2 give MNRL's loss and gradient."""
    settings = {loss: contrastive_kind.Settings(loss=loss, representation="colbert", colbert_dim=8, kl_temperature=2.0)
                for loss in ("mnrl", "kl", "margin_mse")}
    net = heads.network("contrastive", TINY, embedding=settings["mnrl"].network())
    params = nn.unbox(net.init(jax.random.key(0), **heads.dummy_inputs("contrastive", 1, 8))["params"])
    features = colbert_features(4)
    rows = contrastive_batches.packed_rows_needed(features, 8, 0, 1, max_sequences=4, num_chunks=4)
    chosen, texts, plan = contrastive_batches.packed_step_plan(
        features, contrastive_batches.text_lengths(features), 8, 0, 0, num_rows=4 * rows, max_sequences=4,
        num_chunks=4)
    packed = contrastive_batches.packed_batch(features, chosen, texts, plan, contrastive_batches.batch_keys(features))
    unpacked = {k: features[k][chosen] for k in contrastive_steps.batch_keys(features)}  # the step's pairs
    encode = jax.jit(lambda ids, mask, score_mask: net.apply({"params": params}, ids, 0 * ids, mask, score_mask))
    texts = [encode(unpacked["query_ids"], unpacked["query_mask"], unpacked["query_score_mask"]),
             encode(unpacked["passage_ids"], unpacked["passage_mask"], unpacked["passage_score_mask"])]
    texts += [encode(*(unpacked[f"negative_{key}"][:, g] for key in ("ids", "mask", "score_mask"))) for g in (0, 1)]
    columns_of_texts = columns(*((np.asarray(v), np.asarray(m)) for v, m in texts))
    teacher = torch.tensor(unpacked["teacher_scores"])
    references = {"mnrl": st_losses.MultiVectorMultipleNegativesRankingLoss(StandIn()),
                  "kl": st_losses.MultiVectorDistillKLDivLoss(StandIn(), temperature=2.0),
                  "margin_mse": st_losses.MultiVectorMarginMSELoss(StandIn())}
    for loss in ("kl", "margin_mse"):
        found, _ = jax.jit(functools.partial(contrastive_steps.contrastive_loss, net=net,
                                             settings=settings[loss].loss_settings()))(params, unpacked, None)
        assert abs(float(found) - references[loss](columns_of_texts, teacher).item()) < 1e-5, loss
    whole = jax.jit(jax.value_and_grad(functools.partial(contrastive_steps.contrastive_loss, net=net,
                                                         settings=settings["mnrl"].loss_settings()), has_aux=True))
    (found, _), grads = whole(params, unpacked, None)
    assert abs(float(found) - references["mnrl"](columns_of_texts, teacher).item()) < 1e-5
    cached = jax.jit(functools.partial(contrastive_steps.cached_loss_and_grad, net=net,
                                       settings=settings["mnrl"].loss_settings(), microbatch=2))
    (packed_loss, _), packed_grads = cached(params, packed, None)
    assert float(packed_loss) == pytest.approx(float(found), rel=1e-5)
    assert_trees_close(packed_grads, grads, rtol=1e-4, atol=1e-6)
    assert float(jnp.max(jnp.abs(grads["projection"]["kernel"]))) > 1e-4


def colbert_settings(**changes) -> dict:
    """run_settings' changes for ColBERT: width 16, queries of 12 tokens and documents of at most 24; the dense
    embedder's prompts and Matryoshka widths unset."""
    return {"contrastive.representation": "colbert", "contrastive.colbert_dim": 16,
            "contrastive.colbert_query_length": 12, "contrastive.colbert_document_length": 24,
            "contrastive.query_prompt": "", "contrastive.passage_prompt": "", "contrastive.include_prompt": True,
            "contrastive.matryoshka_dims": (), **changes}


@pytest.fixture(scope="module")
def colbert_run(pretrained, tmp_path_factory):
    """ColBERT fine-tuned from `pretrained`'s encoder through the program, in process: 80 pairs in batches of 16
    (documents packed; GradCache is the step test's) for 1 epoch, the dev set scored at steps 3 and 5.
    {"workdir", "summary", "files"}."""
    root = tmp_path_factory.mktemp("colbert")
    files = demo_pairs(root)
    rows = (root / "pairs.jsonl").read_text().splitlines()[:80]
    (root / "train80.jsonl").write_text("\n".join(rows) + "\n")
    files = {"train": str(root / "train80.jsonl"), "validation": files["validation"]}
    config = contrastive_run_config(pretrained, files, **colbert_settings(**{
        "train.epochs": 1.0, "logging.eval_every": 3, "optimizer.learning_rate": 2e-3,
        "train.contrastive_microbatch": 0}))
    summary = finetuning.finetune(config, str(root / "run"))
    return {"workdir": root / "run", "summary": summary, "files": files}


def test_the_program_trains_colbert_ranks_by_maxsim_and_exports(colbert_run, tmp_path):
    """Dev lines with mrr_at_10 and recall_at_1; the record says ColBERT; the dev ranks are those of a brute-force
    MaxSim on embed_tokens' vectors; the exported MultiVectorEncoder encodes queries and documents as
    embed_tokens does."""
    workdir = colbert_run["workdir"]
    lines = metric_lines(workdir)
    losses = [r["loss"] for r in lines if "loss" in r and "split" not in r]
    dev = [r for r in lines if r.get("split") == "validation"]
    assert len(losses) == 5 and all(np.isfinite(losses))
    assert [r["step"] for r in dev] == [3, 5] and all({"mrr_at_10", "recall_at_1"} <= set(r) for r in dev)
    _, meta = checkpoint.restore_params(str(workdir / "best"))
    record = meta.embedding
    assert (record.representation, record.similarity, record.multivector["dim"]) == ("colbert", "maxsim", 16)
    assert (record.multivector["query_length"], record.multivector["document_length"]) == (12, 24)
    model = bertjax.load(str(workdir))
    assert set(model.params) == {"bert", "projection"}
    rows = [json.loads(line) for line in open(colbert_run["files"]["validation"])]
    queries, positives = [r["query"] for r in rows], [r["positive"] for r in rows]
    assert len(set(positives)) == len(positives)  # each positive its own candidate
    q, q_mask = model.embed_tokens(queries, task="query")
    d, d_mask = model.embed_tokens(positives, task="document")
    assert q.shape == (40, 12, 16) and d.shape == (40, 24, 16) and q_mask.all() and not d_mask.all()
    scores = brute_maxsim(q, q_mask, d, d_mask)  # [40, 40]
    own = np.diag(scores)[:, None]
    lines = (workdir / "predictions" / "validation_positive_ranks.tsv").read_text().splitlines()[1:]
    ranks = np.array([int(line.split("\t")[1]) for line in lines])
    clear = np.sum(np.abs(scores - own) < 1e-4, axis=1) == 1  # no other candidate within rounding of the positive
    assert clear.mean() > 0.8 and (ranks[clear] == np.sum(scores >= own, axis=1)[clear]).all()
    mrr = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    assert colbert_run["summary"]["best"]["metrics"]["validation"]["mrr_at_10"] == pytest.approx(mrr, abs=1e-9)
    exported = MultiVectorEncoder(exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers"),
                                  device="cpu")
    assert "model = MultiVectorEncoder(" in (tmp_path / "st" / "README.md").read_text()  # the card loads its class
    texts = queries[:5] + ["music, history; " * 20]  # cut at either length, its punctuation skipped
    for task, encode in (("query", exported.encode_query), ("document", exported.encode_document)):
        vectors, mask = model.embed_tokens(texts, task=task)
        for row, expected in enumerate(encode(texts)):
            np.testing.assert_allclose(vectors[row][mask[row]], expected.numpy(), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="a ColBERT model gives a vector per token, not one per text: call "
                                         "embed_tokens"):
        model.embed(texts)


def test_bad_colbert_input_is_one_line(colbert_run, pretrained, tmp_path):
    """Each mistake is one line naming what to change, and nothing is written; a resumed workdir of another
    projection width says so too."""
    files = colbert_run["files"]
    cases = [({"train.init_from": str(colbert_run["workdir"]), "contrastive.colbert_dim": 8},
              "the checkpoint's ColBERT projection maps 64 -> 16, this model's 64 -> 8: set the projection width "
              "to 16"),
             ({"contrastive.colbert_markers": "brackets"},
              "contrastive.colbert_markers='brackets': choose one of prompt, token, none"),
             ({"contrastive.splade_scale": 2.0},
              "contrastive.splade_scale=2.0 is for contrastive.representation=splade"),
             ({"contrastive.loss": "cosent"}, "contrastive.loss=cosent with contrastive.representation=colbert"),
             ({"contrastive.query_prompt": "query: "}, "contrastive.query_prompt='query: ' is for dense embeddings"),
             ({"contrastive.colbert_document_length": 80},
              "contrastive.colbert_document_length=80 is longer than the 64 positions")]
    for changes, fragment in cases:
        config = contrastive_run_config(pretrained, files, **colbert_settings(**changes))
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            finetuning.finetune(config, str(tmp_path / "bad"))
        assert "\n" not in str(error.value) and not (tmp_path / "bad").exists(), fragment
    dense = contrastive_run_config(pretrained, files, **{"contrastive.colbert_dim": 64})
    with pytest.raises(ValueError, match="contrastive.colbert_dim=64 is for contrastive.representation=colbert"):
        finetuning.finetune(dense, str(tmp_path / "bad"))
    resumed = tmp_path / "resumed"
    shutil.copytree(colbert_run["workdir"], resumed)
    config = contrastive_run_config(pretrained, files, **colbert_settings(**{"contrastive.colbert_dim": 8}))
    with pytest.raises(ValueError, match="projection maps 64 -> 16, this model's 64 -> 8"):
        finetuning.finetune(config, str(resumed))
    with pytest.raises(ValueError, match="this model's representation is dense: call embed"):
        bertjax.load(pretrained["workdir"]).embed_tokens(["a text"])
