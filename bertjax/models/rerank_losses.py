"""The losses of a reranker (a cross-encoder) over each query's candidates, as sentence-transformers'
CrossEncoder losses compute them (sentence_transformers.cross_encoder.losses), and KL distillation.

  name        the loss                                                        targets (labels)
  bce         binary cross-entropy of each pair's score, the mean over pairs  relevance in [0, 1]
  listnet     cross-entropy of softmax(scores) against softmax(targets) per   graded or continuous
              query, the mean over queries (Cao et al. 2007)                  relevance
  lambdaloss  LambdaLoss (Wang et al. 2018) with the NDCG-Loss2++ weights:    graded relevance
              -sum of w_ij log2 sigmoid(sigma (s_i - s_j)) over the pairs
              ranked i before j by the model whose targets say i > j (either
              within the top k), over their count
  ranknet     the same pairs, every w_ij = 1 (Burges et al. 2005)             graded relevance
  margin_mse  MSE of the margins (s_0 - s_j) against the teacher's (t_0 - t_j) teacher scores, the
              for every candidate j > 0, the first candidate the positive     positive first
              (Hofstaetter et al. 2020), the mean over margins
  kl          KL(softmax(t / T) || softmax(s / T)) per query, the mean over   teacher scores
              queries (listwise distillation; T: temperature)

input    shape / dtype   meaning
scores   [B, C] float    the model's score (logit) of each (query, candidate) pair
labels   [B, C] float    the targets above
weights  [B, C] float    1 for a real candidate, 0 for an empty slot (a query with fewer than C candidates,
                         or a padding query)
Each returns (loss: a float32 scalar, {"count": the queries with a candidate}). Empty slots take no part:
a query's loss is what sentence-transformers computes on its real candidates alone.

Shape legend: B queries, C candidate slots per query.
"""

import functools
import math

import jax
import jax.numpy as jnp
import optax

LOSSES = ("bce", "listnet", "lambdaloss", "ranknet", "margin_mse", "kl")
TEACHER_LOSSES = ("margin_mse", "kl")  # trained on a teacher's scores rather than relevance labels
_FAR = -1e16  # an empty slot's score where a softmax or a sort reads it (sentence-transformers' fill)


def _mean(values, weights):
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def bce(scores, labels, weights):
    """Binary cross-entropy with logits, the mean over real pairs (BinaryCrossEntropyLoss)."""
    return _mean(optax.sigmoid_binary_cross_entropy(scores, labels), weights)


def listnet(scores, labels, weights):
    """ListNet (ListNetLoss): per query -sum_j softmax(labels)_j log softmax(scores)_j over real candidates."""
    real = weights > 0
    target = jax.nn.softmax(jnp.where(real, labels, -jnp.inf), axis=-1, where=real)  # [B, C]
    log_p = jax.nn.log_softmax(jnp.where(real, scores, _FAR), axis=-1)
    per_query = -jnp.sum(jnp.where(real, target * log_p, 0.0), axis=-1)  # [B]
    return _mean(per_query, jnp.any(real, axis=-1).astype(jnp.float32))


def lambdaloss(scores, labels, weights, *, weighting: str = "ndcg2pp", k: int | None = None, sigma: float = 1.0,
               mu: float = 10.0, eps: float = 1e-10):
    """LambdaLoss (LambdaLoss with NDCGLoss2PPScheme; weighting="none" is RankNetLoss), binary logarithm."""
    real = weights > 0
    num = scores.shape[-1]
    k = k or num
    order = jnp.argsort(-jnp.where(real, scores, _FAR), axis=-1, stable=True)  # the model's ranking
    s_sorted = jnp.take_along_axis(jnp.where(real, scores, _FAR), order, axis=-1)  # [B, C]
    y_ranked = jnp.take_along_axis(jnp.where(real, labels, -jnp.inf), order, axis=-1)  # targets in that order
    y_ideal = -jnp.sort(-jnp.where(real, labels, -jnp.inf), axis=-1)  # targets best first

    diffs = y_ranked[:, :, None] - y_ranked[:, None, :]  # [B, C, C]
    pairs = jnp.isfinite(diffs) & (diffs > 0)  # real pairs the targets order i before j
    ranks = jnp.arange(num)
    pairs &= (ranks[:, None] < k) | (ranks[None, :] < k)  # either one within the top k

    discount = jnp.log2(2.0 + ranks)  # log2(1 + position), positions from 1
    ideal_dcg = jnp.sum(jnp.where(ranks < k, (2.0 ** jnp.maximum(y_ideal, 0.0) - 1.0) / discount, 0.0), axis=-1)
    gain = (2.0 ** jnp.maximum(y_ranked, 0.0) - 1.0) / jnp.maximum(ideal_dcg, eps)[:, None]  # [B, C]
    gain_gap = jnp.abs(gain[:, :, None] - gain[:, None, :])  # [B, C, C]
    if weighting == "ndcg2pp":
        # NDCG-Loss2: |1/D(|i-j|) - 1/D(|i-j|+1)| (D the discount at a 1-based position); LambdaRank:
        # |1/D(i) - 1/D(j)|. The weight is mu x the first + the second, each times the gains' gap.
        gap = jnp.abs(ranks[:, None] - ranks[None, :])
        # At gap 0 (the diagonal, never a pair) the discount at position 0 is taken as the last one's, as
        # a negative index reads it; the diagonal's weight is zeroed.
        before = jnp.where(gap > 0, discount[jnp.maximum(gap - 1, 0)], discount[-1])
        at = discount[jnp.minimum(gap, num - 1)]
        delta = jnp.where(gap > 0, jnp.abs(1.0 / before - 1.0 / at), 0.0)
        lambda_rank = jnp.abs(1.0 / discount[:, None] - 1.0 / discount[None, :])
        pair_weight = (mu * delta + lambda_rank)[None] * gain_gap
    elif weighting == "none":
        pair_weight = jnp.ones_like(gain_gap)
    else:
        raise ValueError(f"lambdaloss weighting {weighting!r}: ndcg2pp or none")
    score_diffs = jnp.clip(s_sorted[:, :, None] - s_sorted[:, None, :], -1e8, 1e8)
    losses = pair_weight * jax.nn.log_sigmoid(sigma * score_diffs) / math.log(2.0)
    return -jnp.sum(jnp.where(pairs, losses, 0.0)) / jnp.maximum(jnp.sum(pairs), 1)


def margin_mse(scores, labels, weights):
    """MarginMSELoss: the student's margins s_0 - s_j against the teacher's t_0 - t_j, j > 0 real."""
    margins = scores[:, :1] - scores[:, 1:]
    targets = labels[:, :1] - labels[:, 1:]
    real = weights[:, 1:] * weights[:, :1]
    return _mean(jnp.square(margins - targets), real)


def kl(scores, labels, weights, *, temperature: float = 1.0):
    """KL(teacher || student) of the softmax over each query's real candidates at `temperature`."""
    real = weights > 0
    log_p = jax.nn.log_softmax(jnp.where(real, scores / temperature, _FAR), axis=-1)
    log_t = jax.nn.log_softmax(jnp.where(real, labels / temperature, _FAR), axis=-1)
    per_query = jnp.sum(jnp.where(real, jnp.exp(log_t) * (log_t - log_p), 0.0), axis=-1)
    return _mean(per_query, jnp.any(real, axis=-1).astype(jnp.float32))


def rerank_loss(scores, labels, weights, *, name: str = "bce", k: int | None = None, sigma: float = 1.0,
                mu: float = 10.0, temperature: float = 1.0):
    """The loss `name` (LOSSES) of a batch's scores: (loss, {"count": queries with a real candidate}).
    k, sigma, mu: lambdaloss and ranknet; temperature: kl. The head's loss as heads.HEADS calls it."""
    scores, labels = scores.astype(jnp.float32), labels.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    losses = {"bce": bce, "listnet": listnet, "margin_mse": margin_mse,
              "lambdaloss": functools.partial(lambdaloss, weighting="ndcg2pp", k=k, sigma=sigma, mu=mu),
              "ranknet": functools.partial(lambdaloss, weighting="none", k=k, sigma=sigma),
              "kl": functools.partial(kl, temperature=temperature)}
    if name not in losses:
        raise ValueError(f"rerank.loss={name!r}: choose one of {', '.join(LOSSES)}")
    loss = losses[name](scores, labels, weights)
    return loss, {"count": jnp.sum(jnp.any(weights > 0, axis=-1))}
