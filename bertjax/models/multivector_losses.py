"""ColBERT's training losses on MaxSim scores, as sentence-transformers' multi-vector losses compute them
(sentence_transformers.multi_vector_encoder.losses; pure, top level).

  mnrl        MultiVectorMultipleNegativesRankingLoss: for each query, cross-entropy of scale x MaxSim over
              every positive of the batch and every hard negative (target: its own positive). scale is
              1 / temperature, 1 by default: MaxSim is a sum over query tokens (up to Sq), not a cosine, so
              it needs no dense loss's 20 (PyLate's default too)
  distill_kl  MultiVectorDistillKLDivLoss: KL(softmax(teacher / Tt) || softmax(student / Ts)) over each
              query's candidates, the mean over queries, times Ts^2 (Hinton et al. 2015)
  margin_mse  MultiVectorMarginMSELoss: (s_pos - s_neg_j) against the teacher's (t_pos - t_neg_j), the mean
              over every margin (Hofstaetter et al. 2020)
The score-level KL and margin are bertjax/models/rerank_losses.py's (a reranker's are the same losses on
a cross-encoder's scores); only MaxSim in front of them is new here. embedding_loss picks one by name for
the contrastive step (contrastive.representation=colbert).

Shape legend: B queries (pairs), Sq and Sd query and document tokens, D vector width, G hard negatives per
pair, N candidates per query (distillation; the positive first for margin_mse).
"""

import jax
import jax.numpy as jnp

from bertjax.models import rerank_losses
from bertjax.models.multivector import maxsim, maxsim_candidates

LOSSES = ("mnrl", "distill_kl", "margin_mse")
TEACHER_LOSSES = ("distill_kl", "margin_mse")  # trained on a teacher's scores of each query's candidates
NEG_INF = -1e30  # the logit of a candidate that is not there (a row's missing hard negative)


def mnrl_loss(queries, query_mask, positives, positive_mask, negatives=None, negative_mask=None,
              negative_present=None, *, scale: float = 1.0):
    """MultiVectorMultipleNegativesRankingLoss: each query's cross-entropy over the batch's candidates.

    input             shape / dtype          meaning
    queries           [B, Sq, D] float       the queries' token vectors; query_mask [B, Sq] bool
    positives         [B, Sd, D] float       row b is query b's positive, every other query's negative;
                                             positive_mask [B, Sd] bool
    negatives         [B, G, Sd, D] or None  hard negatives, every one a candidate of every query;
                                             negative_mask [B, G, Sd] bool
    negative_present  [B, G] float or None   1 where row b has its g-th negative (None: all there)
    Returns (loss: a scalar, {"correct": queries ranking their own positive first, "count": B}).
    Example: loss, sums = mnrl_loss(q, q_mask, p, p_mask, n, n_mask, present, scale=1.0)
    """
    candidates, masks = positives, positive_mask
    valid = jnp.ones(positives.shape[0], bool)  # [C]
    if negatives is not None and negatives.shape[1] > 0:
        # Every first negative, then every second: the candidates' order does not change a softmax.
        width = negatives.shape[2:]
        candidates = jnp.concatenate([positives, jnp.swapaxes(negatives, 0, 1).reshape(-1, *width)])
        masks = jnp.concatenate([positive_mask, jnp.swapaxes(negative_mask, 0, 1).reshape(-1, width[0])])
        present = jnp.ones(negatives.shape[:2]) if negative_present is None else negative_present
        valid = jnp.concatenate([valid, jnp.swapaxes(present, 0, 1).reshape(-1) > 0])
    logits = scale * maxsim(queries, query_mask, candidates, masks)  # [B, C]
    logits = jnp.where(valid[None, :], logits, NEG_INF)
    rows = jnp.arange(queries.shape[0])
    loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[rows, rows])
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == rows).astype(jnp.float32)
    return loss, {"correct": correct, "count": jnp.float32(queries.shape[0])}


def distill_kl_loss(queries, query_mask, candidates, candidate_mask, teacher_scores, candidate_present=None, *,
                    temperature: float = 1.0, student_temperature: float | None = None,
                    teacher_temperature: float | None = None):
    """MultiVectorDistillKLDivLoss: the student's MaxSim distribution over each query's candidates against
    the teacher's.

    input              shape / dtype      meaning
    queries            [B, Sq, D] float   the queries' token vectors; query_mask [B, Sq] bool
    candidates         [B, N, Sd, D]      each query's candidates; candidate_mask [B, N, Sd] bool
    teacher_scores     [B, N] float       the teacher's score of each (query, candidate)
    candidate_present  [B, N] or None     1 for a real candidate (None: all real)
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = distill_kl_loss(q, q_mask, docs, docs_mask, teacher, temperature=1.0)
    """
    student = temperature if student_temperature is None else student_temperature
    teacher = temperature if teacher_temperature is None else teacher_temperature
    scores = maxsim_candidates(queries, query_mask, candidates, candidate_mask)  # [B, N]
    weights = jnp.ones_like(scores) if candidate_present is None else candidate_present.astype(jnp.float32)
    loss = rerank_losses.kl(scores / student, teacher_scores.astype(jnp.float32) / teacher, weights)
    return loss * student ** 2, {"count": jnp.float32(queries.shape[0])}


def margin_mse_loss(queries, query_mask, candidates, candidate_mask, teacher, candidate_present=None):
    """MultiVectorMarginMSELoss: the student's margins s_0 - s_j (candidate 0 the positive) against the
    teacher's.

    input              shape / dtype      meaning
    queries            [B, Sq, D] float   the queries' token vectors; query_mask [B, Sq] bool
    candidates         [B, 1+G, Sd, D]    the positive, then the hard negatives; candidate_mask [B, 1+G, Sd]
    teacher            [B, 1+G] float     the teacher's scores (positive first), or [B, G]: its margins
    candidate_present  [B, 1+G] or None   1 for a real candidate (None: all real)
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = margin_mse_loss(q, q_mask, docs, docs_mask, teacher_scores)
    """
    scores = maxsim_candidates(queries, query_mask, candidates, candidate_mask)  # [B, 1+G]
    teacher = teacher.astype(jnp.float32)
    if teacher.shape not in ((scores.shape[0], scores.shape[1]), (scores.shape[0], scores.shape[1] - 1)):
        raise ValueError(f"margin_mse teacher scores have the shape {teacher.shape}: [B, 1+G] = {scores.shape} "
                         f"(scores, the positive first) or [B, G] (margins) for {scores.shape[1]} candidates")
    if teacher.shape[1] == scores.shape[1] - 1:  # margins t_0 - t_j: as scores, 0 for the positive
        teacher = jnp.concatenate([jnp.zeros_like(teacher[:, :1]), -teacher], axis=1)
    weights = jnp.ones_like(scores) if candidate_present is None else candidate_present.astype(jnp.float32)
    return rerank_losses.margin_mse(scores, teacher, weights), {"count": jnp.float32(queries.shape[0])}


def embedding_loss(embeddings: dict, masks: dict, negative_present=None, teacher_scores=None, *, loss: str,
                   scale: float = 1.0, temperature: float = 1.0):
    """The loss named `loss` (one of LOSSES) of a contrastive batch's token vectors: what the contrastive
    step computes for contrastive.representation=colbert (bertjax/tasks/contrastive_steps.py).

    input                   shape / dtype          meaning
    embeddings["query"]     [B, Sq, D] float       the queries' token vectors; masks["query"] [B, Sq] the tokens
                                                   that count
    embeddings["passage"]   [B, Sd, D] float       the positives; masks["passage"] [B, Sd]
    embeddings["negative"]  [B, G, Sd, D] or none  the hard negatives; masks["negative"] [B, G, Sd]
    negative_present        [B, G] float or None   1 where row b has its g-th negative (None: all there)
    teacher_scores          [B, 1 + G] float       distill_kl, margin_mse: the teacher's score of the positive,
                                                   then of each negative
    scale: mnrl's; temperature: distill_kl's (both sides).
    Returns (loss: a scalar, the loss's sums: "count", and mnrl's "correct").
    Example: loss, sums = embedding_loss({"query": q, "passage": p}, {"query": qm, "passage": pm}, loss="mnrl")
    """
    queries, query_mask = embeddings["query"], masks["query"] > 0
    positives, positive_mask = embeddings["passage"], masks["passage"] > 0
    negatives = embeddings.get("negative")
    negative_mask = None if negatives is None else masks["negative"] > 0
    if loss == "mnrl":
        return mnrl_loss(queries, query_mask, positives, positive_mask, negatives, negative_mask, negative_present,
                         scale=scale)
    if negatives is None:
        raise ValueError(f"multi-vector loss {loss!r} compares each positive with hard negatives: the batch has none")
    # Each query's candidates: its positive, then its hard negatives.
    candidates = jnp.concatenate([positives[:, None], negatives], axis=1)  # [B, 1 + G, Sd, D]
    candidate_mask = jnp.concatenate([positive_mask[:, None], negative_mask], axis=1)  # [B, 1 + G, Sd]
    present = jnp.ones(negatives.shape[:2]) if negative_present is None else negative_present
    present = jnp.concatenate([jnp.ones_like(present[:, :1]), present], axis=1)  # [B, 1 + G]
    if loss == "distill_kl":
        return distill_kl_loss(queries, query_mask, candidates, candidate_mask, teacher_scores, present,
                               temperature=temperature)
    return margin_mse_loss(queries, query_mask, candidates, candidate_mask, teacher_scores, present)


def check_settings(loss: str, scale: float, temperature: float) -> None:
    """The loss settings as one line naming what to change."""
    if loss not in LOSSES:
        raise ValueError(f"multi-vector loss {loss!r}: choose one of {', '.join(LOSSES)}")
    if not scale > 0:
        raise ValueError(f"multi-vector scale={scale}: must be positive (1 is sentence-transformers' default)")
    if not 0 < temperature < float("inf"):
        raise ValueError(f"multi-vector temperature={temperature}: must be a positive finite number")
