"""Contrastive losses on sentence embeddings (dense, or SPLADE's sparse vectors), as sentence-transformers
computes them (pure, top level).

  mnrl        MultipleNegativesRankingLoss / InfoNCE: for each query, cross-entropy of scale * similarity over
              every positive of the batch and every hard negative (target: its own positive); symmetric
              adds the passage -> query direction and averages the two (MultipleNegativesSymmetric-
              RankingLoss, partition_mode="per_direction"). The similarity is the cosine (dense) or the
              dot product (SPLADE: SparseMultipleNegativesRankingLoss, scale 1)
  cosent      CoSENT (Su 2022): log(1 + sum over pairs with score_i < score_j of
              exp(scale * (cos_i - cos_j))); only the order of the scores counts, so any range will do
  cosine_mse  (cos - score)^2 averaged (CosineSimilarityLoss): the scores are target cosines in [-1, 1]
  distill_mse the mean squared difference of each text's embedding and its teacher's (MSELoss, Reimers &
              Gurevych 2020): a student learns a teacher's embeddings, the targets computed beforehand
  margin_mse  the mean over (query, hard negative) of (dot(q, pos) - dot(q, neg) - the teacher's margin)^2
              (MarginMSELoss, SparseMarginMSELoss; Hofstaetter et al. 2020)
  kl          KL(teacher || student) of the softmax at temperature T over each query's positive and hard
              negatives by dot product, the sum over a query's candidates and the mean over queries, times
              T^2 (DistillKLDivLoss, SparseDistillKLDivLoss: T = 2)
Matryoshka (Kusupati et al. 2022; MatryoshkaLoss): the loss summed with weights at several widths, each
embedding truncated to its first d features and re-normalised.
SPLADE adds lambda_q * FLOPS(queries) + lambda_d * FLOPS(documents: positives and hard negatives together),
FLOPS = sum over the vocabulary of the batch-mean weight squared (Paria et al. 2020; SpladeLoss with
FlopsLoss), the lambdas warmed up quadratically over the first warmup steps
(SpladeRegularizerWeightSchedulerCallback): regularizer_warmup.

Under jit the arrays are the global batch, sharded over the mesh's data axes: the [B, C] similarity
matrix is the whole batch's, so every query meets every device's passages (XLA gathers the columns).

Shape legend: B batch (pairs), G hard negatives per pair, D embedding width (V for SPLADE's vocabulary),
C candidates (B + B*G).
"""

import jax
import jax.numpy as jnp

from bertjax.models.pooling import normalize

LOSSES = ("mnrl", "cosent", "cosine_mse", "distill_mse", "margin_mse", "kl")
SCORED = ("cosent", "cosine_mse")  # losses of scored pairs (text, text_pair, score)
DISTILL = "distill_mse"  # texts and their teacher's embeddings (target)
TEACHER = ("margin_mse", "kl")  # pairs with hard negatives and a teacher's score of each (teacher_scores)
SIMILARITIES = ("cosine", "dot")
NEG_INF = -1e30  # the logit of a candidate that is not there (a row's missing hard negative)


def cosine_matrix(a, b):
    """cos(a_i, b_j): [N, M] float32 from a [N, D] and b [M, D]."""
    return normalize(a) @ normalize(b).T


def similarity_matrix(a, b, similarity: str = "cosine"):
    """[N, M] float32: cos(a_i, b_j), or a_i . b_j (similarity="dot"), from a [N, D] and b [M, D]."""
    if similarity == "dot":
        return jnp.einsum("nd,md->nm", a, b, preferred_element_type=jnp.float32)
    return cosine_matrix(a, b)


def _cross_entropy_diagonal(logits):
    """Mean over rows of -log softmax(logits[i])[i]; logits [B, C], the target of row i is column i."""
    target = jnp.diagonal(logits[:, :logits.shape[0]])  # [B]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - target)


def mnrl_loss(queries, positives, negatives=None, negative_mask=None, *, scale: float = 20.0,
              symmetric: bool = False, similarity: str = "cosine"):
    """MultipleNegativesRankingLoss: each query's cross-entropy over the C candidates, the target its own
    positive; symmetric=True averages in each positive's cross-entropy over the B queries. similarity="dot"
    (SPLADE's sparse vectors): logit = scale x dot product, as SparseMultipleNegativesRankingLoss.

    input          shape / dtype        meaning
    queries        [B, D] float         the queries' embeddings (cosine: normalised here, logit = scale x cosine)
    positives      [B, D] float         row b is query b's positive and every other query's negative
    negatives      [B, G, D] or None    hard negatives, every one a candidate of every query
    negative_mask  [B, G] float         1 where row b has its g-th negative (given with negatives)
    Returns (loss: a scalar, {"correct": queries ranking their own positive first, "count": B}).
    Example: loss, sums = mnrl_loss(queries, positives, negatives, negative_mask, scale=20.0)
    """
    candidates = positives
    valid = jnp.ones(positives.shape[0], bool)  # [C]
    if negatives is not None and negatives.shape[1] > 0:
        # Column-major as sentence-transformers concatenates its columns: every first negative, then every second.
        candidates = jnp.concatenate([positives, jnp.swapaxes(negatives, 0, 1).reshape(-1, negatives.shape[-1])])
        valid = jnp.concatenate([valid, jnp.swapaxes(negative_mask, 0, 1).reshape(-1) > 0])
    logits = scale * similarity_matrix(queries, candidates, similarity)  # [B, C]
    logits = jnp.where(valid[None, :], logits, NEG_INF)
    loss = _cross_entropy_diagonal(logits)
    if symmetric:  # each positive against every query (the positives only, as sentence-transformers does)
        loss = (loss + _cross_entropy_diagonal(logits[:, :queries.shape[0]].T)) / 2
    ranked_first = jnp.sum(jnp.argmax(logits, axis=-1) == jnp.arange(queries.shape[0]))
    return loss, {"correct": ranked_first.astype(jnp.float32), "count": jnp.float32(queries.shape[0])}


def cosent_loss(a, b, scores, *, scale: float = 20.0):
    """CoSENTLoss: every pair scored lower than another should have the lower cosine.

    input   shape / dtype   meaning
    a, b    [B, D] float    the two texts' embeddings (text, text_pair), row by row
    scores  [B] float       the pairs' scores, any range: only their order counts
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = cosent_loss(a, b, scores, scale=20.0)
    """
    cos = scale * jnp.sum(normalize(a) * normalize(b), axis=-1)  # [B]
    differences = cos[:, None] - cos[None, :]  # [B, B]: (i, j) = s_i - s_j, penalised where score_i < score_j
    lower = scores[:, None] < scores[None, :]
    terms = jnp.where(lower, differences, NEG_INF).reshape(-1)
    loss = jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1), terms]))  # the 0 is log(1 + ...)'s 1
    return loss, {"count": jnp.float32(a.shape[0])}


def cosine_mse_loss(a, b, scores, *, scale: float = 20.0):
    """CosineSimilarityLoss: the mean of (cos(a_i, b_i) - score_i)^2 (scale is not used: a cosine is
    compared with the score as it is).

    input   shape / dtype   meaning
    a, b    [B, D] float    the two texts' embeddings (text, text_pair), row by row
    scores  [B] float       the target cosines, in [-1, 1]
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = cosine_mse_loss(a, b, scores)
    """
    cos = jnp.sum(normalize(a) * normalize(b), axis=-1)
    return jnp.mean(jnp.square(cos - scores)), {"count": jnp.float32(a.shape[0])}


def distill_mse_loss(student, target):
    """MSELoss: the mean over examples of the mean squared difference of student and target
    (nn.MSELoss's mean over every element: the same when every row has D features).

    input    shape / dtype   meaning
    student  [B, D] float    the student's embeddings of the texts
    target   [B, D] float    the teacher's embeddings of the same texts (or their target_text), computed beforehand
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = distill_mse_loss(student, target)
    """
    return jnp.mean(jnp.square(student - target)), {"count": jnp.float32(student.shape[0])}


def _candidate_scores(queries, positives, negatives):
    """[B, 1 + G] float32: each query's dot product with its positive, then with each of its hard negatives."""
    candidates = jnp.concatenate([positives[:, None], negatives], axis=1)  # [B, 1 + G, D]
    return jnp.einsum("bd,bcd->bc", queries, candidates, preferred_element_type=jnp.float32)


def margin_mse_loss(queries, positives, negatives, negative_mask, teacher_scores):
    """MarginMSELoss (SparseMarginMSELoss): the mean over each (query, hard negative) of the squared difference
    of the student's margin dot(q, pos) - dot(q, neg) and the teacher's.

    input           shape / dtype    meaning
    queries         [B, D] float     the queries' embeddings
    positives       [B, D] float     each query's positive
    negatives       [B, G, D] float  each query's hard negatives
    negative_mask   [B, G] float     1 where row b has its g-th negative
    teacher_scores  [B, 1 + G] float the teacher's score of the positive, then of each negative
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = margin_mse_loss(q, p, n, present, batch["teacher_scores"])
    """
    scores = _candidate_scores(queries, positives, negatives)  # [B, 1 + G]
    student = scores[:, :1] - scores[:, 1:]  # [B, G]
    teacher = teacher_scores[:, :1] - teacher_scores[:, 1:]
    mask = negative_mask.astype(jnp.float32)
    loss = jnp.sum(mask * jnp.square(student - teacher)) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss, {"count": jnp.float32(queries.shape[0])}


def kl_loss(queries, positives, negatives, negative_mask, teacher_scores, *, temperature: float = 2.0):
    """DistillKLDivLoss (SparseDistillKLDivLoss): KL(softmax(teacher / T) || softmax(student / T)) over each
    query's positive and present hard negatives, summed over them, the mean over queries, times T^2.
    Inputs as margin_mse_loss's; the student's scores are dot products.
    Returns (loss: a scalar, {"count": B}).
    Example: loss, sums = kl_loss(q, p, n, present, batch["teacher_scores"], temperature=2.0)
    """
    valid = jnp.concatenate([jnp.ones_like(negative_mask[:, :1]), negative_mask], axis=1) > 0  # [B, 1 + G]
    student = jnp.where(valid, _candidate_scores(queries, positives, negatives) / temperature, NEG_INF)
    teacher = jnp.where(valid, teacher_scores.astype(jnp.float32) / temperature, NEG_INF)
    log_student, log_teacher = jax.nn.log_softmax(student, axis=-1), jax.nn.log_softmax(teacher, axis=-1)
    terms = jnp.where(valid, jnp.exp(log_teacher) * (log_teacher - log_student), 0.0)
    return jnp.sum(terms) / queries.shape[0] * temperature ** 2, {"count": jnp.float32(queries.shape[0])}


def flops(embeddings, weights=None):
    """FLOPS (FlopsLoss): sum over the D features of the squared mean over the rows, of embeddings [N, D];
    weights [N] (1 for a real row, 0 for a missing hard negative) make it the mean over the real rows."""
    if weights is None:
        return jnp.sum(jnp.square(jnp.mean(embeddings.astype(jnp.float32), axis=0)))
    weights = weights.astype(jnp.float32)
    mean = jnp.einsum("n,nd->d", weights, embeddings.astype(jnp.float32)) / jnp.maximum(jnp.sum(weights), 1.0)
    return jnp.sum(jnp.square(mean))


def regularizer_warmup_steps(num_steps: int, fraction: float) -> int:
    """The steps over which SPLADE's regularizer weights grow to their lambdas: int(num_steps x fraction),
    at least 1, as SpladeRegularizerWeightSchedulerCallback counts them."""
    return max(1, int(num_steps * fraction))


def regularizer_warmup(step, warmup_steps: int):
    """The lambdas' factor at `step` (the steps done before this one, as the callback's global_step):
    (step / warmup_steps)^2 until warmup_steps, then 1."""
    ratio = jnp.asarray(step, jnp.float32) / warmup_steps
    return jnp.where(ratio >= 1.0, 1.0, jnp.square(ratio))


def sparse_regularizer(embeddings: dict, negative_mask, *, lambda_query: float, lambda_document: float):
    """lambda_query x FLOPS(queries) + lambda_document x FLOPS(documents): the positives and the present hard
    negatives together, as SpladeLoss regularizes every column after the first."""
    documents, weights = embeddings["passage"], None
    if "negative" in embeddings:
        negatives = embeddings["negative"]  # [B, G, D]
        documents = jnp.concatenate([documents, negatives.reshape(-1, negatives.shape[-1])])
        weights = jnp.concatenate([jnp.ones(negatives.shape[0], jnp.float32), negative_mask.reshape(-1)])
    return lambda_query * flops(embeddings["query"]) + lambda_document * flops(documents, weights)


def truncated(x, width: int):
    """The first `width` features of embeddings [..., D], re-normalised (a Matryoshka width)."""
    return normalize(x[..., :width])


def _loss_at_width(cut: dict, batch: dict, loss: str, scale: float, symmetric: bool, similarity: str,
                   temperature: float):
    """The chosen loss (no Matryoshka, no regularizer) of embeddings `cut` at one width: (value, sums)."""
    if loss == "mnrl":
        return mnrl_loss(cut["query"], cut["passage"], cut.get("negative"), batch.get("negative_mask"),
                         scale=scale, symmetric=symmetric, similarity=similarity)
    if loss == DISTILL:
        return distill_mse_loss(cut["query"], batch["target"])
    if loss == "cosent":
        return cosent_loss(cut["query"], cut["passage"], batch["score"], scale=scale)
    if loss == "cosine_mse":
        return cosine_mse_loss(cut["query"], cut["passage"], batch["score"])
    teacher = (cut["query"], cut["passage"], cut["negative"], batch["negative_mask"], batch["teacher_scores"])
    if loss == "margin_mse":
        return margin_mse_loss(*teacher)
    return kl_loss(*teacher, temperature=temperature)


def embedding_loss(embeddings: dict, batch: dict, *, loss: str, scale: float, symmetric: bool = False,
                   matryoshka_dims: tuple = (), matryoshka_weights: tuple = (), similarity: str = "cosine",
                   temperature: float = 2.0, lambda_query: float = 0.0, lambda_document: float = 0.0,
                   regularizer_weight=1.0):
    """The configured loss (`loss`, one of LOSSES) of a batch's embeddings; Matryoshka: summed over
    matryoshka_dims with their weights (1 each where none are given). similarity: mnrl's ("dot" for SPLADE);
    temperature: kl's. SPLADE: plus regularizer_weight x sparse_regularizer (lambda_query, lambda_document),
    regularizer_weight the warmup's factor at this step (regularizer_warmup; traced, so one compiled step).

    input                        shape / dtype       meaning
    embeddings["query"]          [B, D] float        queries, or the texts (scored pairs: text; distill_mse: the
                                                     student's)
    embeddings["passage"]        [B, D] float        positives, or text_pair (scored pairs); none for distill_mse
    embeddings["negative"]       [B, G, D] float     hard negatives (mnrl, where the batch has them; margin_mse, kl)
    batch["negative_mask"]       [B, G] float        1 where row b has its g-th negative (the batch's
                                                     negative_present)
    batch["score"]               [B] float           cosent, cosine_mse: each pair's score
    batch["target"]              [B, D] float        distill_mse: the teacher's embeddings
    batch["teacher_scores"]      [B, 1 + G] float    margin_mse, kl: the teacher's score of the positive, then of
                                                     each hard negative
    Returns (loss: a scalar, the chosen loss's sums ("count"; mnrl adds "correct") at the first width listed).
    Example: loss, sums = embedding_loss({"query": q, "passage": p}, {}, loss="mnrl", scale=20.0)
    """
    widths = tuple(matryoshka_dims) or (None,)
    weights = tuple(matryoshka_weights) or (1.0,) * len(widths)
    total, sums = 0.0, None
    for width, weight in zip(widths, weights):
        cut = {k: v if width is None else truncated(v, width) for k, v in embeddings.items()}
        value, found = _loss_at_width(cut, batch, loss, scale, symmetric, similarity, temperature)
        total = total + weight * value
        sums = found if sums is None else sums  # the metric sums of the full width (the first listed)
    if lambda_query or lambda_document:
        total = total + regularizer_weight * sparse_regularizer(
            embeddings, batch.get("negative_mask"), lambda_query=lambda_query, lambda_document=lambda_document)
    return total, sums


def check_settings(loss: str, scale: float, matryoshka_dims, matryoshka_weights, width: int | None = None) -> None:
    """The loss settings as one line naming the key to change."""
    if loss not in LOSSES:
        raise ValueError(f"contrastive.loss={loss!r}: choose one of {', '.join(LOSSES)}")
    if not scale > 0:
        raise ValueError(f"contrastive.scale={scale}: must be positive (20 is a temperature of 0.05)")
    dims = tuple(matryoshka_dims or ())
    if loss == DISTILL and dims:
        raise ValueError(f"contrastive.matryoshka_dims={dims}: contrastive.loss=distill_mse learns the teacher's "
                         "embeddings at their full width: set contrastive.matryoshka_dims=()")
    if any(not isinstance(d, int) or d < 1 for d in dims) or len(set(dims)) != len(dims):
        raise ValueError(f"contrastive.matryoshka_dims={dims}: distinct positive widths, e.g. (768, 512, 256)")
    if width is not None and any(d > width for d in dims):
        raise ValueError(f"contrastive.matryoshka_dims={dims}: the embeddings have {width} features")
    if matryoshka_weights and len(matryoshka_weights) != len(dims):
        raise ValueError(f"contrastive.matryoshka_weights={tuple(matryoshka_weights)}: one weight per width of "
                         f"contrastive.matryoshka_dims={dims}, or none (1 each)")
