"""What contrastive fine-tuning puts into the one train step: the embeddings of a batch's texts and their
loss (bertjax/models/contrastive_losses.py), whole or in cached microbatches (GradCache), the (query,
passage) embeddings the dev evaluation scores, and the embedder and the jitted step a run builds from them.

An unpacked batch (bertjax/tasks/kinds/contrastive.py's features) holds each pair's texts tokenized apart:
  query_ids, query_mask [B, Sq]   passage_ids, passage_mask [B, Sp]   score [B] (scored pairs)
  negative_ids, negative_mask [B, G, Sp] and negative_present [B, G] (hard negatives, where G > 0)
  query_skip, passage_skip [B] (contrastive.include_prompt=False: leading tokens left out of pooling)
  (distill_mse: query_ids, query_mask [B, S] of each text and its teacher's embedding target [B, Dt]; no passage)
  teacher_scores [B, 1 + G] (margin_mse, kl: the teacher's score of the positive, then of each negative)
Queries, passages and negatives each run through the embedder in one call with a dropout key of their
own (role r: fold_in(key, r)), as sentence-transformers embeds each column in a call of its own.
SPLADE (bertjax/models/sparse.py): the embeddings are vectors over the vocabulary (D = V); with its static
query side the queries (their tokens alone) go through the static table, not the encoder. ColBERT
(bertjax/models/multivector.py): the embeddings are token vectors, [B, Sq, D] and [B, Sp, D] ([B, G, Sp, D]
negatives), zero where the batch's score masks (query_score_mask, passage_score_mask, negative_score_mask)
are 0; the loss reads those masks (multivector_losses.embedding_loss).

A packed batch (bertjax/tasks/contrastive_batches.py, data.packing) holds every text of the step in
R rows: input_ids, input_mask, sequence_ids, position_ids [R, W], cls_positions (and prompt_lengths)
[R, K], and each text's flat place in the R x K embeddings: query_slot [B], passage_slot [B],
negative_slot [B, G]; score, example_weight, negative_present, target, teacher_scores as unpacked. One embedder call
(one dropout key) gives [R, K, D]; the roles' embeddings are gathered from it, so the loss reads the
same {"query", "passage", "negative"} either way (without dropout: the same values to float rounding).
ColBERT packs its documents only: the rows give [R, W, D], and each document's Sp vectors are the span from
its slot's start (gather_spans); its queries come as unpacked, one a row.

GradCache (Gao et al. 2021): the gradient of the whole batch's loss in k microbatches of m pairs. Pass 1
embeds every microbatch without gradient; the loss and its gradient with respect to the embeddings
come from the whole batch's embeddings; pass 2 re-runs each microbatch's forward under jax.vjp with
those embedding gradients and adds up the parameter gradients (a scan). Microbatch c holds pairs c::k
(strided, as optim.accumulate_gradients splits a batch, so each device keeps its own rows; packed: rows
c::k, which hold exactly its texts), and its dropout key is fold_in(role key, c) in both passes: the
same masks, so the two passes agree. SPLADE keeps the whole batch's [B, V] vectors of each role between
the passes (4 V bytes a text).

SPLADE's step reads the state's step for its regularizer's warmup (warmed_up_train_step).

Shape legend: B batch (pairs), G hard negatives per pair, Sq / Sp query / passage length, D embedding
width, k microbatches, m pairs per microbatch (B = k m); packed: R rows, W row width, K texts per row;
L a ColBERT text's tokens (Sq or Sp).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import contrastive_losses, multivector, multivector_losses, sparse
from bertjax.tasks.contrastive_batches import ROW_KEYS, SCORE_MASK_KEYS, SLOT_KEYS
from bertjax.training import step as steps
from bertjax.training.state import under_rules

ROLES = ("query", "passage", "negative")  # the dropout key of role r is fold_in(key, r)
PAIR_KEYS = ("query_ids", "query_mask", "passage_ids", "passage_mask")  # what the dev embeddings read
SKIP_KEYS = ("query_skip", "passage_skip")  # include_prompt=False: [CLS] and the prompt, not pooled
EVAL_KEYS = PAIR_KEYS + SKIP_KEYS + SCORE_MASK_KEYS[:2]  # the dev embeddings' inputs, where a split has them
TEXT_KEYS = ("query_ids", "query_mask")  # distill_mse: one text a row (its features have no passage)
NEGATIVE_KEYS = ("negative_ids", "negative_mask", "negative_present")
PACKED_KEYS = ROW_KEYS + SLOT_KEYS
# The real tokens, for tokens/s (packed: input_mask; a missing negative's prompt counts unpacked only).
MASK_KEYS = ("query_mask", "passage_mask", "negative_mask", "input_mask")


def batch_keys(features: dict) -> tuple:
    """The keys of a training batch that go to the devices (the hard negatives where the set has any; the
    teacher's targets and no passages for distill_mse; the prompt skips where the prompt is not pooled)."""
    skips = tuple(k for k in SKIP_KEYS if k in features)
    if "target" in features:
        return TEXT_KEYS + skips + ("target", "example_weight")
    keys = PAIR_KEYS + skips + ("score", "example_weight")
    keys += NEGATIVE_KEYS if "negative_ids" in features else ()
    keys += tuple(k for k in SCORE_MASK_KEYS if k in features)  # ColBERT: the tokens MaxSim scores
    return keys + (("teacher_scores",) if "teacher_scores" in features else ())


def embedder(settings, features: dict, hidden_size: int) -> dict:
    """heads.network's embedding (pooling.SentenceEmbedder's settings) of a contrastive task whose kind settings
    are `settings`; where the training features carry distill_mse's teacher embeddings (target [N, Dt]), the
    student checked to embed at the teacher's width."""
    if "target" in features:
        teacher_width, width = features["target"].shape[-1], settings.width(hidden_size)
        if width != teacher_width:
            raise ValueError(f"contrastive.teacher={settings.teacher} embeds in {teacher_width} features, the student "
                             f"in {width}: set contrastive.dense_features={teacher_width} (a Dense projection "
                             "to the teacher's width)")
    return settings.network()


def static_queries(net) -> bool:
    """Whether `net` embeds queries through SPLADE's static table (the inference-free variant)."""
    return isinstance(net, sparse.SpladeEncoder) and net.static_queries


def colbert(net) -> bool:
    """Whether `net` gives ColBERT's token vectors (multivector.ColbertEncoder) rather than a vector a text."""
    return isinstance(net, multivector.ColbertEncoder)


def embed(params, ids, mask, rng, *, net, deterministic: bool = False, skip=None, static: bool = False):
    """Embeddings [N, D] of N tokenized texts ids, mask [N, S] (one segment); skip [N]: leading tokens
    of each left out of pooling (None: all pooled). static: through SPLADE's static query table instead."""
    return net.apply({"params": params}, ids, jnp.zeros_like(ids), mask, deterministic=deterministic,
                     rngs=None if rng is None else {"dropout": rng}, prompt_lengths=skip,
                     **({"static": True} if static else {}))


def embed_tokens(params, ids, mask, score_mask, rng, *, net, deterministic: bool = False):
    """ColBERT's token vectors [N, S, D] of N texts ids, mask (attended), score_mask (scored) [N, S]; zero where
    score_mask is 0."""
    vectors, _ = net.apply({"params": params}, ids, jnp.zeros_like(ids), mask, score_mask,
                           deterministic=deterministic, rngs=None if rng is None else {"dropout": rng})
    return vectors


def gather_spans(rows, cls_positions, slot, score_mask):
    """Each packed text's token vectors [..., L, D] from its row's: the L positions from its slot's start on
    (its tokens, then whatever follows, which score_mask [..., L] leaves out). rows [R, W, D]; cls_positions
    [R, K]; slot [...] flat indices r * K + k."""
    num_rows, width, _ = rows.shape
    start = jnp.take(cls_positions.reshape(-1), slot)  # [...]
    row = slot // cls_positions.shape[1]
    positions = jnp.minimum(start[..., None] + jnp.arange(score_mask.shape[-1]), width - 1)  # [..., L]
    vectors = jnp.take(rows.reshape(num_rows * width, -1), row[..., None] * width + positions, axis=0)
    return jnp.where(score_mask[..., None] > 0, vectors, 0.0)


def embed_packed_tokens(params, batch: dict, rng, *, net, deterministic: bool = False) -> dict:
    """ColBERT's packed batch: the documents' token vectors gathered from their rows (gather_spans), the queries
    through the encoder one a row (bertjax/tasks/contrastive_batches.py says why), their dropout key
    fold_in(key, 0)."""
    packed = {k: batch[k] for k in ("sequence_ids", "position_ids", "cls_positions")}
    rows, _ = net.apply({"params": params}, batch["input_ids"], jnp.zeros_like(batch["input_ids"]),
                        batch["input_mask"], deterministic=deterministic,
                        rngs=None if rng is None else {"dropout": rng}, **packed)  # [R, W, D]
    out = {role: gather_spans(rows, batch["cls_positions"], batch[f"{role}_slot"], batch[f"{role}_score_mask"])
           for role in ROLES[1:] if f"{role}_slot" in batch}
    out["query"] = embed_tokens(params, batch["query_ids"], batch["query_mask"], batch["query_score_mask"],
                                None if rng is None else jax.random.fold_in(rng, 0), net=net,
                                deterministic=deterministic)
    return out


def embed_packed(params, batch: dict, rng, *, net, deterministic: bool = False) -> dict:
    """A packed batch's embeddings by role, gathered from the [R, K, D] of its rows. SPLADE's static query side
    reads the queries' slots of the same rows through its table (their pass through the encoder is unused:
    short texts, left in the rows so that packing need not know the model). ColBERT: embed_packed_tokens."""
    if colbert(net):
        return embed_packed_tokens(params, batch, rng, net=net, deterministic=deterministic)

    def rows_through(static: bool):
        packed = {k: batch[k] for k in ("sequence_ids", "position_ids", "cls_positions")}
        return net.apply({"params": params}, batch["input_ids"], jnp.zeros_like(batch["input_ids"]),
                         batch["input_mask"], deterministic=deterministic,
                         rngs=None if rng is None else {"dropout": rng}, prompt_lengths=batch.get("prompt_lengths"),
                         **packed, **({"static": True} if static else {}))

    rows = rows_through(False)
    flat = rows.reshape(-1, rows.shape[-1])  # [R K, D]
    out = {role: jnp.take(flat, batch[f"{role}_slot"], axis=0) for role in ROLES if f"{role}_slot" in batch}
    if static_queries(net):
        table = rows_through(True)
        out["query"] = jnp.take(table.reshape(-1, table.shape[-1]), batch["query_slot"], axis=0)
    return out


def embed_batch(params, batch: dict, rng, *, net, deterministic: bool = False) -> dict:
    """{"query" [B, D], "passage" [B, D] (where the batch has passages), "negative" [B, G, D] (where it has
    negatives)}, from an unpacked or a packed batch; ColBERT: token vectors, [B, Sq, D], [B, Sp, D] and
    [B, G, Sp, D]."""
    if "sequence_ids" in batch:
        return embed_packed(params, batch, rng, net=net, deterministic=deterministic)

    def texts(role: str, ids, mask, skip=None, static: bool = False):  # ids, mask [N, S]
        key = None if rng is None else jax.random.fold_in(rng, ROLES.index(role))
        if colbert(net):
            score_mask = batch[f"{role}_score_mask"].reshape(ids.shape)
            return embed_tokens(params, ids, mask, score_mask, key, net=net, deterministic=deterministic)
        return embed(params, ids, mask, key, net=net, deterministic=deterministic, skip=skip, static=static)

    out = {"query": texts("query", batch["query_ids"], batch["query_mask"], batch.get("query_skip"),
                          static_queries(net))}
    if "passage_ids" in batch:
        out["passage"] = texts("passage", batch["passage_ids"], batch["passage_mask"], batch.get("passage_skip"))
    if "negative_ids" in batch:
        ids, mask = batch["negative_ids"], batch["negative_mask"]  # [B, G, Sp]
        skip = batch.get("passage_skip")  # negatives carry the passage prompt
        skip = None if skip is None else jnp.repeat(skip, ids.shape[1])  # [B * G]
        flat = texts("negative", ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1]), skip)
        out["negative"] = flat.reshape(*ids.shape[:2], *flat.shape[1:])  # [B, G, D] (ColBERT: [B, G, Sp, D])
    return out


def _loss_inputs(batch: dict) -> dict:
    """What the loss reads of a batch besides the embeddings."""
    return {"negative_mask": batch.get("negative_present"), "score": batch.get("score"),
            "target": batch.get("target"), "teacher_scores": batch.get("teacher_scores")}


def batch_loss(embeddings: dict, batch: dict, *, net, settings: dict):
    """(loss, sums) of a batch's embeddings: contrastive_losses.embedding_loss, or for ColBERT's token vectors
    multivector_losses.embedding_loss with the batch's score masks. settings: that function's keywords."""
    if colbert(net):
        masks = {role: batch[f"{role}_score_mask"] for role in ROLES if f"{role}_score_mask" in batch}
        return multivector_losses.embedding_loss(embeddings, masks, batch.get("negative_present"),
                                                 batch.get("teacher_scores"), **settings)
    return contrastive_losses.embedding_loss(embeddings, _loss_inputs(batch), **settings)


def contrastive_loss(params, batch: dict, dropout_rng, *, net, settings: dict):
    """The loss of a batch, all of it at once: (loss, metric sums), as step.train_step takes it.
    settings: batch_loss's (loss, scale, symmetric, matryoshka_*, ...)."""
    return batch_loss(embed_batch(params, batch, dropout_rng, net=net), batch, net=net, settings=settings)


def pair_embeddings(params, batch: dict, *, net):
    """[B, 2, D]: each pair's query (or text) and passage (or text_pair) embedding, no dropout; [B, 1, D]
    where the batch has no passages (distill_mse: each text's); ColBERT: pair_token_vectors."""
    embeddings = embed_batch(params, {k: batch[k] for k in EVAL_KEYS if k in batch}, None, net=net,
                             deterministic=True)
    if colbert(net):
        return pair_token_vectors(embeddings, batch)
    return jnp.stack([embeddings[role] for role in ("query", "passage") if role in embeddings], axis=1)


def pair_token_vectors(embeddings: dict, batch: dict):
    """ColBERT's dev outputs, one array a pair: [B, Sq + Sp, D + 1], the query's token vectors then the
    passage's along the tokens, each token's score mask (0 or 1) after its D features (split_token_vectors
    takes it apart)."""
    with_mask = lambda role: jnp.concatenate(  # noqa: E731
        [embeddings[role], batch[f"{role}_score_mask"][..., None].astype(embeddings[role].dtype)], axis=-1)
    return jnp.concatenate([with_mask("query"), with_mask("passage")], axis=1)


def split_token_vectors(outputs, query_length: int) -> tuple:
    """pair_token_vectors' outputs [N, Sq + Sp, D + 1] (numpy) -> (queries [N, Sq, D], query_mask [N, Sq]
    bool, passages [N, Sp, D], passage_mask [N, Sp] bool)."""
    vectors, mask = outputs[..., :-1], outputs[..., -1] > 0.5
    return vectors[:, :query_length], mask[:, :query_length], vectors[:, query_length:], mask[:, query_length:]


# --------------------------------------------------------------------------------------------------
# GradCache
# --------------------------------------------------------------------------------------------------


def _strided(x, k: int):
    """[B, ...] -> [k, B/k, ...], microbatch c = rows c::k."""
    return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)


def _unstrided(x):
    """[k, m, ...] -> [k m, ...], the inverse of _strided."""
    return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])


def _chunks(batch: dict, k: int) -> dict:
    """[k, ...] microbatches of a batch's embedding inputs: pairs c::k (packed: rows c::k too, each text's
    slot index turned into its place among its microbatch's rows)."""
    out = {}
    for key, value in batch.items():
        if key in SLOT_KEYS:  # row r of the batch is row r // k of microbatch r % k
            per_row = batch["cls_positions"].shape[1]
            value = (value // per_row // k) * per_row + value % per_row
        out[key] = _strided(value, k)
    return out


def _chunk_embeddings(params, chunk: dict, c, rng, *, net, deterministic: bool):
    """embed_batch of microbatch c, its dropout keys fold_in(role key, c)."""
    return embed_batch(params, chunk, None if rng is None else jax.random.fold_in(rng, c), net=net,
                       deterministic=deterministic)


def embed_in_chunks(params, batch: dict, rng, *, net, num_chunks: int, deterministic: bool = False) -> dict:
    """embed_batch's embeddings computed microbatch by microbatch (GradCache's keys): what pass 1 computes,
    and a differentiable reference for the cached gradient."""
    chunks = _chunks(batch, num_chunks)
    per_chunk = jax.lax.map(lambda xs: _chunk_embeddings(params, xs[0], xs[1], rng, net=net,
                                                         deterministic=deterministic),
                            (chunks, jnp.arange(num_chunks)))
    return {role: _unstrided(value) for role, value in per_chunk.items()}


def cached_loss_and_grad(params, batch: dict, dropout_rng, *, net, settings: dict, microbatch: int):
    """((loss, sums), gradients) of contrastive_loss's loss over the whole batch, computed in microbatches
    of `microbatch` pairs (GradCache): the memory of one microbatch's activations, the whole batch's
    in-batch negatives."""
    inputs = {k: batch[k] for k in PAIR_KEYS + SKIP_KEYS + NEGATIVE_KEYS + PACKED_KEYS + SCORE_MASK_KEYS
              if k in batch}
    size = inputs["query_slot" if "query_slot" in inputs else "query_ids"].shape[0]  # pairs (not packed rows)
    if size % microbatch:
        raise ValueError(f"train.contrastive_microbatch={microbatch} must divide train.batch_size={size}")
    k = size // microbatch
    # Pass 1: every microbatch's embeddings, no gradient kept.
    embeddings = embed_in_chunks(jax.lax.stop_gradient(params), inputs, dropout_rng, net=net, num_chunks=k)
    loss_of = lambda e: batch_loss(e, batch, net=net, settings=settings)  # noqa: E731
    (loss, sums), embedding_grads = jax.value_and_grad(loss_of, has_aux=True)(embeddings)
    # Pass 2: each microbatch's forward again, its embeddings' gradients pulled back to the parameters.
    chunks = _chunks(inputs, k)
    chunk_grads = {role: _strided(g, k) for role, g in embedding_grads.items()}

    def add_chunk(total, xs):
        chunk, grads, c = xs
        _, pull_back = jax.vjp(lambda p: _chunk_embeddings(p, chunk, c, dropout_rng, net=net, deterministic=False),
                               params)
        return jax.tree_util.tree_map(jnp.add, total, pull_back(grads)[0]), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(add_chunk, zeros, (chunks, chunk_grads, jnp.arange(k)))
    return (loss, sums), grads


# --------------------------------------------------------------------------------------------------
# The jitted step
# --------------------------------------------------------------------------------------------------


def _losses(net, loss_settings: dict, microbatch: int) -> tuple:
    """(loss_fn, loss_and_grad_fn or None) of a contrastive step: all at once, or GradCache's microbatches."""
    loss = functools.partial(contrastive_loss, net=net, settings=loss_settings)
    if not microbatch:
        return loss, None
    return loss, functools.partial(cached_loss_and_grad, net=net, settings=loss_settings, microbatch=microbatch)


def warmed_up_train_step(state, batch: dict, dropout_key, *, net, tx, loss_settings: dict, warmup_steps: int,
                         microbatch: int):
    """step.train_step of SPLADE, its regularizer weighted by regularizer_warmup(state.step): the weight is
    traced from the state's step, so one compiled step serves the warmup and after."""
    weight = contrastive_losses.regularizer_warmup(state.step, warmup_steps)
    loss, loss_and_grad = _losses(net, dict(loss_settings, regularizer_weight=weight), microbatch)
    return steps.train_step(state, batch, dropout_key, loss_fn=loss, tx=tx, grad_accum_steps=1,
                            loss_and_grad_fn=loss_and_grad, mask_keys=MASK_KEYS)


def compile_train_step(setup, settings, data_sharding, microbatch: int = 0, num_steps: int = 0):
    """The train step of a contrastive task (setup: training.state.Setup of its embedder; settings: the kind's):
    its loss on the embeddings of the whole global batch, all at once (microbatch 0) or in cached
    microbatches of `microbatch` pairs (GradCache: the same gradient). SPLADE's regularizer warms up over
    contrastive.splade_warmup_fraction of the run's num_steps. Returns (state, batch, dropout_key) ->
    (state, sums)."""
    contrastive_losses.check_settings(settings.loss, settings.scale, settings.matryoshka_dims,
                                      settings.matryoshka_weights, settings.width(setup.net.config.hidden_size))
    # Queries may be longer than passages (the run checks data.max_seq_length against the positions itself).
    positions = setup.net.config.max_position_embeddings - setup.net.config.position_offset
    for key in ("colbert_query_length", "colbert_document_length") if settings.colbert else ():
        if getattr(settings, key) > positions:
            raise ValueError(f"contrastive.{key}={getattr(settings, key)} is longer than the {positions} positions "
                             f"of the model (its model.max_position_embeddings): at most {positions}")
    if not (settings.scored or settings.distill or settings.colbert) and settings.max_query_length > positions:
        raise ValueError(f"data.max_query_length={settings.max_query_length} is longer than the {positions} positions "
                         f"of the model (its model.max_position_embeddings): at most {positions}")
    if not settings.sparse:
        loss, loss_and_grad = _losses(setup.net, settings.loss_settings(), microbatch)
        return setup.compile_train_step(loss, data_sharding, 1, loss_and_grad_fn=loss_and_grad, mask_keys=MASK_KEYS)
    # As Setup.compile_train_step jits a step (the state's shardings, donated), the step's number read inside.
    warmup = contrastive_losses.regularizer_warmup_steps(num_steps, settings.splade_warmup_fraction)
    fn = functools.partial(warmed_up_train_step, net=setup.net, tx=setup.tx, loss_settings=settings.loss_settings(),
                           warmup_steps=warmup, microbatch=microbatch)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        return jax.jit(under_rules(fn, setup.rules), in_shardings=(setup.state_sharding, data_sharding, None),
                       out_shardings=(setup.state_sharding, None), donate_argnums=(0,))
