"""Distillation: a trained teacher's outputs teach a smaller student.

General distillation is DistilBERT's recipe (Sanh et al. 2019): the student learns the teacher's masked-LM
distribution at a temperature, the masked-LM labels, and the direction of the teacher's last hidden
states. Task distillation (Hinton et al. 2015) mixes a fine-tuned teacher's softened logits with the gold
labels. Either adds the intermediate-layer losses (LayerLosses): TinyBERT's (Jiao et al. 2020) embedding,
hidden-state and attention-score MSEs, with learned projections where the student is narrower, and
BERT-PKD's (Sun et al. 2019) normalised [CLS] states. Here: the losses, the student made from a subset of
the teacher's layers, and the train step
that takes the teacher's parameters as an argument of the one jitted step (so they are sharded like the
student's, never trained and never saved in the student's checkpoints). The programs load the teacher
(bertjax.init_from) and pass it in.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from etils import epath

from bertjax.models import attention as model_attention, bert, heads
from bertjax.tasks.steps import INPUT_KEYS, LAYER_LOSS_METRICS, PACKED_INPUT_KEYS, task_loss

from bertjax.compression.projections import PROJECTIONS, project, without_projections
from bertjax.models.config import BertConfig, field_names, alternates
from bertjax.training import pretraining_step, sharding
from bertjax.training import step as steps
from bertjax.training.state import under_rules

# Logged by the general distillation step, as means over the batch (a step of k microbatches: their mean).
DISTILL_METRICS = ("ce_loss", "cos_loss")
# The task kinds task distillation supports: logits over classes (per example, choice or token) and a value.
TASK_KINDS = ("classification", "multiple_choice", "tagging", "regression")
# What distill.layer_map names: TinyBERT's uniform g(m) = m N / M (= PKD-skip), PKD-last; or a tuple.
LAYER_MAPS = ("uniform", "skip", "last")
# TinyBERT's published code zeroes attention scores at or below this before the MSE: the masked keys.
MASKED_SCORE = -1e2
SOFT_LOSSES = ("kl", "mse")  # task distillation's: soft_cross_entropy (Hinton et al.), logit_mse (Tang et al.)


# --------------------------------------------------------------------------------------------------
# Losses: pure, top level
# --------------------------------------------------------------------------------------------------


def _weighted_mean(values, weights):
    count = jnp.sum(weights)
    return jnp.sum(weights * values) / jnp.maximum(count, 1e-12)


def soft_cross_entropy(student_logits, teacher_logits, weights, temperature: float):
    """T^2 x KL(softmax(teacher / T) || softmax(student / T)), the mean over the weighted rows; T = temperature.

    input           shape / dtype    meaning
    student_logits  [..., V] float   the student's logits (V: the vocabulary, or the task's classes)
    teacher_logits  [..., V] float   the teacher's, at the same rows
    weights         [...] float      1 for a real row, 0 for padding
    Returns a float32 scalar. The KL is the soft cross-entropy less the teacher's entropy, which does not
    depend on the student: the same gradient, and 0 where the student matches (DistilBERT's loss_ce, torch's
    kl_div "batchmean" over the selected rows). T^2 keeps the gradient's scale independent of T (Hinton et al.).
    Example: ce = soft_cross_entropy(student_logits, teacher_logits, batch["masked_lm_weights"], 2.0)
    """
    t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = jnp.sum(jnp.exp(t) * (t - s), axis=-1)  # [...]
    return temperature ** 2 * _weighted_mean(kl, weights.astype(jnp.float32))


def logit_mse(student_logits, teacher_logits, weights):
    """||z_teacher - z_student||^2 per row, summed over the K logits (Tang et al. 2019, eq. 2; torch's MSELoss
    is this / K), the mean over the weighted rows: a float32 scalar. One logit (regression): the squared difference.
    student_logits, teacher_logits [..., K] float; weights [...] float, 1 for a real row, 0 for padding.
    Example: mse = logit_mse(logits, teacher_logits, batch["example_weight"])
    """
    diff = student_logits.astype(jnp.float32) - teacher_logits.astype(jnp.float32)
    return _weighted_mean(jnp.sum(jnp.square(diff), axis=-1), weights.astype(jnp.float32))


def cosine_loss(student_hidden, teacher_hidden, mask, eps: float = 1e-8):
    """1 - cos(student, teacher) per token, the mean over the real tokens: DistilBERT's CosineEmbeddingLoss
    with target 1; eps as torch's: cos = x.y / sqrt((|x|^2 + eps)(|y|^2 + eps)).

    input           shape / dtype     meaning
    student_hidden  [B, S, H] float   the student's last hidden states (sequence_output), the teacher's width
    teacher_hidden  [B, S, H] float   the teacher's
    mask            [B, S] int        1 for a real token, 0 for padding (input_mask)
    Returns a float32 scalar.
    Example: cos = cosine_loss(student["sequence_output"], teacher["sequence_output"], batch["input_mask"])
    """
    s, t = student_hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32)
    cos = jnp.sum(s * t, -1) / jnp.sqrt((jnp.sum(s * s, -1) + eps) * (jnp.sum(t * t, -1) + eps))  # [B, S]
    return _weighted_mean(1.0 - cos, mask.astype(jnp.float32))


# Shape legend (the intermediate-layer losses): B batch, S sequence, H the teacher's hidden size, H' the
# student's, N heads, M student layers, K the layers a loss compares.


def hidden_mse(student_hidden, teacher_hidden, mask):
    """The mean squared difference over the real tokens and the features: TinyBERT's MSE of one pair of
    layers (the embeddings', or student layer m's against teacher layer g(m)). The published code averages
    over padding too; here padding, whose states nothing reads, is left out, as the cosine does.

    input           shape / dtype     meaning
    student_hidden  [B, S, H] float   the student's states, already projected to the teacher's width H
    teacher_hidden  [B, S, H] float   the teacher's
    mask            [B, S]            1 for a real token, 0 for padding
    Returns a float32 scalar.
    Example: mse = hidden_mse(project(w_h, student_states[m]), teacher_states[g[m - 1]], batch["input_mask"])
    """
    s, t = student_hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32)
    per_token = jnp.mean(jnp.square(s - t), axis=-1)  # [B, S]
    return _weighted_mean(per_token, mask.astype(jnp.float32))


def attention_mse(student_scores, teacher_scores):
    """(1/N) sum over heads of MSE(A_S, A_T) of one pair of layers, on the scores before softmax, as
    TinyBERT: the mean over every entry after zeroing the entries <= -1e2 in each.

    input           shape / dtype         meaning
    student_scores  [B, N, S, S] float    student layer m's attention scores before softmax
    teacher_scores  [B, N, S, S] float    teacher layer g(m)'s (the same N heads)
    Returns a float32 scalar.
    Example: mse = attention_mse(student_scores[m - 1], teacher_scores[g[m - 1] - 1])

    Why zero them, as the published task_distill.py/general_distill.py do: those entries are the keys the
    mask hides (the model puts float32's lowest value there), the same in both models and never attended,
    so they must add nothing; their raw difference (-3.4e38 against -3.4e38) would be 0 or, once either is
    scaled or rounded, inf. Zeroed, each is exactly 0 and the mean keeps the published divisor
    (B N S S), so the published loss weights carry over."""
    s = jnp.where(student_scores <= MASKED_SCORE, 0.0, student_scores.astype(jnp.float32))
    t = jnp.where(teacher_scores <= MASKED_SCORE, 0.0, teacher_scores.astype(jnp.float32))
    return jnp.mean(jnp.square(s - t))


def pkd_loss(student_cls, teacher_cls, weights, eps: float = 1e-12):
    """BERT-PKD's patient loss: sum over the compared layers of ||h_s/||h_s||_2 - h_t/||h_t||_2||^2 on the
    [CLS] states, the mean over the weighted examples; eps keeps a zero vector's norm finite (torch's normalize).

    input        shape / dtype     meaning
    student_cls  [K, B, H] float   the student's [CLS] state at each of the K compared layers
    teacher_cls  [K, B, H] float   the teacher's, at the layers g maps them to
    weights      [B] float         1 for a real example, 0 for padding
    Returns a float32 scalar.
    Example: loss = pkd_loss(student_cls, teacher_cls, batch["example_weight"])
    """
    s, t = student_cls.astype(jnp.float32), teacher_cls.astype(jnp.float32)
    s = s / jnp.maximum(jnp.linalg.norm(s, axis=-1, keepdims=True), eps)
    t = t / jnp.maximum(jnp.linalg.norm(t, axis=-1, keepdims=True), eps)
    per_example = jnp.sum(jnp.square(s - t), axis=(0, 2))  # [B]: summed over layers and features
    return _weighted_mean(per_example, weights.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class LayerLosses:
    """The intermediate-layer losses' weights (all 0: none, today's distillation), read from the distill
    section: alpha_embedding x MSE(E_S W_e, E_T) + alpha_hidden x sum_m MSE(H_S^m W_h, H_T^g(m)) +
    alpha_attention x sum_m attention_mse(A_S^m, A_T^g(m)) + alpha_pkd x pkd_loss over the student's first
    M - 1 layers. layer_map names g: "uniform" (TinyBERT: g(m) = m N / M), "skip" (PKD-skip: the same
    every-k-th layers), "last" (PKD-last: g(m) = N - M + m), or a tuple of M teacher layers (1-indexed)."""

    alpha_embedding: float = 0.0
    alpha_hidden: float = 0.0
    alpha_attention: float = 0.0
    alpha_pkd: float = 0.0
    layer_map: str | tuple = "uniform"

    def __post_init__(self):
        negative = [f"distill.{f}={getattr(self, f)}" for f in self.alphas() if getattr(self, f) < 0]
        if negative:
            raise ValueError(f"{', '.join(negative)}: the loss weights must be >= 0")
        if isinstance(self.layer_map, str) and self.layer_map not in LAYER_MAPS:
            raise ValueError(f"distill.layer_map={self.layer_map!r}: choose {', '.join(LAYER_MAPS)} or a tuple of "
                             "the teacher's layers (1-indexed), one per student layer")

    @staticmethod
    def alphas() -> tuple:
        return ("alpha_embedding", "alpha_hidden", "alpha_attention", "alpha_pkd")

    @classmethod
    def from_config(cls, section) -> "LayerLosses":
        """The distill section's keys (absent in an older config: 0, "uniform")."""
        layer_map = section.get("layer_map", "uniform")
        layer_map = layer_map if isinstance(layer_map, str) else tuple(int(j) for j in layer_map)
        return cls(**{k: float(section.get(k, 0.0)) for k in cls.alphas()}, layer_map=layer_map)

    @property
    def on(self) -> bool:
        return any(getattr(self, f) > 0 for f in self.alphas())

    def metrics(self) -> tuple:
        """The logged losses: those weighed."""
        return tuple(name for name, f in zip(LAYER_LOSS_METRICS, self.alphas()) if getattr(self, f) > 0)

    def collections(self) -> tuple:
        """What the models must record (bert.HIDDEN_STATES, bert.ATTENTION_SCORES) for these losses."""
        hidden = self.alpha_embedding > 0 or self.alpha_hidden > 0 or self.alpha_pkd > 0
        return (bert.HIDDEN_STATES,) * hidden + (bert.ATTENTION_SCORES,) * (self.alpha_attention > 0)


def teacher_layer_map(layer_map, student_layers: int, teacher_layers: int) -> tuple:
    """g(1) .. g(M): the teacher layer (1-indexed; 0 is the embeddings) each student layer learns from.
    12 -> 6: uniform/skip (2, 4, 6, 8, 10, 12), last (7, 8, 9, 10, 11, 12); PKD reads the first M - 1."""
    m, n = student_layers, teacher_layers
    if not isinstance(layer_map, str):
        layer_map = tuple(layer_map)
        if len(layer_map) != m or not all(1 <= j <= n for j in layer_map) or list(layer_map) != sorted(set(layer_map)):
            raise ValueError(f"distill.layer_map={layer_map}: give {m} increasing teacher layers in 1..{n}, one per "
                             "student layer (or uniform, skip, last)")
        return layer_map
    if m > n:
        raise ValueError(f"distill.layer_map={layer_map!r}: the student has {m} layers, the teacher only {n}: give a "
                         "tuple of teacher layers, one per student layer")
    if layer_map == "last":
        return tuple(n - m + i for i in range(1, m + 1))
    if n % m:
        raise ValueError(f"distill.layer_map={layer_map!r} takes every {n}/{m}-th teacher layer, not a whole number: "
                         f"give a tuple of {m} teacher layers in 1..{n}")
    return tuple(i * n // m for i in range(1, m + 1))


def projection_names(settings: LayerLosses, student: BertConfig, teacher: BertConfig) -> tuple:
    """The projections a student narrower than its teacher learns: "embedding" (W_e) and "hidden" (W_h,
    one for every layer, as in the paper), each where its loss is weighed. () at the same width."""
    if student.hidden_size == teacher.hidden_size:
        return ()
    return tuple(name for name, alpha in (("embedding", settings.alpha_embedding), ("hidden", settings.alpha_hidden))
                 if alpha > 0)


def check_layer_losses(settings: LayerLosses, student: BertConfig, teacher: BertConfig) -> tuple:
    """The intermediate-layer losses against the two models, one line per thing to change; returns g."""
    if not settings.on:
        return ()
    g = teacher_layer_map(settings.layer_map, student.num_layers, teacher.num_layers)
    if settings.alpha_attention > 0:
        model_attention.check_scores_available(student.attention_impl)
        s_heads = {student.heads_of(i) for i in range(student.num_layers)}
        t_heads = {teacher.heads_of(j - 1) for j in g}
        if s_heads != t_heads or len(s_heads) != 1:
            raise ValueError(f"distill.alpha_attention={settings.alpha_attention} compares heads one to one, but the "
                             f"student has {sorted(s_heads)} heads and the teacher's layers {sorted(t_heads)}: set "
                             "model.num_heads to the teacher's, or distill.alpha_attention=0")
    if settings.alpha_pkd > 0 and student.hidden_size != teacher.hidden_size:
        raise ValueError(f"distill.alpha_pkd={settings.alpha_pkd} compares [CLS] states of one width, but the "
                         f"student's hidden_size {student.hidden_size} is not the teacher's {teacher.hidden_size}: set "
                         "distill.alpha_pkd=0, or distil a student of the teacher's width")
    if student.hidden_size > teacher.hidden_size and (settings.alpha_embedding > 0 or settings.alpha_hidden > 0):
        raise ValueError(f"distill.alpha_embedding/alpha_hidden project a narrower student to the teacher's width, but "
                         f"the student's hidden_size {student.hidden_size} exceeds the teacher's "
                         f"{teacher.hidden_size}: make the student narrower, or set both to 0")
    return g


def recorded(variables: dict, collection: str) -> tuple:
    """The per-layer arrays BertModel recorded in `collection` (wherever a head put it: under "bert")."""
    if collection not in variables:
        return ()
    return variables[collection]["bert"]["layers"][0]


def layer_losses(settings: LayerLosses, g: tuple, student: dict, teacher: dict, mask, example_weights,
                 projections: dict | None):
    """(the weighted sum, {metric: loss}) of the intermediate-layer losses. student, teacher: the recorded
    collections ({bert.HIDDEN_STATES: M+1 x [B, S, H'] (N+1 for the teacher), bert.ATTENTION_SCORES: M x
    [B, N, S, S]}); g: teacher_layer_map's; mask [B, S]; example_weights [B]; projections: {"embedding",
    "hidden"} where the student is narrower."""
    projections = projections or {}
    total, out = jnp.float32(0.0), {}
    s_hidden, t_hidden = recorded(student, bert.HIDDEN_STATES), recorded(teacher, bert.HIDDEN_STATES)
    if settings.alpha_embedding > 0:
        out["embedding_loss"] = hidden_mse(project(projections.get("embedding"), s_hidden[0]), t_hidden[0], mask)
        total = total + settings.alpha_embedding * out["embedding_loss"]
    if settings.alpha_hidden > 0:
        w = projections.get("hidden")
        out["hidden_loss"] = sum(hidden_mse(project(w, s_hidden[m]), t_hidden[j], mask) for m, j in enumerate(g, 1))
        total = total + settings.alpha_hidden * out["hidden_loss"]
    if settings.alpha_attention > 0:
        s_scores, t_scores = recorded(student, bert.ATTENTION_SCORES), recorded(teacher, bert.ATTENTION_SCORES)
        out["attention_loss"] = sum(attention_mse(s_scores[m - 1], t_scores[j - 1]) for m, j in enumerate(g, 1))
        total = total + settings.alpha_attention * out["attention_loss"]
    if settings.alpha_pkd > 0:
        pairs = list(enumerate(g[:-1], 1))  # the top layer is the prediction loss's
        if pairs:
            s_cls = jnp.stack([s_hidden[m][:, 0] for m, _ in pairs])  # [K, B, H]: [CLS], the first token
            t_cls = jnp.stack([t_hidden[j][:, 0] for _, j in pairs])
            out["pkd_loss"] = pkd_loss(s_cls, t_cls, example_weights)
        else:  # a one-layer student has no intermediate layer
            out["pkd_loss"] = jnp.float32(0.0)
        total = total + settings.alpha_pkd * out["pkd_loss"]
    return total, out


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """General distillation's loss: alpha_ce x soft CE (at temperature) + alpha_mlm x masked LM +
    alpha_cos x cosine + alpha_nsp x the sentence task (data.objective's) + the intermediate-layer losses
    (`layers`, TinyBERT's and BERT-PKD's)."""

    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha_nsp: float = 0.0
    layers: LayerLosses = LayerLosses()

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"distill.temperature={self.temperature} must be positive (DistilBERT: 2.0)")
        alphas = {f"distill.{f}": getattr(self, f) for f in ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_nsp")}
        negative = [f"{k}={v}" for k, v in alphas.items() if v < 0]
        if negative or not (any(alphas.values()) or self.layers.on):
            raise ValueError(f"{', '.join(negative) or 'every distill.alpha_* is 0'}: the loss weights must be >= 0 "
                             "and not all 0")

    def mean_metrics(self, objective: str) -> tuple:
        """The metrics the loss returns as means (train_step averages them over microbatches)."""
        return (("mlm_loss",) + DISTILL_METRICS + ((f"{objective}_loss",) if self.alpha_nsp > 0 else ())
                + self.layers.metrics())


def check_objective(weights: LossWeights, objective: str) -> None:
    if weights.alpha_nsp > 0 and objective == "none":
        raise ValueError(f"distill.alpha_nsp={weights.alpha_nsp} weighs a sentence task, but data.objective='none' "
                         "has none: set data.objective=nsp (or sop), or distill.alpha_nsp=0")


def _forward_recording(net, params, batch, deterministic: bool, rngs, heads_only: bool, collections: tuple):
    """pretraining_step.forward, and the collections the model recorded ({} when none is asked for)."""
    if not collections:
        return pretraining_step.forward(net, params, batch, deterministic, rngs, heads_only=heads_only), {}
    return pretraining_step.forward(net, params, batch, deterministic, rngs, heads_only=heads_only,
                                    mutable=collections)


def pretraining_distillation_loss(params, batch, dropout_rng, teacher_params, *, net, teacher_net,
                                  weights: LossWeights, objective: str, layer_map: tuple = ()):
    """General distillation's loss on a pretraining batch: (loss, metric sums) as step.train_step takes it.

    input           shape / dtype   meaning
    params          pytree          the student's params (with its PROJECTIONS where it is narrower)
    batch           dict            input_ids, segment_ids, input_mask [B, S]; masked_lm_positions,
                                    masked_lm_ids, masked_lm_weights [B, P]; next_sentence_labels [B]
    teacher_params  pytree          the teacher's params (no gradient, no dropout)
    weights         LossWeights     the alphas and the temperature (layer_map: check_layer_losses' g)
    Returns (loss: a float32 scalar, metrics): pretraining_loss's (the sentence task's only where alpha_nsp
    > 0) plus ce_loss, cos_loss and the weighed layer losses (means).
    Example: loss, m = pretraining_distillation_loss(p, b, key, tp, net=s, teacher_net=t, weights=w, objective="nsp")
    The soft CE is taken where the masked-LM loss is, at the masked positions (DistilBERT's choice; the
    heads then run at P positions, not S). The cosine and the intermediate-layer losses read every real
    token, so with them both models run their last block at all positions."""
    hidden = weights.alpha_cos > 0 or weights.layers.on
    collections = weights.layers.collections()
    projections = params.get(PROJECTIONS)
    params = without_projections(params)
    student, s_recorded = _forward_recording(net, params, batch, False, {"dropout": dropout_rng}, not hidden,
                                             collections)
    teacher, t_recorded = jax.lax.stop_gradient(_forward_recording(teacher_net, teacher_params, batch, True, None,
                                                                   not hidden, collections))
    sentence = objective if weights.alpha_nsp > 0 else "none"  # the sentence head is dropped unless weighed
    _, sums = bert.pretraining_loss(student["mlm_logits"], student.get("nsp_logits"), batch["masked_lm_ids"],
                                    batch["masked_lm_weights"], batch["next_sentence_labels"], objective=sentence,
                                    sentence_weights=batch.get("sentence_weights"))
    ce = soft_cross_entropy(student["mlm_logits"], teacher["mlm_logits"], batch["masked_lm_weights"],
                            weights.temperature)
    cos = (cosine_loss(student["sequence_output"], teacher["sequence_output"], batch["input_mask"])
           if weights.alpha_cos > 0 else jnp.float32(0.0))
    loss = weights.alpha_ce * ce + weights.alpha_mlm * sums["mlm_loss"] + weights.alpha_cos * cos
    if weights.alpha_nsp > 0:
        loss = loss + weights.alpha_nsp * sums[f"{objective}_loss"]
    extra = {}
    if weights.layers.on:
        layered, extra = layer_losses(weights.layers, layer_map, s_recorded, t_recorded, batch["input_mask"],
                                      jnp.ones(batch["input_ids"].shape[:1], jnp.float32), projections)
        loss = loss + layered
    return loss, dict(sums, ce_loss=ce, cos_loss=cos, **extra)


def summarize(window: dict) -> dict:
    """A general distillation window's logged line: pretraining's metrics and the distillation losses."""
    out = pretraining_step.summarize(window)
    steps_done = max(float(window["steps"]), 1.0)
    out.update({name: float(window[name]) / steps_done for name in DISTILL_METRICS + LAYER_LOSS_METRICS
                if name in window})
    return out


def task_distillation_loss(logits, labels, weights, teacher_logits, *, gold_loss, kind: str, temperature: float,
                           alpha: float, soft_loss: str = "kl", gold_weights=None):
    """(1 - alpha) x the task's own loss on the gold labels + alpha x the soft loss toward the teacher:
    soft_loss "kl", T^2 x KL of the softened distributions for class logits (per example, choice or token);
    "mse", logit_mse (Tang et al. 2019); the squared difference of the predicted values for regression either way.

    input           shape / dtype          meaning
    logits          float, the head's      the student's: [B, K], [B, C], [B, S, K] or [B, 1] (regression)
    labels          as gold_loss takes     the gold labels; gold_loss: HEADS[kind].loss
    weights         [B] float ([B, S])     1 for a real example (tagging: a tagged token), 0 for padding
    teacher_logits  as logits              the fine-tuned teacher's, on the same inputs (no gradient)
    gold_weights    [B] float or None      augmented data (bertjax/tasks/augmentation.py): 1 for an original
                                           example, 0 for a copy, which has no gold label: the gold loss is
                                           the originals' alone, the soft loss every row's
    Returns (loss, sums): gold_loss's sums plus soft_loss_sum (the soft loss summed over the weighted rows); with
    gold_weights, count and soft_loss_sum alone (a batch's gold-label accuracy would count only its originals).
    Example: loss, sums = task_distillation_loss(logits, y, w, t_logits, gold_loss=g, kind=k, temperature=2, alpha=0.5)
    """
    if gold_weights is not None:
        gold_weights = gold_weights.reshape(gold_weights.shape + (1,) * (weights.ndim - gold_weights.ndim))
    gold, sums = gold_loss(logits, labels, weights if gold_weights is None else weights * gold_weights)
    weights = weights.astype(jnp.float32)
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    if kind == "regression" or soft_loss == "mse":
        soft = logit_mse(logits, teacher_logits, weights)
    else:
        soft = soft_cross_entropy(logits, teacher_logits, weights, temperature)
    if gold_weights is not None:
        sums = {"count": jnp.sum(weights)}
    return (1.0 - alpha) * gold + alpha * soft, dict(sums, soft_loss_sum=soft * jnp.sum(weights))


def task_layer_distillation_loss(params, batch, dropout_rng, teacher_params, *, net, teacher_net, soft_loss,
                                 settings: LayerLosses, layer_map: tuple):
    """Task distillation with the intermediate-layer losses: soft_loss (task_distillation_loss, partially
    applied) on the logits of one forward pass each, which also records the layers the losses compare
    (tasks.steps.task_loss's inputs and weights). Returns (loss, sums), the layer losses as means. params
    may carry the student's projections (PROJECTIONS), trained with it."""
    projections = params.get(PROJECTIONS)
    params = without_projections(params)
    weights = batch["example_weight"]  # [B]
    if any(k in batch for k in PACKED_INPUT_KEYS):
        raise ValueError("distill.alpha_embedding/alpha_hidden/alpha_attention/alpha_pkd compare whole rows: set "
                         "data.packing=False for task distillation with them")
    if "label_weight" in batch:  # tagging: the tokens that carry a tag, [B, S]
        weights = batch["label_weight"] * weights[:, None]
    inputs = [batch[k] for k in INPUT_KEYS]
    collections = list(settings.collections())
    logits, s_recorded = net.apply({"params": params}, *inputs, deterministic=False, rngs={"dropout": dropout_rng},
                                   mutable=collections)
    teacher_logits, t_recorded = jax.lax.stop_gradient(teacher_net.apply(
        {"params": teacher_params}, *inputs, deterministic=True, mutable=collections))
    loss, sums = soft_loss(logits, batch["label"], weights, teacher_logits, gold_weights=batch.get("gold_weight"))
    mask = batch["input_mask"].reshape(-1, batch["input_mask"].shape[-1])  # [B, S] ([B*C, S] for choices)
    rows = batch["example_weight"].astype(jnp.float32)
    rows = jnp.repeat(rows, mask.shape[0] // rows.shape[0])  # each choice row carries its example's weight
    layered, extra = layer_losses(settings, layer_map, s_recorded, t_recorded, mask * rows[:, None], rows,
                                  projections)
    return loss + layered, dict(sums, **extra)


def teacher_task_logits(teacher_params, input_ids, segment_ids, input_mask, *, net, **packed):
    """A fine-tuned teacher's logits (no dropout), as the student's task loss reads them."""
    return net.apply({"params": teacher_params}, input_ids, segment_ids, input_mask, deterministic=True, **packed)


def check_task_distillation(kind: str, temperature: float, alpha: float) -> None:
    if kind not in TASK_KINDS:
        raise ValueError(f"distill.teacher: task distillation supports {', '.join(TASK_KINDS)} tasks, not {kind}: "
                         "unset distill.teacher")
    if not temperature > 0:
        raise ValueError(f"distill.temperature={temperature} must be positive")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"distill.alpha={alpha} must lie in [0, 1] (the weight of the teacher's soft targets "
                         "against the gold labels)")


# --------------------------------------------------------------------------------------------------
# The student and the teacher
# --------------------------------------------------------------------------------------------------

def student_config_from_teacher(teacher: BertConfig, layers, own: dict) -> BertConfig:
    """The config of a student made of the teacher's `layers`: the teacher's architecture with
    len(layers) layers (and their head counts); own: the student's own layout, compute and training
    fields (field_names("layout", "compute", "training"): dtype, scan_layers, dropout rates, ...)."""
    check_layers(teacher, layers)
    foreign = sorted(set(own) - set(field_names("layout", "compute", "training")))
    if foreign:
        raise ValueError(f"the student takes its architecture from the teacher's layers, not {foreign}")
    return dataclasses.replace(teacher, **own, num_layers=len(layers),
                               layer_heads=tuple(teacher.layer_heads[j] for j in layers) if teacher.layer_heads else ())


def check_layers(teacher: BertConfig, layers) -> None:
    layers = list(layers)
    if not layers or len(set(layers)) != len(layers) or not all(0 <= j < teacher.num_layers for j in layers):
        raise ValueError(f"distill.student_layers={layers}: distinct layers of the teacher's "
                         f"0..{teacher.num_layers - 1} (DistilBERT's 12 -> 6: [0, 2, 4, 7, 9, 11])")
    if teacher.num_hidden_groups and teacher.num_hidden_groups != teacher.num_layers:
        raise ValueError("distill.student_layers: an ALBERT teacher shares one set of parameters across its layers, "
                         "there are none to pick: set distill.student_layers=() for a fresh student")
    if alternates(teacher) and any(i % teacher.global_attention_every != j % teacher.global_attention_every
                                        for i, j in enumerate(layers)):
        raise ValueError(f"distill.student_layers={layers}: the teacher alternates local and global attention every "
                         f"{teacher.global_attention_every} layers; student layer i must be a teacher layer j with the "
                         "same i % n == j % n")


def check_student(teacher: BertConfig, student: BertConfig, weights: LossWeights) -> None:
    """A fresh student (or one from train.init_from) against its teacher, in one line when it cannot learn
    from it: the same vocabulary always; the same width where the cosine loss compares hidden states."""
    if student.vocab_size != teacher.vocab_size:
        raise ValueError(f"model.vocab_size={student.vocab_size} but the teacher's is {teacher.vocab_size}: the soft "
                         "targets are over the teacher's vocabulary; set model.vocab_size to it")
    if weights.alpha_cos > 0 and student.hidden_size != teacher.hidden_size:
        raise ValueError(f"distill.alpha_cos={weights.alpha_cos} compares last hidden states, but the student's "
                         f"hidden_size {student.hidden_size} is not the teacher's {teacher.hidden_size}: set "
                         "distill.alpha_cos=0 (a student of another width learns from the soft targets and the labels)")


def with_teacher_layers(teacher_params: dict, teacher: BertConfig, student: BertConfig, layers) -> dict:
    """The teacher's params with student layer i = teacher layer layers[i], in the student's layout: its
    embeddings, final norm, pooler and heads as they are."""
    encoder = bert.unrolled_encoder(teacher_params["bert"]["encoder"], teacher)
    picked = {k: v for k, v in encoder.items() if not k.startswith("layers_")}  # a final norm, where there is one
    picked.update({f"layers_{i}": encoder[f"layers_{j}"] for i, j in enumerate(layers)})
    if student.scan_layers:
        picked = bert.stack_layers(picked, student)
    return dict(teacher_params, bert=dict(teacher_params["bert"], encoder=picked))


def student_params(teacher_params: dict, teacher: BertConfig, student: BertConfig, layers,
                   abstract_params) -> dict:
    """BertForPreTraining params of the student: the teacher's embeddings, pooler and heads, and student
    layer i = teacher layer layers[i]; checked against the student's abstract params (shapes) and placed
    in their shardings, as fresh arrays (the step donates the student's, never the teacher's)."""
    params = with_teacher_layers(teacher_params, teacher, student, layers)
    want = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), abstract_params)
    got = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), params)
    if want != got:
        raise ValueError(f"distill.student_layers={list(layers)}: the teacher's layers do not make the student's "
                         "parameters (a layer of another shape): choose other layers, or student_layers=() for a "
                         "fresh student")
    shardings = jax.tree_util.tree_map(lambda a: a.sharding, abstract_params)
    # Copied in a jit: device_put may hand back (a shard of) the very buffer, which the step would then donate.
    copy = jax.jit(lambda tree: jax.tree_util.tree_map(jnp.copy, tree), out_shardings=shardings)
    return copy(jax.device_put(params, shardings))


def place_params(net: nn.Module, example: dict, params, mesh, rules):
    """A teacher's params laid out as a student of its architecture would be (its logical axis names
    through the same rules), so that the step needs no resharding."""
    boxed = jax.eval_shape(lambda r: net.init({"params": r}, **example)["params"], jax.random.key(0))
    return jax.device_put(params, sharding.tree_shardings(boxed, mesh, rules))


def check_same_vocabulary(student_vocab: str, teacher_vocab: str, what: str) -> None:
    """The student reads its text with the teacher's token ids, or the soft targets mean other tokens."""
    if epath.Path(student_vocab).read_bytes() != epath.Path(teacher_vocab).read_bytes():
        raise ValueError(f"{what}: the teacher's vocabulary ({teacher_vocab}) is not the student's ({student_vocab}): "
                         "distil between models of one tokenizer")


# --------------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------------


def compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding, grad_accum_steps: int,
                              mean_metrics: tuple = ()):
    """step.train_step over loss_fn(params, batch, dropout_rng, teacher_params), jitted once with the
    teacher as an argument in its own shardings (not a constant folded into the program, not part of the
    donated state). Returns (state, batch, dropout_key) -> (state, sums), as the loop calls a step."""

    def one_step(state, batch, dropout_key, teacher):
        return steps.train_step(state, batch, dropout_key, loss_fn=functools.partial(loss_fn, teacher_params=teacher),
                                tx=setup.tx, grad_accum_steps=grad_accum_steps, mean_metrics=mean_metrics)

    teacher_sharding = jax.tree_util.tree_map(lambda a: a.sharding, teacher_params)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        jitted = jax.jit(under_rules(one_step, setup.rules),
                         in_shardings=(setup.state_sharding, data_sharding, None, teacher_sharding),
                         out_shardings=(setup.state_sharding, None), donate_argnums=(0,))
    return lambda state, batch, dropout_key: jitted(state, batch, dropout_key, teacher_params)


def task_distillation_step(setup, teacher_net, teacher_params, kind: str, temperature: float, alpha: float,
                           data_sharding, grad_accum_steps: int, settings: LayerLosses = LayerLosses(),
                           layer_map: tuple = (), soft_loss: str = "kl"):
    """Task distillation's train step: task_loss with the teacher's logits mixed into the loss
    (task_distillation_loss, its soft_loss), jitted with the teacher's params as an argument of the step; with the
    layer losses of settings on, those added (task_layer_distillation_loss, teacher layer layer_map[i] for student
    layer i). A batch with gold_weight (augmented data) has the gold loss of its originals alone."""
    if soft_loss not in SOFT_LOSSES:
        raise ValueError(f"soft_loss={soft_loss!r}: choose one of {SOFT_LOSSES}")
    soft = functools.partial(task_distillation_loss, gold_loss=heads.head(kind).loss, kind=kind,
                             temperature=temperature, alpha=alpha, soft_loss=soft_loss)
    if settings.on:
        loss_fn = functools.partial(task_layer_distillation_loss, net=setup.net, teacher_net=teacher_net,
                                    soft_loss=soft, settings=settings, layer_map=layer_map)
        return compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding, grad_accum_steps,
                                         settings.metrics())

    def loss_fn(params, batch, dropout_rng, teacher_params):
        teacher_logits = functools.partial(teacher_task_logits, teacher_params, net=teacher_net)
        loss = functools.partial(soft, gold_weights=batch.get("gold_weight"))
        return task_loss(params, batch, dropout_rng, net=setup.net, loss=loss, teacher=teacher_logits)

    return compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding, grad_accum_steps)
