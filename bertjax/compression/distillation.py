"""Distillation: a trained teacher's outputs teach a smaller student.

General distillation is DistilBERT's recipe (Sanh et al. 2019): the student learns the teacher's masked-LM
distribution at a temperature, the masked-LM labels, and the direction of the teacher's last hidden
states. Task distillation (Hinton et al. 2015) mixes a fine-tuned teacher's softened logits with the gold
labels. Here: the losses, the student made from a subset of the teacher's layers, and the train step
that takes the teacher's parameters as an argument of the one jitted step (so they are sharded like the
student's, never trained and never saved in the student's checkpoints). The programs load the teacher
(bertjax.interop.pretrained) and pass it in.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from etils import epath

from bertjax.models import bert

from bertjax.models.config import BertConfig, field_names, alternates
from bertjax.training import pretraining_step, sharding
from bertjax.training import step as steps
from bertjax.training.state import under_rules

# Logged by the general distillation step, as means over the batch (a step of k microbatches: their mean).
DISTILL_METRICS = ("ce_loss", "cos_loss")
# The task kinds task distillation supports: logits over classes (per example, choice or token) and a value.
TASK_KINDS = ("classification", "multiple_choice", "tagging", "regression")


# --------------------------------------------------------------------------------------------------
# Losses: pure, top level
# --------------------------------------------------------------------------------------------------


def _weighted_mean(values, weights):
    count = jnp.sum(weights)
    return jnp.sum(weights * values) / jnp.maximum(count, 1e-12)


def soft_cross_entropy(student_logits, teacher_logits, weights, temperature: float):
    """T^2 x KL(softmax(teacher / T) || softmax(student / T)), the mean over the weighted rows.

    student_logits, teacher_logits: [..., V]; weights: [...] (1 for a real row, 0 for padding). The KL is
    the soft cross-entropy less the teacher's entropy, which does not depend on the student: the same
    gradient, and 0 where the student matches (DistilBERT's loss_ce, torch's kl_div "batchmean" over the
    selected rows). T^2 keeps the gradient's scale independent of T (Hinton et al. 2015)."""
    t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = jnp.sum(jnp.exp(t) * (t - s), axis=-1)  # [...]
    return temperature ** 2 * _weighted_mean(kl, weights.astype(jnp.float32))


def cosine_loss(student_hidden, teacher_hidden, mask, eps: float = 1e-8):
    """1 - cos(student, teacher) per token, the mean over the real tokens (mask 1): DistilBERT's
    CosineEmbeddingLoss with target 1. student_hidden, teacher_hidden: [B, S, H]; mask: [B, S].
    eps as torch's: cos = x.y / sqrt((|x|^2 + eps)(|y|^2 + eps))."""
    s, t = student_hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32)
    cos = jnp.sum(s * t, -1) / jnp.sqrt((jnp.sum(s * s, -1) + eps) * (jnp.sum(t * t, -1) + eps))  # [B, S]
    return _weighted_mean(1.0 - cos, mask.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """General distillation's loss: alpha_ce x soft CE (at temperature) + alpha_mlm x masked LM +
    alpha_cos x cosine + alpha_nsp x the sentence task (data.objective's)."""

    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    alpha_nsp: float = 0.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"distill.temperature={self.temperature} must be positive (DistilBERT: 2.0)")
        alphas = {f"distill.{f}": getattr(self, f) for f in ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_nsp")}
        negative = [f"{k}={v}" for k, v in alphas.items() if v < 0]
        if negative or not any(alphas.values()):
            raise ValueError(f"{', '.join(negative) or 'every distill.alpha_* is 0'}: the loss weights must be >= 0 "
                             "and not all 0")

    def mean_metrics(self, objective: str) -> tuple:
        """The metrics the loss returns as means (train_step averages them over microbatches)."""
        return ("mlm_loss",) + DISTILL_METRICS + ((f"{objective}_loss",) if self.alpha_nsp > 0 else ())


def check_objective(weights: LossWeights, objective: str) -> None:
    if weights.alpha_nsp > 0 and objective == "none":
        raise ValueError(f"distill.alpha_nsp={weights.alpha_nsp} weighs a sentence task, but data.objective='none' "
                         "has none: set data.objective=nsp (or sop), or distill.alpha_nsp=0")


def pretraining_distillation_loss(params, batch, dropout_rng, teacher_params, *, net, teacher_net,
                                  weights: LossWeights, objective: str):
    """General distillation's loss on a pretraining batch: (loss, metric sums) as step.train_step takes it.

    The soft CE is taken where the masked-LM loss is, at the masked positions (DistilBERT's choice; the
    heads then run at P positions, not S). The cosine reads every real token's last hidden state, so with
    alpha_cos > 0 both models run their last block at all positions. The teacher runs without dropout."""
    hidden = weights.alpha_cos > 0
    student = pretraining_step.forward(net, params, batch, False, {"dropout": dropout_rng}, heads_only=not hidden)
    teacher = jax.lax.stop_gradient(pretraining_step.forward(teacher_net, teacher_params, batch, True,
                                                        heads_only=not hidden))
    sentence = objective if weights.alpha_nsp > 0 else "none"  # the sentence head is dropped unless weighed
    _, sums = bert.pretraining_loss(student["mlm_logits"], student.get("nsp_logits"), batch["masked_lm_ids"],
                                    batch["masked_lm_weights"], batch["next_sentence_labels"], objective=sentence,
                                    sentence_weights=batch.get("sentence_weights"))
    ce = soft_cross_entropy(student["mlm_logits"], teacher["mlm_logits"], batch["masked_lm_weights"],
                            weights.temperature)
    cos = (cosine_loss(student["sequence_output"], teacher["sequence_output"], batch["input_mask"]) if hidden
           else jnp.float32(0.0))
    loss = weights.alpha_ce * ce + weights.alpha_mlm * sums["mlm_loss"] + weights.alpha_cos * cos
    if weights.alpha_nsp > 0:
        loss = loss + weights.alpha_nsp * sums[f"{objective}_loss"]
    return loss, dict(sums, ce_loss=ce, cos_loss=cos)


def summarize(window: dict) -> dict:
    """A general distillation window's logged line: pretraining's metrics and the two distillation losses."""
    out = pretraining_step.summarize(window)
    steps_done = max(float(window["steps"]), 1.0)
    out.update({name: float(window[name]) / steps_done for name in DISTILL_METRICS})
    return out


def task_distillation_loss(logits, labels, weights, teacher_logits, *, gold_loss, kind: str, temperature: float,
                           alpha: float):
    """(1 - alpha) x the task's own loss on the gold labels + alpha x the soft loss toward the teacher:
    T^2 x KL of the softened distributions for class logits (per example, choice or token), the squared
    difference of the predicted values for regression. Returns (loss, sums), the sums the gold loss's plus
    soft_loss_sum (the soft loss summed over the weighted rows)."""
    gold, sums = gold_loss(logits, labels, weights)
    weights = weights.astype(jnp.float32)
    teacher_logits = jax.lax.stop_gradient(teacher_logits)
    if kind == "regression":
        soft = _weighted_mean(jnp.square(logits[..., 0] - teacher_logits[..., 0]), weights)
    else:
        soft = soft_cross_entropy(logits, teacher_logits, weights, temperature)
    return (1.0 - alpha) * gold + alpha * soft, dict(sums, soft_loss_sum=soft * jnp.sum(weights))


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
        raise ValueError(f"distill.student_layers={layers}: distinct layers of the teacher's 0..{teacher.num_layers - 1}"
                         " (DistilBERT's 12 -> 6: [0, 2, 4, 7, 9, 11])")
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


def _encoder_layers(encoder: dict, cfg: BertConfig) -> dict:
    return bert.unstack_layers(encoder, cfg) if cfg.scan_layers else dict(encoder)


def student_params(teacher_params: dict, teacher: BertConfig, student: BertConfig, layers,
                   abstract_params) -> dict:
    """BertForPreTraining params of the student: the teacher's embeddings, pooler and heads, and student
    layer i = teacher layer layers[i]; checked against the student's abstract params (shapes) and placed
    in their shardings, as fresh arrays (the step donates the student's, never the teacher's)."""
    encoder = _encoder_layers(teacher_params["bert"]["encoder"], teacher)
    picked = {k: v for k, v in encoder.items() if not k.startswith("layers_")}  # a final norm, where there is one
    picked.update({f"layers_{i}": encoder[f"layers_{j}"] for i, j in enumerate(layers)})
    if student.scan_layers:
        picked = bert.stack_layers(picked, student)
    params = dict(teacher_params, bert=dict(teacher_params["bert"], encoder=picked))
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
