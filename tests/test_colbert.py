"""ColBERT (late interaction): MaxSim, its losses, multi-vector search and the sentence-transformers export,
each against an independent reference: sentence-transformers 6.3's multi_vector_encoder (torch), or a brute
force numpy MaxSim."""

import dataclasses
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

from bertjax.interop import multivector_export
from bertjax.models import heads, multivector, multivector_losses
from bertjax.tasks import multivector_search
from bertjax.tasks.multivector_texts import MultiVectorTexts, featurize
from bertjax.text.tokenizers import WordPieceTokenizer


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
