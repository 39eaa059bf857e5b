"""Contrastive fine-tuning: the losses against sentence-transformers' (MNRL, symmetric, hard negatives,
CoSENT, Matryoshka), 20 training steps against sentence-transformers' model and loss trained by torch's
AdamW, GradCache's gradient against the whole batch's, a 4-device mesh against one device, and the
fine-tuning program on pairs from the demo corpus (metrics, best checkpoint, exact resume after SIGTERM, bad
files; without a dev set, its step loss against one computed from sentence-transformers' embeddings with the
prompts left out of pooling, its export against embed)."""

import contextlib
import functools
import io
import json
import pathlib
import re
import signal
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import config_flags, start_command, tiny_config, train_losses, wait_for
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import losses as st_losses
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

import bertjax
from bertjax.data import demo
from bertjax.interop import hf
from bertjax import init_from as pretrained_models
from bertjax.models import contrastive_losses, heads
from bertjax.models.config import BertConfig
from bertjax.runs import exporting, finetuning
from bertjax.tasks import batches, contrastive_batches, contrastive_steps, registry, scoring
from bertjax.tasks.kinds import contrastive as contrastive_kind
from bertjax.training import checkpoint, optim, sharding
from bertjax.training import state as train_state
from configs.finetune import common as finetune_configs

RULES = finetune_configs.finetune_config("contrastive").logical_axis_rules


def embeddings(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def st_loss(loss, columns, labels=None):
    return float(loss.compute_loss_from_embeddings([torch.tensor(c) for c in columns], labels))


# --------------------------------------------------------------------------------------------------
# The losses on embeddings against sentence-transformers' own
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_with_hard_negatives_and_symmetric_as_sentence_transformers(symmetric):
    q, p, n = embeddings(0, 6, 8), embeddings(1, 6, 8), embeddings(2, 6, 2, 8)
    reference = st_losses.MultipleNegativesRankingLoss(
        None, scale=20.0, directions=("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",),
        partition_mode="per_direction" if symmetric else "joint")
    ours, sums = contrastive_losses.mnrl_loss(jnp.asarray(q), jnp.asarray(p), jnp.asarray(n), jnp.ones((6, 2)),
                                              scale=20.0, symmetric=symmetric)
    assert float(ours) == pytest.approx(st_loss(reference, [q, p, n[:, 0], n[:, 1]]), rel=1e-5)
    if not symmetric:  # in-batch negatives alone
        alone, _ = contrastive_losses.mnrl_loss(jnp.asarray(q), jnp.asarray(p), scale=20.0)
        assert float(alone) == pytest.approx(st_loss(reference, [q, p]), rel=1e-5)
    cos = q @ np.concatenate([p, n[:, 0], n[:, 1]]).T / np.outer(
        np.linalg.norm(q, axis=-1), np.linalg.norm(np.concatenate([p, n[:, 0], n[:, 1]]), axis=-1))
    assert float(sums["correct"]) == np.sum(np.argmax(cos, axis=-1) == np.arange(6))


def test_a_missing_hard_negative_is_no_candidate():
    """Row 2 has no second negative: the loss equals the direct computation without that column."""
    q, p, n = embeddings(3, 4, 8), embeddings(4, 4, 8), embeddings(5, 4, 2, 8)
    present = np.ones((4, 2), np.float32)
    present[2, 1] = 0
    ours, _ = contrastive_losses.mnrl_loss(jnp.asarray(q), jnp.asarray(p), jnp.asarray(n), jnp.asarray(present))
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    candidates = unit(np.concatenate([p, n[:, 0], np.delete(n[:, 1], 2, axis=0)]))
    logits = 20.0 * unit(q).astype(np.float64) @ candidates.T
    expected = np.mean(np.log(np.exp(logits).sum(-1)) - np.diagonal(logits))
    assert float(ours) == pytest.approx(expected, rel=1e-5)


def test_matryoshka_sums_the_loss_of_each_truncated_width():
    q, p = embeddings(6, 8, 16), embeddings(7, 8, 16)
    dims, weights = (16, 8, 4), (1.0, 0.5, 0.25)
    ours, _ = contrastive_losses.embedding_loss({"query": jnp.asarray(q), "passage": jnp.asarray(p)}, {},
                                                loss="mnrl", scale=20.0, matryoshka_dims=dims,
                                                matryoshka_weights=weights)
    reference = st_losses.MultipleNegativesRankingLoss(None)
    expected = sum(w * st_loss(reference, [q[:, :d], p[:, :d]]) for d, w in zip(dims, weights))
    assert float(ours) == pytest.approx(expected, rel=1e-5)


def test_cosent_and_cosine_mse_as_sentence_transformers():
    a, b = embeddings(8, 10, 8), embeddings(9, 10, 8)
    scores = np.array([0.1, 0.5, 0.5, 0.9, 0.0, 0.3, 1.0, 0.7, 0.2, 0.5], np.float32)  # ties included
    ours, _ = contrastive_losses.cosent_loss(jnp.asarray(a), jnp.asarray(b), jnp.asarray(scores), scale=20.0)
    expected = st_loss(st_losses.CoSENTLoss(None, scale=20.0), [a, b], torch.tensor(scores))
    assert float(ours) == pytest.approx(expected, rel=1e-5)
    mse, _ = contrastive_losses.cosine_mse_loss(jnp.asarray(a), jnp.asarray(b), jnp.asarray(scores))
    reference = st_losses.CosineSimilarityLoss(None)  # its loss of given embeddings, as its forward computes it
    cos = torch.cosine_similarity(torch.tensor(a), torch.tensor(b))
    assert float(mse) == pytest.approx(float(reference.loss_fct(cos, torch.tensor(scores))), rel=1e-5)


# --------------------------------------------------------------------------------------------------
# The step: GradCache and meshes
# --------------------------------------------------------------------------------------------------

TINY = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                  max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
LOSS = dict(loss="mnrl", scale=20.0, symmetric=True, matryoshka_dims=(32, 16), matryoshka_weights=(1.0, 0.5))


def token_rows(rng, shape, length):
    """Random ids [..., S] with 3..S real tokens per row (right-padded) and their mask."""
    ids = rng.integers(4, TINY.vocab_size, (*shape, length)).astype(np.int32)
    lengths = rng.integers(3, length + 1, shape)
    mask = (np.arange(length) < lengths[..., None]).astype(np.int32)
    return ids * mask, mask


def pairs_batch(seed, size=8, negatives=2):
    rng = np.random.default_rng(seed)
    batch = {}
    batch["query_ids"], batch["query_mask"] = token_rows(rng, (size,), 8)
    batch["passage_ids"], batch["passage_mask"] = token_rows(rng, (size,), 12)
    batch["negative_ids"], batch["negative_mask"] = token_rows(rng, (size, negatives), 12)
    batch["negative_present"] = (rng.random((size, negatives)) < 0.8).astype(np.float32)
    return batch


def tiny_params(cfg=TINY, seed=0, modes=("mean",)):
    net = heads.network("contrastive", cfg, embedding=dict(modes=modes, normalize=True))
    params = net.init(jax.random.key(seed), **heads.dummy_inputs("contrastive", 1, 8))["params"]
    return net, jax.tree_util.tree_map(jnp.asarray, jax.device_get(nn.unbox(params)))


def assert_trees_close(a, b, **tolerance):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tolerance)


def on_mesh(num_devices: int, grad_fn, params, batch):
    """((loss, sums), grads) of grad_fn jitted with the batch sharded over num_devices data devices."""
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:num_devices])
    rules = sharding.logical_rules(RULES)
    data_sharding = sharding.batch_sharding(mesh, rules)
    with jax.set_mesh(mesh):
        step = jax.jit(train_state.under_rules(grad_fn, rules), in_shardings=(None, data_sharding, None))
        return jax.device_get(step(params, sharding.global_batch(batch, data_sharding), None))


@functools.cache
def whole_batch_on_one_device():
    """The tiny embedder, a batch of 8 pairs with 2 hard negatives each, and the loss and gradient of
    the whole batch at once on one device (shared by the tests below)."""
    net, params = tiny_params()
    batch = pairs_batch(1)
    grad_fn = jax.value_and_grad(functools.partial(contrastive_steps.contrastive_loss, net=net, settings=LOSS),
                                 has_aux=True)
    return net, params, batch, on_mesh(1, grad_fn, params, batch)


@pytest.mark.mesh
def test_cached_microbatches_give_the_whole_batchs_gradient():
    """4 microbatches of 2 pairs (GradCache, on a 4-device mesh) against the whole batch at once on one
    device: the same loss and gradient."""
    net, params, batch, ((loss, _), grads) = whole_batch_on_one_device()
    cached = functools.partial(contrastive_steps.cached_loss_and_grad, net=net, settings=LOSS, microbatch=2)
    (cached_loss, _), cached_grads = on_mesh(4, cached, params, batch)
    assert float(cached_loss) == pytest.approx(float(loss), rel=1e-6)
    assert_trees_close(cached_grads, grads, rtol=1e-4, atol=1e-5)
    assert max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(grads)) > 1e-3  # not all zero


@pytest.mark.mesh
def test_a_4_device_mesh_sees_the_global_batch():
    """The loss and gradient with the batch sharded over 4 data devices equal one device's: every query
    is scored against every device's passages and negatives."""
    net, params, batch, ((loss, sums), grads) = whole_batch_on_one_device()
    grad_fn = jax.value_and_grad(functools.partial(contrastive_steps.contrastive_loss, net=net, settings=LOSS),
                                 has_aux=True)
    (mesh_loss, mesh_sums), mesh_grads = on_mesh(4, grad_fn, params, batch)
    assert float(mesh_loss) == pytest.approx(float(loss), rel=1e-6)
    assert float(mesh_sums["correct"]) == float(sums["correct"])
    assert_trees_close(mesh_grads, grads, rtol=1e-4, atol=1e-6)


def test_cached_dropout_draws_the_same_masks_in_both_passes():
    """With dropout on, GradCache's gradient is the gradient of the loss of its pass-1 embeddings: each
    microbatch's second forward drew the masks of its first."""
    cfg = BertConfig(**{**TINY.__dict__, "hidden_dropout_rate": 0.1, "attention_dropout_rate": 0.1})
    net, params = tiny_params(cfg)
    batch = {k: v for k, v in pairs_batch(2).items() if not k.startswith("negative")}  # queries and passages
    key, settings = jax.random.key(7), dict(loss="mnrl", scale=20.0)

    def reference(p):
        embedded = contrastive_steps.embed_in_chunks(p, batch, key, net=net, num_chunks=4)
        return contrastive_losses.embedding_loss(embedded, {}, **settings)[0]

    expected = jax.jit(jax.grad(reference))(params)
    cached = jax.jit(functools.partial(contrastive_steps.cached_loss_and_grad, net=net, settings=settings,
                                       microbatch=2))
    (_, _), grads = cached(params, batch, key)
    assert_trees_close(grads, expected, rtol=1e-4, atol=1e-5)
    (_, _), other = cached(params, batch, jax.random.key(8))  # other masks, another gradient: dropout is on
    assert not np.allclose(np.asarray(jax.tree_util.tree_leaves(other)[0]),
                           np.asarray(jax.tree_util.tree_leaves(grads)[0]))


# --------------------------------------------------------------------------------------------------
# Packed rows (data.packing): the texts of a step share rows
# --------------------------------------------------------------------------------------------------


def pair_features(seed, size=12, negatives=2, skips=False):
    """`size` pairs as the contrastive kind's features: queries of 3..8 tokens, passages and hard
    negatives of 3..12 (about a fifth of the negatives missing), scores, weights, a 32-wide target."""
    features = pairs_batch(seed, size, negatives)
    rng = np.random.default_rng(seed + 100)
    features.update(score=rng.random(size).astype(np.float32), example_weight=np.ones(size, np.float32),
                    idx=np.arange(size, dtype=np.int32), target=rng.normal(size=(size, 32)).astype(np.float32))
    if skips:  # include_prompt=False: [CLS] and a prompt of one token not pooled (each text keeps one token at least)
        features.update(query_skip=np.full(size, 2, np.int32), passage_skip=np.full(size, 2, np.int32))
    return features


PACKED_CASES = {  # loss settings, the features the loss reads, pooling modes, prompts left out of pooling
    "pairs": (LOSS, None, ("cls", "mean"), True),  # hard negatives, symmetric, Matryoshka
    "scored_pairs": (dict(loss="cosent", scale=20.0), ("query", "passage", "score"), ("mean",), False),
    "distill_mse": (dict(loss="distill_mse", scale=20.0), ("query", "target"), ("mean",), False),
}


def only(features, kept):
    """The features of pairs (kept=None), of scored pairs or of distill_mse texts."""
    if kept is None:
        return {k: v for k, v in features.items() if k not in ("target",)}
    drop = {"passage": "passage_", "score": "score", "target": "target"}
    return {k: v for k, v in features.items() if not k.startswith("negative") and not any(
        k.startswith(prefix) for name, prefix in drop.items() if name not in kept)}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_a_packed_batch_has_the_loss_gradient_and_embeddings_of_its_texts_unpacked(case):
    """The texts of 12 pairs (queries, passages, hard negatives; or scored pairs; or distill_mse's texts)
    packed into rows, one of them left empty, against the same pairs unpacked (no dropout): the same
    loss, metric sums, gradient and embeddings."""
    settings, kept, modes, skips = PACKED_CASES[case]
    net, params = tiny_params(modes=modes)
    features = only(pair_features(3, skips=skips), kept)
    lengths = contrastive_batches.text_lengths(features)
    rows = contrastive_batches.packed_rows_needed(features, 12, 0, 1, max_sequences=4) + 1  # one row empty
    chosen, texts, plan = contrastive_batches.packed_step_plan(features, lengths, 12, 0, 0, num_rows=rows,
                                                               max_sequences=4)
    packed = contrastive_batches.packed_batch(features, chosen, texts, plan, contrastive_batches.batch_keys(features))
    unpacked = {k: features[k][chosen] for k in contrastive_steps.batch_keys(features)}
    assert (plan >= 0).sum(axis=1).max() > 1 and (plan[-1] < 0).all()  # texts share rows; the last is empty
    real = sum(int(np.sum(v)) for v in lengths.values())
    assert packed["input_mask"].sum() == real and real / packed["input_ids"].size > 0.75
    assert packed["input_ids"].size < sum(unpacked[f"{role}_ids"].size for role in lengths)

    @jax.jit
    def loss_grad_and_embeddings(params, batch):
        loss = functools.partial(contrastive_steps.contrastive_loss, net=net, settings=settings)
        (value, sums), grads = jax.value_and_grad(loss, has_aux=True)(params, batch, None)
        return value, sums, grads, contrastive_steps.embed_batch(params, batch, None, net=net, deterministic=True)

    loss, sums, grads, expected = loss_grad_and_embeddings(params, unpacked)
    packed_loss, packed_sums, packed_grads, found = loss_grad_and_embeddings(params, packed)
    assert float(packed_loss) == pytest.approx(float(loss), rel=1e-5)
    assert {k: float(v) for k, v in packed_sums.items()} == pytest.approx({k: float(v) for k, v in sums.items()})
    assert_trees_close(packed_grads, grads, rtol=1e-4, atol=1e-5)
    assert max(float(np.max(np.abs(g))) for g in jax.tree_util.tree_leaves(grads)) > 1e-3  # not all zero
    roles = {"query", "passage", "negative"} if kept is None else {"query", "passage"} & set(kept)
    assert set(found) == set(expected) == roles
    for role, value in expected.items():
        present = features["negative_present"][chosen] > 0 if role == "negative" else slice(None)
        np.testing.assert_allclose(np.asarray(found[role])[present], np.asarray(value)[present], atol=2e-5)


@pytest.mark.mesh
def test_packed_gradcache_on_a_4_device_mesh_gives_the_whole_batchs_gradient():
    """The 8 pairs of whole_batch_on_one_device packed (each of 4 microbatches into its own rows) and
    sharded over 4 data devices, all at once and in cached microbatches of 2 pairs: the loss and gradient
    of the whole batch unpacked on one device."""
    net, params, batch, ((loss, sums), grads) = whole_batch_on_one_device()
    features = dict(batch, example_weight=np.ones(8, np.float32))
    per = contrastive_batches.packed_rows_needed(features, 8, 0, 1, max_sequences=4, num_chunks=4)
    chosen, texts, plan = contrastive_batches.packed_step_plan(
        features, contrastive_batches.text_lengths(features), 8, 0, 0, num_rows=4 * per, max_sequences=4,
        num_chunks=4)
    packed = contrastive_batches.packed_batch(features, chosen, texts, plan, contrastive_batches.batch_keys(features))
    for c in range(4):  # microbatch c (pairs c::4) in rows c::4 alone
        assert set(texts.pair[plan[c::4][plan[c::4] >= 0]] % 4) == {c}
    whole = jax.value_and_grad(functools.partial(contrastive_steps.contrastive_loss, net=net, settings=LOSS),
                               has_aux=True)
    cached = functools.partial(contrastive_steps.cached_loss_and_grad, net=net, settings=LOSS, microbatch=2)
    for grad_fn in (whole, cached):
        (packed_loss, packed_sums), packed_grads = on_mesh(4, grad_fn, params, packed)
        assert float(packed_loss) == pytest.approx(float(loss), rel=1e-5)
        assert float(packed_sums["correct"]) == float(sums["correct"])
        assert_trees_close(packed_grads, grads, rtol=1e-4, atol=1e-5)


def test_the_packing_plan_takes_every_text_once_and_refuses_rows_too_few():
    """Over 6 steps (3 epochs of 16 pairs in batches of 8) every present text of each step's pairs is
    in its rows once, within the row width and K, at its pair's slot; too few rows is one line."""
    features = pair_features(5, size=16, negatives=3)
    lengths = contrastive_batches.text_lengths(features)
    rows = contrastive_batches.packed_rows_needed(features, 8, 1, 6, max_sequences=5, num_chunks=2)
    stream = contrastive_batches.packed_train_batches(features, 8, 1, num_rows=2 * rows, max_sequences=5,
                                                      num_chunks=2)
    for step in range(6):
        batch = next(stream)
        chosen = batches.train_batch_indices(16, 8, 1, step)
        np.testing.assert_array_equal(batch["score"], features["score"][chosen])
        places = {"query": batch["query_slot"], "passage": batch["passage_slot"]}
        texts = [(role, places[role][j], features[f"{role}_ids"][i]) for role in places
                 for j, i in enumerate(chosen)]
        texts += [("negative", batch["negative_slot"][j, g], features["negative_ids"][i, g]) for j, i in
                  enumerate(chosen) for g in range(3) if features["negative_present"][i, g]]
        taken = [int(place) for _, place, _ in texts]
        assert len(set(taken)) == len(taken) and batch["input_mask"].sum() == sum(
            int(np.sum(ids > 0)) for _, _, ids in texts)
        for _role, place, ids in texts:  # its tokens at its [CLS], positions from 0, its sequence id
            r, slot = divmod(int(place), 5)
            first, n = batch["cls_positions"][r, slot], int(np.sum(ids > 0))
            np.testing.assert_array_equal(batch["input_ids"][r, first:first + n], ids[:n])
            np.testing.assert_array_equal(batch["position_ids"][r, first:first + n], np.arange(n))
            assert (batch["sequence_ids"][r, first:first + n] == slot + 1).all()
    assert batch["input_ids"].shape == (2 * rows, 12) and batch["cls_positions"].shape == (2 * rows, 5)
    with pytest.raises(ValueError, match=r"step 0: the \d+ texts of 4 pairs need \d+ packed rows, data.packed_rows=2"):
        contrastive_batches.packed_step_plan(features, lengths, 8, 1, 0, num_rows=2, max_sequences=5, num_chunks=2)


# --------------------------------------------------------------------------------------------------
# 20 steps against sentence-transformers trained by torch.optim.AdamW
# --------------------------------------------------------------------------------------------------

ADAMW = dict(lr=5e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)


@pytest.fixture(scope="module")
def st_model_directory(tmp_path_factory):
    """A small random transformers BertModel with mean pooling, written as a sentence-transformers model."""
    import transformers  # here: the one test that builds a transformers model

    root = tmp_path_factory.mktemp("st")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(TINY.vocab_size - 5)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = transformers.BertConfig(vocab_size=TINY.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(root / "hf")
    transformers.BertTokenizer(str(root / "vocab.txt")).save_pretrained(root / "hf")
    model = SentenceTransformer(modules=[Transformer(str(root / "hf")), Pooling(32, "mean")], device="cpu")
    model.save(str(root / "st"))
    return root / "st"


def reference_losses(directory, batches, loss_name: str) -> list[float]:
    """sentence-transformers' loss on its own model, a plain torch.optim.AdamW loop (decay off for LayerNorm
    and biases, as bertjax's AdamW), one loss per step."""
    model = SentenceTransformer(str(directory), device="cpu")
    model.train()
    loss_fn = (st_losses.MultipleNegativesRankingLoss(model, scale=20.0) if loss_name == "mnrl"
               else st_losses.CoSENTLoss(model, scale=20.0))
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not ("LayerNorm" in n or "bias" in n)]},
              {"params": [p for n, p in named if "LayerNorm" in n or "bias" in n], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, **ADAMW)
    out = []
    for batch in batches:
        columns = [{"input_ids": torch.tensor(batch[f"{role}_ids"], dtype=torch.long),
                    "attention_mask": torch.tensor(batch[f"{role}_mask"], dtype=torch.long),
                    "token_type_ids": torch.zeros(batch[f"{role}_ids"].shape, dtype=torch.long)}
                   for role in ("query", "passage")]
        loss = loss_fn(columns, torch.tensor(batch["score"]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(float(loss.detach()))
    return out


def bertjax_losses(directory, batches, loss_name: str) -> list[float]:
    """The same training through bertjax: the directory read by the Hugging Face importer, the contrastive
    step (mean pooling) and bertjax's AdamW with bias correction, a constant rate, no clipping."""
    cfg, params, _ = hf.load_hf_checkpoint(directory, dict(hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
    net = heads.network("contrastive", cfg, embedding=dict(modes=("mean",), normalize=False))
    tx = optim.bert_adamw(ADAMW["lr"], *ADAMW["betas"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                          bias_correction=True)
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    rules = sharding.logical_rules(RULES)
    data_sharding = sharding.batch_sharding(mesh, rules)
    init_key, dropout_key = train_state.root_keys(0)
    setup = train_state.Setup.create(net, heads.dummy_inputs("contrastive", 1, 8), tx, None, mesh, rules, init_key,
                                     prepare_params=lambda p: heads.with_pretrained_encoder(p, params))
    loss = functools.partial(contrastive_steps.contrastive_loss, net=net,
                             settings=dict(loss=loss_name, scale=20.0))
    step = setup.compile_train_step(loss, data_sharding, 1, mask_keys=contrastive_steps.MASK_KEYS)
    state, out = setup.init(init_key), []
    with jax.set_mesh(mesh):
        for batch in batches:
            state, sums = step(state, sharding.global_batch(batch, data_sharding), dropout_key)
            out.append(float(sums["loss_sum"]))
    return out


@pytest.mark.parametrize("loss_name", ["mnrl", "cosent"])
def test_training_follows_sentence_transformers(st_model_directory, loss_name):
    """20 steps from the same weights on the same batches: every step's loss within 1e-4 (relative)."""
    rng = np.random.default_rng(11)
    batches = []
    for _ in range(20):
        batch = {k: v for k, v in pairs_batch(int(rng.integers(1 << 30)), size=8).items()
                 if not k.startswith("negative")}
        batch["score"] = rng.random(8).astype(np.float32)
        batches.append(batch)
    expected = reference_losses(st_model_directory, batches, loss_name)
    got = bertjax_losses(st_model_directory, batches, loss_name)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert expected[-1] < expected[0] - 0.05  # it trained: the comparison is of a changing model


def test_prompts_left_out_of_pooling_as_sentence_transformers(st_model_directory):
    """contrastive.include_prompt=False: the kind's features and the step's embeddings, unpacked and
    packed, equal sentence-transformers' Pooling(include_prompt=False) encoding the texts after their
    prompt (cls and mean pooling); pooled with the prompt they differ."""
    loaded = bertjax.load(str(st_model_directory))
    texts = [("w7 w8 w9", "w10 w11 w12 w13 w14"), ("w20", "w21 w22"), ("w30 w31 w32 w33", "w34 w35 w36")]
    pairs = [contrastive_kind.Pair(n, q, p) for n, (q, p) in enumerate(texts)]
    task = registry.get_task("contrastive")
    settings = contrastive_kind.Settings(query_prompt="w1 w2 ", passage_prompt="w3 ", include_prompt=False,
                                         max_query_length=12, max_seq_length=16)
    features = contrastive_kind.featurize(task, pairs, loaded.tokenizer, 16, settings)
    assert features["query_skip"].tolist() == [3, 3, 3] and features["passage_skip"].tolist() == [2, 2, 2]
    packed_features = dict(features, example_weight=np.ones(3, np.float32))
    rows = contrastive_batches.packed_rows_needed(packed_features, 3, 0, 1, max_sequences=6)
    chosen, packed_texts, plan = contrastive_batches.packed_step_plan(
        packed_features, contrastive_batches.text_lengths(packed_features), 3, 0, 0, num_rows=rows, max_sequences=6)
    assert rows < 6  # texts share rows
    packed = contrastive_batches.packed_batch(packed_features, chosen, packed_texts, plan,
                                              contrastive_batches.batch_keys(packed_features))
    net = heads.network("contrastive", loaded.config, embedding=dict(modes=("cls", "mean"), normalize=False))
    embed = functools.partial(contrastive_steps.embed_batch, {"bert": loaded.params["bert"]}, rng=None, net=net,
                              deterministic=True)
    unpacked, in_rows = embed(features), embed(packed)
    with_prompt = embed({k: v for k, v in features.items() if "skip" not in k})
    reference = SentenceTransformer(modules=[Transformer(str(st_model_directory.parent / "hf")),
                                             Pooling(32, ("cls", "mean"), include_prompt=False)], device="cpu")
    for role, prompt, column in (("query", "w1 w2 ", 0), ("passage", "w3 ", 1)):
        expected = reference.encode([t[column] for t in texts], prompt=prompt)
        np.testing.assert_allclose(np.asarray(unpacked[role]), expected, atol=2e-5)
        np.testing.assert_allclose(np.asarray(in_rows[role])[np.argsort(chosen)], expected, atol=2e-5)
        assert np.abs(np.asarray(with_prompt[role]) - expected)[:, :32].max() > 1e-2  # cls: another token
        assert np.abs(np.asarray(with_prompt[role]) - expected)[:, 32:].max() > 1e-2  # mean: more tokens


# --------------------------------------------------------------------------------------------------
# The fine-tuning program on pairs from the demo corpus
# --------------------------------------------------------------------------------------------------


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def demo_pairs(root: pathlib.Path) -> dict:
    """Sentences of the demo corpus split in two: the first four words the query, the rest its positive;
    every other training pair carries another sentence's end as a hard negative. 160 train, 40 dev."""
    sentences = [s.split() for doc in demo.demo_documents(300) for s in doc if 8 <= len(s.split()) <= 20][:200]
    rows = [{"query": " ".join(words[:4]), "positive": " ".join(words[4:])} for words in sentences]
    for n, row in enumerate(rows[:160:2]):
        row["negatives"] = [rows[n * 2 + 1]["positive"]]
    return {"train": write_jsonl(root / "pairs.jsonl", rows[:160]),
            "validation": write_jsonl(root / "dev.jsonl", rows[160:])}


def run_settings(pretrained, files: dict) -> dict:
    """configs/finetune/contrastive.py's changes for a small run from `pretrained`: 160 pairs in batches of
    16 (cached in microbatches of 8) for 2 epochs, 20 steps, the dev set scored every 5; the texts packed
    (the config's default), the prompts left out of pooling. As --config.key=value flags: config_flags."""
    return {"train.init_from": pretrained["workdir"], "data.train": files["train"],
            "data.validation": files["validation"], "data.max_seq_length": 32, "data.max_query_length": 16,
            "train.batch_size": 16, "train.epochs": 2.0, "train.contrastive_microbatch": 8,
            "optimizer.learning_rate": 1e-3, "logging.log_every": 1, "logging.eval_every": 5,
            "logging.eval_batch_size": 32, "contrastive.query_prompt": "query: ",
            "contrastive.passage_prompt": "passage: ", "contrastive.matryoshka_dims": (64, 32),
            "contrastive.include_prompt": False}


def contrastive_run_config(pretrained, files: dict, **changes):
    """run_settings' config, with `changes` {"section.key": value}."""
    return tiny_config({**run_settings(pretrained, files), **changes}, "configs/finetune/contrastive.py")


def metric_lines(workdir) -> list:
    return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_program_trains_scores_keeps_the_best_and_resumes_exactly(pretrained, tmp_path, capsys):
    files = demo_pairs(tmp_path)
    config = contrastive_run_config(pretrained, files)
    whole = tmp_path / "whole"
    summary = finetuning.finetune(config, str(whole))
    assert re.search(r"packing: the texts of 16 pairs a step in \d+ rows of 32", capsys.readouterr().out)
    lines = metric_lines(whole)
    dev = [r for r in lines if r.get("split") == "validation"]
    assert [r["step"] for r in dev] == [5, 10, 15, 20] and all({"mrr_at_10", "recall_at_1"} <= set(r) for r in dev)
    assert summary["main_metric"] == "mrr_at_10" and summary["best"]["value"] == max(r["mrr_at_10"] for r in dev)
    losses = [train_losses(whole)[step] for step in range(1, 21)]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.2  # it learns (a random tiny model: slowly)
    params, meta = checkpoint.restore_params(str(whole / "best"))
    assert set(params) == {"bert"} and meta.step == summary["best"]["step"] and meta.task.kind == "contrastive"
    assert meta.embedding.modes == ("mean",) and meta.embedding.normalize and not meta.embedding.include_prompt
    assert meta.embedding.prompts == {"query": "query: ", "passage": "passage: "}
    assert (meta.embedding.max_seq_length, meta.embedding.max_query_length) == (32, 16)
    ranks = (whole / "predictions" / "validation_positive_ranks.tsv").read_text().splitlines()
    assert ranks[0] == "index\trank" and len(ranks) == 41
    model = bertjax.load(str(whole))  # the best checkpoint, as a notebook loads it
    assert model.task.kind == "contrastive" and model.encode(["a sentence"])["sequence_output"].shape[-1] == 64
    with pytest.raises(ValueError, match="gives sentence embeddings, not predictions"):
        model.predict(["a sentence"])
    exported = exporting.export(str(whole), str(tmp_path / "params"), "params")  # the record travels with it
    assert json.loads((pathlib.Path(exported) / "config.json").read_text())["embedding"] == meta.embedding.__dict__ | {
        "modes": ["mean"]}
    with pytest.raises(ValueError, match="'contrastive' model has no transformers task class"):
        exporting.export(str(whole), str(tmp_path / "hf"), "hf")

    # The program sent SIGTERM once it has logged 3 steps: it saves that step's checkpoint, exits 0 as a
    # preempted run does, and the same run again ends with the uninterrupted run's metrics and params, bit for bit.
    preempted = tmp_path / "preempted"
    proc = start_command([sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune/contrastive.py",
                          f"--workdir={preempted}", *config_flags(run_settings(pretrained, files))])
    wait_for(lambda: (preempted / "metrics.jsonl").exists() and len(train_losses(preempted)) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    saved = int(out.split("SIGTERM: saved the checkpoint of step ")[1].split(";")[0])
    assert 3 <= saved < 20 and (preempted / "checkpoints" / str(saved) / "params").is_dir()
    assert not (preempted / "summary.json").exists()
    finetuning.finetune(config, str(preempted))
    assert f"resumed from step {saved}" in capsys.readouterr().out
    assert train_losses(preempted) == train_losses(whole) and len(train_losses(whole)) == 20
    for kept in ("checkpoints", "best"):  # the last step's params and the best dev model, bit for bit
        assert_trees_close(checkpoint.restore_params(str(preempted / kept))[0],
                           checkpoint.restore_params(str(whole / kept))[0], rtol=0, atol=0)
    later = lambda lines: [{k: v for k, v in r.items() if k != "wall_time"} for r in lines  # noqa: E731
                           if r.get("split") == "validation" and r["step"] > saved]
    assert later(metric_lines(preempted)) == later(dev) and later(dev)


@pytest.fixture(scope="module")
def no_dev_run(pretrained, tmp_path_factory):
    """run_settings without a dev set (data.validation unset), on 64 of demo_pairs' training pairs in 4 steps of
    16, without dropout (step 1's loss is then a function of the pretrained model alone), in process as the
    program runs it: {"workdir", "config", "out"} (the console)."""
    root = tmp_path_factory.mktemp("no-dev")
    rows = pathlib.Path(demo_pairs(root)["train"]).read_text().splitlines()[:64]
    train = root / "train64.jsonl"
    train.write_text("\n".join(rows) + "\n")
    config = contrastive_run_config(pretrained, {"train": str(train), "validation": ""}, **{
        "train.epochs": 1.0, "train.contrastive_microbatch": 0, "model.hidden_dropout_rate": 0.0,
        "model.attention_dropout_rate": 0.0})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        finetuning.finetune(config, str(root / "run"))
    return {"workdir": root / "run", "config": config, "out": out.getvalue()}


def test_without_a_dev_set_the_last_step_is_the_model(no_dev_run, pretrained, tmp_path):
    """Contrastive fine-tuning without data.validation trains every step, says so once, keeps the last step's
    model as best/ (what bertjax.load and the export read); the other kinds, and a sweep, still need a dev set."""
    workdir, out = no_dev_run["workdir"], no_dev_run["out"]
    assert out.count("no dev set") == 2  # the line at the start and the run's last line
    assert "no dev set (data.validation unset): training all 4 steps, the last step's model kept as the model" in out
    assert "contrastive: no dev set; the model is step 4's" in out
    lines = metric_lines(workdir)
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4] and not any("split" in r for r in lines)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["best"] == {"step": 4, "value": None, "metrics": {}}
    best, meta = checkpoint.restore_params(str(workdir / "best"))
    last, _ = checkpoint.restore_params(str(workdir / "checkpoints"))
    assert meta.step == 4 and meta.embedding.prompts == {"query": "query: ", "passage": "passage: "}
    assert_trees_close(best, last, rtol=0, atol=0)
    model = bertjax.load(str(workdir))
    assert_trees_close(model.params["bert"], last["bert"], rtol=0, atol=0)
    exported = exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers")
    assert SentenceTransformer(exported, device="cpu").encode(["a sentence"]).shape == (1, 64)
    assert "model = SentenceTransformer(" in (tmp_path / "st" / "README.md").read_text()  # not a CrossEncoder's
    dev_less = dict(pretrained["files"], validation="")
    classification = contrastive_run_config(pretrained, dev_less)
    classification.task, classification.data.labels = "classification", ("no", "yes")
    with pytest.raises(ValueError, match="task classification needs a dev set to evaluate on: set "
                                         "config.data.validation"):
        finetuning.finetune(classification, str(tmp_path / "classification"))
    sweep = contrastive_run_config(pretrained, {"train": dev_less["train"], "validation": ""})
    sweep.sweep = True
    with pytest.raises(ValueError, match="config.sweep chooses the learning rate on the dev set"):
        finetuning.finetune_or_sweep(sweep, str(tmp_path / "sweep"))
    assert not (tmp_path / "classification").exists() and not (tmp_path / "sweep").exists()


def test_training_pools_without_the_prompts_as_its_sentence_transformers_export(no_dev_run, pretrained, tmp_path):
    """contrastive.include_prompt=False in training: step 1's logged loss is Matryoshka MNRL computed here from
    sentence-transformers' embeddings of the step's texts by the pretrained model under
    Pooling(include_prompt=False); the trained model's export encodes as bertjax.load's embed, prompts and all."""
    config = no_dev_run["config"]
    start = SentenceTransformer(exporting.export(pretrained["workdir"], str(tmp_path / "start"),
                                                 "sentence-transformers"), device="cpu")
    start[1].include_prompt = False
    pairs = [json.loads(line) for line in pathlib.Path(config.data.train).read_text().splitlines()]
    chosen = batches.train_batch_indices(len(pairs), 16, config.train.seed, 0)
    start.max_seq_length = 16  # data.max_query_length
    queries = start.encode([pairs[i]["query"] for i in chosen], prompt="query: ")
    start.max_seq_length = 32
    candidates = start.encode([pairs[i]["positive"] for i in chosen] + [
        pairs[i]["negatives"][0] for i in chosen if "negatives" in pairs[i]], prompt="passage: ")
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    expected = 0.0
    for width in (64, 32):  # contrastive.matryoshka_dims, each of weight 1
        logits = 20.0 * unit(queries[:, :width].astype(np.float64)) @ unit(candidates[:, :width].astype(np.float64)).T
        top = logits.max(-1)
        expected += np.mean(top + np.log(np.exp(logits - top[:, None]).sum(-1)) - np.diagonal(logits))
    assert train_losses(no_dev_run["workdir"])[1] == pytest.approx(expected, rel=1e-5)

    workdir = no_dev_run["workdir"]
    model = bertjax.load(str(workdir))
    exported = SentenceTransformer(exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers"),
                                   device="cpu")
    texts = [pairs[i]["positive"] for i in range(10)] + ["", "music " * 40]  # the last cut at 32 (16 as a query)
    for how in (dict(prompt_name="query"), dict(prompt_name="passage"), dict(prompt="")):
        difference = np.abs(model.embed(texts, **how) - exported.encode(texts, **how)).max()
        assert difference < 1e-5, (how, difference)
    assert np.abs(model.embed(texts, task="query") - exported.encode_query(texts)).max() < 1e-5


@pytest.mark.mesh
def test_scored_pairs_through_the_program(pretrained, tmp_path):
    """cosent on {text, text_pair, score} rows (1 for a sentence's own end, below 0.5 for another's): dev
    lines with spearman and pearson, the best checkpoint chosen by spearman, each pair's cosine written."""
    sentences = [s.split() for doc in demo.demo_documents(300) for s in doc if 8 <= len(s.split()) <= 20][:120]
    rng = np.random.default_rng(0)
    rows = [{"text": " ".join(w[:4]), "text_pair": " ".join(w[4:]), "score": 1.0} if n % 2 else
            {"text": " ".join(w[:4]), "text_pair": " ".join(sentences[(n + 7) % 120][4:]),
             "score": float(rng.random() / 2)} for n, w in enumerate(sentences)]
    files = {"train": write_jsonl(tmp_path / "train.jsonl", rows[:80]),
             "validation": write_jsonl(tmp_path / "dev.jsonl", rows[80:])}
    config = contrastive_run_config(pretrained, files, **{"contrastive.loss": "cosent", "train.epochs": 1.0,
                                                          "train.contrastive_microbatch": 0})
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    dev = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
           if '"split"' in line]
    assert [r["step"] for r in dev] == [5] and {"spearman", "pearson"} <= set(dev[0])
    assert summary["main_metric"] == "spearman" and summary["best"]["value"] == dev[0]["spearman"]
    cosines = (tmp_path / "run" / "predictions" / "validation_cosines.tsv").read_text().splitlines()
    assert cosines[0] == "index\tcosine" and len(cosines) == 41


def test_a_bad_pairs_file_is_one_line(pretrained, tmp_path):
    good = demo_pairs(tmp_path)
    cases = [
        ([{"query": "a b", "positive": "c d"}, {"query": "e f"}], "bad.jsonl:2: missing field 'positive'"),
        ([{"anchor": "a b", "positive": " "}], "bad.jsonl:1: field 'positive' is an empty text"),
        ([{"query": "a b", "positive": "c", "negatives": "x"}, {"positive": "d"}],
         "bad.jsonl:2: missing field 'query'"),
        ([], "bad.jsonl: empty file"),
    ]
    for rows, fragment in cases:
        config = contrastive_run_config(pretrained, {**good, "train": write_jsonl(tmp_path / "bad.jsonl", rows)})
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            finetuning.finetune(config, str(tmp_path / "bad"))
        assert "\n" not in str(error.value) and not (tmp_path / "bad").exists()
    scored = contrastive_run_config(pretrained, good, **{"contrastive.loss": "cosent"})
    with pytest.raises(ValueError, match=re.escape("pairs.jsonl:1: missing field 'text'")):
        finetuning.finetune(scored, str(tmp_path / "bad"))
    out_of_range = write_jsonl(tmp_path / "scored.jsonl", [{"text": "a", "text_pair": "b", "score": 4.0}])
    settings = [({"contrastive.loss": "cosine_mse", "data.train": out_of_range},
                 "scored.jsonl:1: score 4.0 is outside [-1, 1]"),
                ({"contrastive.matryoshka_dims": (128, 32)}, "the embeddings have 64 features"),
                ({"contrastive.loss": "infonce"},
                 "contrastive.loss='infonce': choose one of mnrl, cosent, cosine_mse, distill_mse"),
                ({"train.grad_accum_steps": 2}, "would split the in-batch negatives"),
                ({"data.packed_rows": 2}, "data.packed_rows=2: some step's texts need"),
                ({"data.packed_rows": 3}, "data.packed_rows=3 is not divisible by the 2 microbatches"),
                ({"data.max_query_length": 65}, "data.max_query_length=65 is longer than the 64 positions")]
    for changes, fragment in settings:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            finetuning.finetune(contrastive_run_config(pretrained, good, **changes), str(tmp_path / "bad"))
        assert not (tmp_path / "bad").exists()


# --------------------------------------------------------------------------------------------------
# Reading, features and dev scores
# --------------------------------------------------------------------------------------------------


def test_dev_retrieval_as_pytrec_eval_and_correlations_as_scipy(monkeypatch):
    import pytrec_eval  # here: a test reference only this test uses
    from scipy import stats

    monkeypatch.setattr(contrastive_kind, "RANK_BLOCK", 7)  # the queries ranked in several blocks

    rng = np.random.default_rng(12)
    queries, passages = rng.normal(size=(30, 8)), rng.normal(size=(30, 8))
    passages[5] = passages[3]  # two queries with the same positive text: one candidate for both
    texts = [f"passage {n}" for n in range(30)]
    texts[5] = texts[3]
    examples = [contrastive_kind.Pair(n, f"query {n}", texts[n]) for n in range(30)]
    split = scoring.Split(examples, {"idx": np.arange(30)}, True)
    task = registry.get_task("contrastive")
    found = contrastive_kind.score(task, "validation", split, np.stack([queries, passages], axis=1)).metrics

    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    cos = unit(queries) @ unit(np.delete(passages, 5, axis=0)).T  # candidates: the distinct texts
    names = [t for n, t in enumerate(texts) if n != 5]
    top10 = {f"q{n}": {names[c]: float(cos[n, c]) for c in np.argsort(-cos[n])[:10]} for n in range(30)}
    qrels = {f"q{n}": {texts[n]: 1} for n in range(30)}
    evaluated = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "P_1"}).evaluate(top10)
    assert found["mrr_at_10"] == pytest.approx(np.mean([v["recip_rank"] for v in evaluated.values()]))
    assert found["recall_at_1"] == pytest.approx(np.mean([v["P_1"] for v in evaluated.values()]))
    assert 0 < found["mrr_at_10"] < 1

    scores = rng.random(30)
    scored_split = scoring.Split([None] * 30, {"idx": np.arange(30), "score": scores}, True)
    scored_task = registry.get_task("contrastive", contrastive_loss="cosent")
    found = contrastive_kind.score(scored_task, "validation", scored_split, np.stack([queries, passages], 1)).metrics
    cosines = np.sum(unit(queries) * unit(passages), axis=-1)
    assert found["spearman"] == pytest.approx(stats.spearmanr(cosines, scores).statistic)
    assert found["pearson"] == pytest.approx(stats.pearsonr(cosines, scores).statistic)


def test_features_tokenize_each_text_alone_after_its_prompt(pretrained, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [
        {"anchor": "what does it return", "positive": "the value it computed",
         "negative": "a list of names"},  # sentence-transformers' columns
        {"query": "how long is it", "positive": "three words"},
    ])
    config = contrastive_run_config(pretrained, {"train": path, "validation": path})
    config.contrastive.update(max_negatives=2)
    settings = contrastive_kind.settings_from_config(config)
    task = registry.get_task("contrastive")
    tokenizer = pretrained_models.resolve(pretrained["workdir"]).tokenizer.load()
    features = contrastive_kind.featurize(task, contrastive_kind.read(task, "train", path), tokenizer, 32, settings)

    def row(text, length):
        ids = [tokenizer.cls_id, *tokenizer.encode([text])[0][:length - 2], tokenizer.sep_id]
        return ids + [tokenizer.pad_id] * (length - len(ids))

    assert features["query_ids"].shape == (2, 16) and features["passage_ids"].shape == (2, 32)
    assert features["query_ids"][0].tolist() == row("query: what does it return", 16)
    assert features["passage_ids"][1].tolist() == row("passage: three words", 32)
    assert features["negative_ids"].shape == (2, 1, 32)  # the most any row has, at most max_negatives
    assert features["negative_ids"][0, 0].tolist() == row("passage: a list of names", 32)
    assert features["negative_present"].tolist() == [[1.0], [0.0]]
    assert features["query_mask"][1].sum() == len(tokenizer.encode(["query: how long is it"])[0]) + 2
