"""ColBERT (late interaction): one vector per token, and MaxSim between a query's and a document's vectors.

ColbertEncoder is BertModel (any family; the `bert` subtree of every head, so a pretraining checkpoint's
encoder starts it) + a dense projection of every token's output to D (128 by default; no bias, as
sentence-transformers' and Stanford ColBERT's projections) + L2 normalisation per token. Which tokens count
(the score mask) is the text side's business (bertjax/tasks/multivector_texts.py): padding is out, a query's
[MASK] expansion is in, a document's skiplist tokens are out; [CLS], [SEP] and the markers count.

MaxSim (Khattab & Zaharia 2020): score(q, d) = sum over q's scored tokens of the max over d's scored tokens
of the dot product. A document token out of the mask never wins a max (it is left out, not zeroed: a zeroed
token would beat real negative similarities), a query token out of the mask adds nothing, and a document
with no scored token scores EMPTY_SCORE, as sentence-transformers does. The all-pairs form scores
documents a chunk at a time under jax.checkpoint, so neither the forward nor the backward pass holds more
than one chunk's [Bq, C, Sq, Sd] similarities.

Shape legend: B texts, S tokens, H hidden size, D projection width, Bq queries, Bd documents, Sq and Sd
their tokens, N candidates per query, C documents per chunk.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models.layers import dense
from bertjax.models.pooling import normalize

PROJECTION = "projection"  # the projection's params: {"kernel": [H, D]}, beside the encoder's "bert"
DEFAULT_DIM = 128  # ColBERT's width (Khattab & Zaharia 2020), sentence-transformers' default
EMPTY_SCORE = -1e9  # a document with no scored token (sentence-transformers' fill): below every real one
# Elements of one chunk's [Bq, C, Sq, Sd] float32 similarities when maxsim picks C itself (256 MiB).
CHUNK_ELEMENTS = 1 << 26


class ColbertEncoder(nn.Module):
    """BertModel -> dense H -> D (no bias) per token -> L2 normalisation per token.

    Params {"bert": BertModel's, "projection": {"kernel" [H, D]}}. Returns (vectors [B, S, D] float32, zero
    where the mask is 0; mask [B, S] bool): score_mask [B, S] from the text side, or input_mask where none
    is given. A query's expansion positions are scored though input_mask may leave them out of attention
    (sentence-transformers' attend=False): every position's output is computed, attended or not.
    Packed rows (sequence_ids, position_ids [B, S], cls_positions [B, K] as BertModel takes them): each text
    of a row attends only to itself, and its vectors are the span of its tokens (the caller gathers them)."""

    config: BertConfig
    dim: int = DEFAULT_DIM

    @nn.compact
    def __call__(self, input_ids, segment_ids, input_mask, score_mask=None, deterministic: bool = True,
                 sequence_ids=None, position_ids=None, cls_positions=None):
        encoded = bert_model.BertModel(self.config, name="bert")(
            input_ids, segment_ids, input_mask, deterministic, sequence_ids=sequence_ids, position_ids=position_ids,
            cls_positions=cls_positions)
        projection = dense(self.config, self.dim, ("embed", None), PROJECTION, use_bias=False)
        vectors = normalize(projection(encoded["sequence_output"]))  # [B, S, D] float32
        mask = (input_mask if score_mask is None else score_mask) > 0  # [B, S]
        return jnp.where(mask[..., None], vectors, 0.0), mask


def with_trained_projection(params: dict, restored: dict) -> dict:
    """`params` (ColbertEncoder's, boxed as init gives them or plain) with the projection of `restored` (a
    checkpoint's params) where it has one; a pretraining checkpoint has none, and the fresh one stays. The
    encoder comes through heads.with_pretrained_encoder, as every head's does."""
    restored = nn.meta.unbox(restored)
    if set(restored) == {"params"}:  # a whole variables dict
        restored = restored["params"]
    if PROJECTION not in restored:
        return params
    kernel = restored[PROJECTION]["kernel"]
    leaf = params[PROJECTION]["kernel"]
    boxed = isinstance(leaf, nn.meta.AxisMetadata)
    check_projection(params, tuple(kernel.shape))
    return {**params, PROJECTION: {"kernel": leaf.replace_boxed(kernel) if boxed else kernel}}


def check_projection(params: dict, trained: tuple) -> None:
    """One line where a checkpoint's projection kernel, of shape `trained` (H, D), does not fit the projection
    of `params` (ColbertEncoder's: boxed, plain or shapes): a start (with_trained_projection) or a resume."""
    leaf = params[PROJECTION]["kernel"]
    shape = tuple((leaf.unbox() if isinstance(leaf, nn.meta.AxisMetadata) else leaf).shape)
    if tuple(trained) != shape:
        raise ValueError(f"the checkpoint's ColBERT projection maps {trained[0]} -> {trained[1]}, this "
                         f"model's {shape[0]} -> {shape[1]}: set the projection width to {trained[1]} "
                         "(contrastive.colbert_dim in fine-tuning), or start from the encoder alone (a fresh "
                         "projection)")


def _reduce(similarities, query_mask, doc_mask):
    """MaxSim from similarities [..., Sq, Sd] float32 and masks broadcasting to [..., Sq] and [..., Sd]."""
    left_out = jnp.finfo(jnp.float32).min  # finite: an empty document's sum stays a number (then replaced)
    best = jnp.max(jnp.where(doc_mask[..., None, :], similarities, left_out), axis=-1)  # [..., Sq]
    total = jnp.sum(jnp.where(query_mask, best, 0.0), axis=-1)  # [...]
    return jnp.where(jnp.any(doc_mask, axis=-1), total, EMPTY_SCORE)


def _dot(equation: str, a, b):
    # Full float32 precision (no TF32 on GPUs): scores agree with a float32 reference to rounding.
    return jnp.einsum(equation, a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def chunk_size_for(num_queries: int, query_tokens: int, doc_tokens: int, elements: int = CHUNK_ELEMENTS) -> int:
    """The documents a chunk of maxsim holds so that its [Bq, C, Sq, Sd] similarities stay within `elements`."""
    return max(1, elements // max(1, num_queries * query_tokens * doc_tokens))


def maxsim(query_vectors, query_mask, doc_vectors, doc_mask, *, chunk_size: int | None = None):
    """MaxSim of every query with every document: [Bq, Bd] float32 (in-batch scoring, search).

    input          shape / dtype     meaning
    query_vectors  [Bq, Sq, D]       the queries' token vectors (ColbertEncoder's)
    query_mask     [Bq, Sq] bool     the tokens that count
    doc_vectors    [Bd, Sd, D]       the documents' token vectors
    doc_mask       [Bd, Sd] bool     the tokens that count
    chunk_size: documents scored at a time (default: chunk_size_for's, 256 MiB of similarities).
    Example: scores = maxsim(q, q_mask, d, d_mask)  # scores[i, j]: query i, document j
    """
    num_queries, query_tokens, width = query_vectors.shape
    num_docs, doc_tokens, _ = doc_vectors.shape
    chunk = chunk_size or chunk_size_for(num_queries, query_tokens, doc_tokens)
    chunk = max(1, min(int(chunk), num_docs))
    chunks = -(-num_docs // chunk)
    pad = chunks * chunk - num_docs  # padded documents have no scored token: EMPTY_SCORE, then cut off
    docs = jnp.pad(doc_vectors, ((0, pad), (0, 0), (0, 0))).reshape(chunks, chunk, doc_tokens, width)
    masks = jnp.pad(doc_mask, ((0, pad), (0, 0))).reshape(chunks, chunk, doc_tokens)

    @jax.checkpoint  # the backward pass recomputes a chunk's similarities rather than keeping every chunk's
    def one_chunk(part):
        d, m = part  # [C, Sd, D], [C, Sd]
        return _reduce(_dot("qsh,cth->qcst", query_vectors, d), query_mask[:, None, :], m[None])  # [Bq, C]

    scores = jax.lax.map(one_chunk, (docs, masks))  # [chunks, Bq, C]
    return jnp.moveaxis(scores, 0, 1).reshape(num_queries, chunks * chunk)[:, :num_docs]


@jax.checkpoint  # as maxsim's chunks: [B, N, Sq, Sd] is not kept for the backward pass
def maxsim_candidates(query_vectors, query_mask, doc_vectors, doc_mask):
    """MaxSim of each query with its own N candidates: [B, N] float32 (distillation, reranking).

    input          shape / dtype     meaning
    query_vectors  [B, Sq, D]        the queries' token vectors
    query_mask     [B, Sq] bool      the tokens that count
    doc_vectors    [B, N, Sd, D]     query b's candidates' token vectors
    doc_mask       [B, N, Sd] bool   the tokens that count (a missing candidate: none, EMPTY_SCORE)
    Example: scores = maxsim_candidates(q, q_mask, docs, docs_mask)  # scores[b, n]
    """
    return _reduce(_dot("bsh,bnth->bnst", query_vectors, doc_vectors), query_mask[:, None, :], doc_mask)
