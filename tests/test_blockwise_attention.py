"""model.attention_impl="blockwise": attention over tiles with the online softmax, in memory linear in S.

The reference is the XLA form (jax.nn.dot_product_attention with a dense mask): the function alone on
rows that are not a whole number of blocks (padding, packed sequences, a local window, a subset of query
rows), then whole networks (ModernBERT packed and scanned, where a traced flag picks the window; BERT on
padded rows), outputs and gradients; last, the compiled gradient's temporaries, which must grow with S
and not with S^2.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import synthetic
from bertjax.models import bert as bert_model
from bertjax.models.blockwise import blockwise_attention
from bertjax.models.config import BertConfig

SEQ, BLOCK, PREDICTIONS, VOCAB = 64, 24, 10, 64  # 64 rows: two whole blocks and a padded one
BASE = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=SEQ, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
MODERNBERT = dict(num_layers=3, position_embedding="rotary", activation="geglu", norm_placement="pre", use_bias=False,
                  type_vocab_size=0, local_attention_window=16, global_attention_every=2, rotary_theta=100.0,
                  global_rotary_theta=1000.0, pooler="gelu_norm", layer_norm_eps=1e-5)


def _close(got, want, rtol=3e-5):
    """Equal to float32 rounding: in each array the largest difference within rtol of its largest magnitude
    (or of 1e-3 of the largest in the tree, for arrays that are all but 0)."""
    got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    floor = 1e-3 * max(np.abs(np.asarray(b)).max() for b in want)
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a - b).max() <= rtol * max(np.abs(b).max(), floor), np.abs(a - b).max() / np.abs(b).max()


def _rows():
    """Segments and positions [2, SEQ]: row 0 three packed sequences and padding, row 1 one sequence and padding."""
    lengths = [(20, 27, 9), (45,)]
    segments, positions = np.zeros((2, SEQ), np.int32), np.zeros((2, SEQ), np.int32)
    for row, sequences in enumerate(lengths):
        start = 0
        for i, n in enumerate(sequences):
            segments[row, start:start + n], positions[row, start:start + n] = i + 1, np.arange(n)
            start += n
    return jnp.asarray(segments), jnp.asarray(positions)


@pytest.mark.parametrize("reach,subset,global_first", [(None, False, False), (5, True, False), (5, False, True)])
def test_blockwise_attention_equals_the_dense_mask(reach, subset, global_first):
    """Outputs at the real rows (padding's are 0) and the gradients of q, k and v: every query row with
    full attention, a subset of the rows in a window, every row in a window that each sequence's first
    token sees past and is seen past (Longformer's global [CLS])."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, SEQ, 2, 8)), jnp.float32) for _ in range(3))
    segments, positions = _rows()
    rows = jnp.broadcast_to(jnp.arange(SEQ), (2, SEQ))  # [2, Q] query rows
    if subset:
        rows = jnp.asarray(np.sort(rng.choice(SEQ, size=(2, 20), replace=False), axis=1))
    real = np.asarray(segments > 0)

    def dense(q, k, v, rows):
        q_seg, q_pos = (jnp.take_along_axis(a, rows, axis=1) for a in (segments, positions))
        allowed = (q_seg[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
        if reach is not None:
            near = jnp.abs(q_pos[:, :, None] - positions[:, None, :]) <= reach
            if global_first:
                near |= (q_pos[:, :, None] == 0) | (positions[:, None, :] == 0)
            allowed &= near
        return jax.nn.dot_product_attention(jnp.take_along_axis(q, rows[..., None, None], axis=1), k, v,
                                            mask=allowed[:, None], implementation="xla")

    def tiled(q, k, v, rows):
        q_seg, q_pos = (jnp.take_along_axis(a, rows, axis=1) for a in (segments, positions))
        return blockwise_attention(jnp.take_along_axis(q, rows[..., None, None], axis=1), k, v, q_seg, segments,
                                   q_pos, positions, reach=reach, block_size=BLOCK, global_first=global_first)

    keep = np.take_along_axis(real, np.asarray(rows), axis=1)[..., None, None]  # [2, Q, 1, 1]

    def loss(fn, q, k, v):
        out = fn(q, k, v, rows)
        return jnp.sum(jnp.where(keep, out, 0.0) * jnp.cos(out)), out

    both = jax.jit(lambda *a: [jax.value_and_grad(lambda *a, fn=fn: loss(fn, *a), (0, 1, 2), has_aux=True)(*a)
                               for fn in (tiled, dense)])  # one program: one compile
    ((_, got), grads), ((_, want), wanted) = both(q, k, v)
    _close(np.where(keep, got, 0.0), np.where(keep, want, 0.0))
    assert not np.asarray(got)[~keep[..., 0, 0]].any()  # padding sees no key
    _close(grads, wanted)


def _batch(cfg, packed: bool):
    batch = synthetic.synthetic_batch(0, batch_size=2, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                                      vocab_size=VOCAB, packed=packed, padded=not packed, max_sequences_per_row=4,
                                      mask_rate=0.15)
    if cfg.type_vocab_size < 2:
        batch["segment_ids"] = np.zeros_like(batch["segment_ids"])
    return batch


def _loss_and_grads(cfg, batch, packed: bool):
    """params -> the training loss (heads_only: the last layer at the rows the heads read) and its gradients."""
    net = bert_model.BertForPreTraining(cfg)
    extra = dict(sequence_ids=batch["sequence_ids"], position_ids=batch["position_ids"],
                 sentence_positions=batch["sentence_positions"]) if packed else {}
    objective = "none" if cfg.pooler == "gelu_norm" else "nsp"

    def loss(params):
        out = net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                        batch["masked_lm_positions"], deterministic=True, heads_only=True, **extra)
        return bert_model.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                           batch["masked_lm_weights"], batch["next_sentence_labels"], objective,
                                           batch.get("sentence_weights"))[0]

    return jax.value_and_grad(loss)


def _scanned(params, cfg):
    """Unrolled params in cfg's scanned layout."""
    return {**params, "bert": {**params["bert"], "encoder": bert_model.stack_layers(params["bert"]["encoder"], cfg)}}


@pytest.mark.parametrize("family,packed", [("modernbert", True), ("bert", False), ("modernbert_global_cls", True)])
def test_a_network_on_blockwise_attention_computes_what_it_computes_on_xla(family, packed):
    """ModernBERT on packed rows, scanned (its local layers picked by a traced flag), also with [CLS] global
    on the local layers; BERT on padded rows, unrolled: the loss and every parameter's gradient, against
    XLA's unrolled network."""
    options = dict(bert={}, modernbert=MODERNBERT, modernbert_global_cls=dict(MODERNBERT, global_cls=True))
    xla = BertConfig(**{**BASE, **options[family]})
    # Random values of the parameters' shapes: quicker than running the initializers, and no weight is
    # a plain 0 or 1 that could hide a difference.
    shapes = jax.eval_shape(bert_model.BertForPreTraining(xla).init, jax.random.PRNGKey(0),
                            **bert_model.dummy_batch(1, SEQ, PREDICTIONS))["params"]
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(0.2 * rng.standard_normal(a.shape), a.dtype),
                                    nn.meta.unbox(shapes))
    batch = _batch(xla, packed)
    tiled = dataclasses.replace(xla, attention_impl="blockwise", attention_block_size=BLOCK, scan_layers=packed)
    both = jax.jit(lambda p, q: (_loss_and_grads(tiled, batch, packed)(q), _loss_and_grads(xla, batch, packed)(p)))
    got, (loss, grads) = both(params, _scanned(params, tiled) if packed else params)  # one program: one compile
    _close(got, (loss, _scanned(grads, tiled)) if packed else (loss, grads))
    if xla.global_cls:  # the sequences are longer than the window: [CLS]'s reach changes the loss
        plain = jax.jit(_loss_and_grads(dataclasses.replace(xla, global_cls=False), batch, packed))(params)[0]
        assert abs(float(plain) - float(loss)) > 1e-4 * abs(float(loss)), (plain, loss)


def test_the_gradient_holds_tiles_not_the_score_matrix():
    """The compiled gradient's temporaries at S = 2048 and 4096 (block 256): under a quarter of one float32
    [B, N, S, S] array, and about doubling when S doubles (an [S, S] buffer would quadruple them)."""
    batch, heads, head_dim, block = 1, 2, 16, 256

    def temporaries(seq_len: int) -> int:
        rows = jax.ShapeDtypeStruct((batch, seq_len, heads, head_dim), jnp.float32)
        ids = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)

        def loss(q, k, v, segments, positions):
            return jnp.sum(blockwise_attention(q, k, v, segments, segments, positions, positions,
                                               block_size=block) ** 2)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(rows, rows, rows, ids, ids).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temporaries(2048), temporaries(4096)
    assert small < batch * heads * 2048 * 2048 * 4 / 4
    assert large < 3 * small


def test_blockwise_attention_has_no_attention_dropout():
    with pytest.raises(ValueError, match="attention_dropout_rate=0.0"):
        BertConfig(attention_impl="blockwise", attention_dropout_rate=0.1)
    with pytest.raises(ValueError, match="attention_block_size"):
        BertConfig(attention_impl="blockwise", attention_dropout_rate=0.0, attention_block_size=0)
