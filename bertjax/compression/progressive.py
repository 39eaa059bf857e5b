"""MobileBERT's progressive knowledge transfer (Sun et al. 2020, "MobileBERT: a Compact Task-Agnostic BERT for
Resource-Limited Devices", sections 3.4-3.5): general distillation (`python -m bertjax.distill`) in L + 1
stages, each a pure function of the step, so that a run resumed mid-stage goes on exactly.

    stage l = 1..L   student layer l learns teacher layer l: alpha_fmt x FMT_l + alpha_at x AT_l. The layers
                     below take lower_layers_lr x the learning rate (0: frozen, as the paper describes it;
                     the paper's softer variant, and its published code, tune them at 0.1 x), the layers
                     above and everything outside the encoder's layers (the embedding, the masked-LM and
                     next-sentence heads) none.
    stage L + 1      pre-training distillation (PD), every parameter: pd_alpha x MLM + (1 - pd_alpha) x KD
                     + the sentence task of data.objective (NSP), KD = T^2 x KL(teacher || student) of the
                     masked-LM distributions at the masked positions.

FMT_l (feature-map transfer): the mean squared difference of layer l's outputs, the H-wide feature maps,
over the real tokens and the features (compression/distillation.py's hidden_mse: teacher and student are of
one width, no projection). AT_l (attention transfer): KL(teacher || student) of each head's attention
distribution, averaged over the heads and the real query tokens, the padding keys left out.

What the published code does that is followed here (google-research/mobilebert, run_pretraining.py,
lamb_optimizer.py, modeling.get_assignment_map_from_checkpoint; TF Model Garden's projects/mobilebert/
distillation.py): the student starts with every parameter outside the encoder's layers copied from the
teacher (the embedding, its norm where both models have the same kind, and the heads), untrained until the
PD stage; one stage per layer, 10,000 steps each for the 24 layers (240,000), then 500,000 PD steps; LAMB at
1.5e-3, batch 2048; PD at ground-truth ratio 0.5 and temperature 1. What it adds and is not done here: FMT
on layer-normalised maps (weight 100) with mean (5000) and variance (5) terms, the slight decay (to 0.9)
after each layer stage's warmup, and the TF1 attention loss's cross-entropy form (the KL plus the teacher's
entropy: the same gradient) averaged over the padding queries too.

How a stage trains, inside the one jitted step: the stage and the learning rate are functions of state.step;
the frozen parameters are held by stop_gradient in the loss (a zero gradient, left out of the clipping norm)
and their updates, weight decay included, are multiplied by 0 after the optimizer (update_scales, scaled).
The optimizer's own schedule is a constant peak; lr_factor is the stages' schedule: each layer stage warms
up again over stage_warmup_steps (the new layer's Adam moments start from nothing), and the PD stage follows
the schedule section over pd_steps (warmup, then its decay to 0).

Shape legend: B batch, S sequence, H hidden (the feature map, between layers), N heads, Q query rows,
L layers, P predictions, V vocabulary.
"""

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax.compression.distillation import LossWeights, hidden_mse, recorded, soft_cross_entropy, summarize
from bertjax.models import attention as model_attention, bert
from bertjax.models.config import BertConfig
from bertjax.training import pretraining_step
from bertjax.training import step as steps
from bertjax.training.state import under_rules

# The other recipes' losses, which a progressive run does not read: each must be 0.
OTHER_LOSSES = ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_nsp", "alpha_embedding", "alpha_hidden",
                "alpha_attention", "alpha_pkd")
# Logged as means (besides pretraining's): the stage's transfer losses (0 in the PD stage) and KD (every stage).
METRICS = ("fmt_loss", "at_loss", "kd_loss")
# What the student's embedding shape is made of: it is the teacher's, copied (check_pair names what differs).
EMBEDDING_FIELDS = {"vocab_size": "vocab_size", "embedding_width": "embedding_size", "hidden_size": "hidden_size",
                    "trigram_input": "trigram_input", "max_position_embeddings": "max_position_embeddings",
                    "type_vocab_size": "type_vocab_size", "use_bias": "use_bias"}


@dataclasses.dataclass(frozen=True)
class Progressive:
    """The stages of a progressive run (distill.progressive=True) and their losses' weights. Steps are
    0-based update counts, as the optimizer's schedules count them: stage l holds steps (l-1) x stage_steps
    .. l x stage_steps - 1; the PD stage the pd_steps after L x stage_steps."""

    num_layers: int  # L: the student's (and the teacher's) layers, one stage each
    stage_steps: int
    pd_steps: int
    stage_warmup_steps: int = 0
    lower_layers_lr: float = 0.0
    alpha_fmt: float = 1.0
    alpha_at: float = 1.0
    pd_alpha: float = 0.5  # the weight of the masked-LM labels in PD; 1 - pd_alpha the teacher's distribution's
    temperature: float = 1.0
    objective: str = "nsp"  # data.objective: the sentence task PD adds ("none": none)
    peak_learning_rate: float = 1e-3
    # The PD stage's learning rate at its own step t (0..pd_steps): the schedule section's; None without PD.
    pd_schedule: Callable | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        problems = []
        if self.num_layers < 1 or self.stage_steps < 1 or self.pd_steps < 0:
            problems.append(f"distill.stage_steps={self.stage_steps} must be >= 1 (steps per layer) and "
                            f"distill.pd_steps={self.pd_steps} >= 0 (the pre-training distillation stage's)")
        if not 0 <= self.stage_warmup_steps <= self.stage_steps:
            problems.append(f"distill.stage_warmup_steps={self.stage_warmup_steps} must lie in [0, "
                            f"distill.stage_steps={self.stage_steps}]")
        for name in ("lower_layers_lr", "pd_alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"distill.{name}={getattr(self, name)} must lie in [0, 1]")
        if self.alpha_fmt < 0 or self.alpha_at < 0 or not self.alpha_fmt + self.alpha_at > 0:
            problems.append(f"distill.alpha_fmt={self.alpha_fmt} and distill.alpha_at={self.alpha_at} must be >= 0 "
                            "and not both 0 (the layer stages would learn nothing)")
        if not self.temperature > 0:
            problems.append(f"distill.temperature={self.temperature} must be positive (MobileBERT: 1.0)")
        if self.pd_steps and self.pd_schedule is None:
            problems.append(f"distill.pd_steps={self.pd_steps} needs the PD stage's learning-rate schedule")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_section(cls, section, *, num_layers: int, objective: str, peak_learning_rate: float,
                     pd_schedule: Callable | None) -> "Progressive":
        """The distill section's keys (configs/distill/common.py), for a student of num_layers layers."""
        return cls(num_layers=num_layers, stage_steps=int(section.stage_steps), pd_steps=int(section.pd_steps),
                   stage_warmup_steps=int(section.stage_warmup_steps), lower_layers_lr=float(section.lower_layers_lr),
                   alpha_fmt=float(section.alpha_fmt), alpha_at=float(section.alpha_at),
                   pd_alpha=float(section.pd_alpha), temperature=float(section.temperature), objective=objective,
                   peak_learning_rate=peak_learning_rate, pd_schedule=pd_schedule)

    @property
    def total_steps(self) -> int:
        return self.num_layers * self.stage_steps + self.pd_steps

    @property
    def pd_stage(self) -> int:
        return self.num_layers + 1

    def stage(self, step):
        """The stage of (0-based) step `step`, traced: 1..L a layer's, L + 1 PD's. int32."""
        return jnp.minimum(jnp.asarray(step, jnp.int32) // self.stage_steps + 1, self.pd_stage)

    def stage_of(self, step: int) -> int:
        """stage(), on the host."""
        return min(step // self.stage_steps + 1, self.pd_stage)

    def first_step(self, stage: int) -> int:
        return (stage - 1) * self.stage_steps

    def lr_factor(self, step):
        """The learning rate of (0-based) step `step` over the peak: each layer stage's linear warmup over
        stage_warmup_steps, then 1; the PD stage's the schedule section's over pd_steps. float32."""
        step = jnp.asarray(step, jnp.float32)
        pd_start = self.num_layers * self.stage_steps
        layer = jnp.float32(1.0)
        if self.stage_warmup_steps:
            layer = jnp.minimum(1.0, jnp.mod(step, self.stage_steps) / self.stage_warmup_steps)
        if self.pd_schedule is None:
            return jnp.where(step < pd_start, layer, 0.0)
        pd = self.pd_schedule(jnp.maximum(step - pd_start, 0.0)) / self.peak_learning_rate
        return jnp.where(step < pd_start, layer, pd).astype(jnp.float32)

    def learning_rate(self, step):
        """What the optimizer applies at `step` (the logged learning_rate): the peak x lr_factor."""
        return self.peak_learning_rate * self.lr_factor(step)

    def pd_weights(self) -> LossWeights:
        """PD as general distillation's loss weights: KD as alpha_ce, the labels as alpha_mlm, the sentence
        task at 1 (what the teacher's and the student's checks read)."""
        return LossWeights(temperature=self.temperature, alpha_ce=1.0 - self.pd_alpha, alpha_mlm=self.pd_alpha,
                           alpha_cos=0.0, alpha_nsp=0.0 if self.objective == "none" else 1.0)

    def mean_metrics(self) -> tuple:
        sentence = () if self.objective == "none" else (f"{self.objective}_loss",)
        return ("mlm_loss",) + sentence + METRICS

    def describe(self, stage: int, at_step: int | None = None) -> str:
        """The console's line for `stage` (at_step: a resumed run's step, inside it)."""
        first = self.first_step(stage)
        last = first + (self.pd_steps if stage == self.pd_stage else self.stage_steps)
        where = f"steps {first + 1}..{last}" + (f", resumed after step {at_step}" if at_step else "")
        if stage == self.pd_stage:
            sentence = "" if self.objective == "none" else f" + {self.objective.upper()}"
            return (f"stage {stage}/{self.pd_stage}, pre-training distillation ({where}): every parameter learns "
                    f"{self.pd_alpha:g} x MLM + {1 - self.pd_alpha:g} x KD (T={self.temperature:g}){sentence}")
        below = ("frozen" if self.lower_layers_lr == 0 else f"at {self.lower_layers_lr:g} x the learning rate")
        return (f"stage {stage}/{self.pd_stage}, layer {stage} ({where}): {self.alpha_fmt:g} x feature-map + "
                f"{self.alpha_at:g} x attention transfer from the teacher's layer {stage}; the layers below "
                f"{below}, the embedding and heads frozen")


# --------------------------------------------------------------------------------------------------
# The teacher and the student
# --------------------------------------------------------------------------------------------------


def check_pair(teacher: BertConfig, student: BertConfig) -> None:
    """A teacher and a student progressive transfer can join, in one line naming the student's fields to change:
    layer l of one is layer l of the other, of one width between layers (the feature map; the width inside a
    layer, intra_bottleneck_size, is each one's own) and one head count; a layer's own parameters; attention
    scores that exist; and the teacher's embedding, which the student takes as it is."""
    if student.num_hidden_groups and student.num_hidden_groups != student.num_layers:
        raise ValueError("distill.progressive trains one layer at a time, and model.num_hidden_groups="
                         f"{student.num_hidden_groups} shares parameters between layers: unset model.num_hidden_groups")
    differ, fixes = [], []
    if teacher.hidden_size != student.hidden_size:
        differ.append(f"the teacher's feature maps are {teacher.hidden_size} wide, the student's {student.hidden_size}")
        fixes.append(f"model.hidden_size={teacher.hidden_size}")
    if teacher.num_layers != student.num_layers:
        differ.append(f"the teacher has {teacher.num_layers} layers, the student {student.num_layers}")
        fixes.append(f"model.num_layers={teacher.num_layers}")
    t_heads = {teacher.heads_of(i) for i in range(teacher.num_layers)}
    s_heads = {student.heads_of(i) for i in range(student.num_layers)}
    if t_heads != s_heads:
        differ.append(f"the teacher's layers have {sorted(t_heads)} heads, the student's {sorted(s_heads)}")
        fixes.append(f"model.num_heads={max(t_heads)}")
    if differ:
        raise ValueError(f"distill.progressive: the bottlenecks do not match ({'; '.join(differ)}): set "
                         f"{', '.join(fixes)} (model.intra_bottleneck_size, the width inside a layer, may differ)")
    model_attention.check_scores_available(student.attention_impl)
    model_attention.check_scores_available(teacher.attention_impl)
    embedding = [f"model.{key}={getattr(teacher, name)!r}" for name, key in EMBEDDING_FIELDS.items()
                 if getattr(teacher, name) != getattr(student, name)]
    if embedding:
        raise ValueError("distill.progressive copies the teacher's embedding into the student, untrained until the "
                         f"last stage (as MobileBERT's code does), so it must be of the teacher's shape: set "
                         f"{', '.join(embedding)}")


def _path(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)


def in_layers(path: tuple) -> bool:
    """Whether a param (by its key path) is one of an encoder layer's (unrolled layers_i or the scanned stack)."""
    return path[:2] == ("bert", "encoder") and len(path) > 2 and (path[2] == "layers" or path[2].startswith("layers_"))


def _norm_kind(cfg: BertConfig, key: tuple) -> str:
    """The kind of norm a module outside the layers is: MobileBERT's masked-LM head's is LayerNorm always."""
    return "layernorm" if key[0] == "mlm_head" and cfg.block == "mobilebert" else cfg.norm


def teacher_parts(student_params, teacher_params, student: BertConfig, teacher: BertConfig) -> tuple[dict, list]:
    """(the student's params with every parameter outside its layers the teacher's where the teacher has it at
    that shape, the names of the modules copied). A norm stays the student's where the two use different kinds
    (the embedding's: an IB-BERT LayerNorm, MobileBERT's NoNorm), as the published code's names keep it. The
    arrays are fresh, in the student's shardings (the step donates the student's, never the teacher's)."""
    theirs = {_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(teacher_params)[0]}
    copied = set()

    def pick(path, leaf):
        key = _path(path)
        other = theirs.get(key)
        other_norm = len(key) > 1 and "norm" in key[-2] and _norm_kind(teacher, key) != _norm_kind(student, key)
        if in_layers(key) or other is None or other.shape != leaf.shape or other_norm:
            return leaf
        copied.add("/".join(key[:2] if key[0] == "bert" else key[:1]))
        return other

    mixed = jax.tree_util.tree_map_with_path(pick, student_params)
    shardings = jax.tree_util.tree_map(lambda a: a.sharding, student_params)
    copy = jax.jit(lambda tree: jax.tree_util.tree_map(jnp.copy, tree), out_shardings=shardings)
    return copy(jax.device_put(mixed, shardings)), sorted(copied)


# --------------------------------------------------------------------------------------------------
# The losses: pure, top level
# --------------------------------------------------------------------------------------------------


def attention_kl(student_scores, teacher_scores, mask):
    """AT: KL(teacher || student) of each head's attention distribution over the keys, the mean over the heads
    and the real query tokens.

    input           shape / dtype         meaning
    student_scores  [B, N, Q, S] float    a student layer's scores before softmax (the model's, masked keys at
                                          float32's lowest: their probability is 0 in both)
    teacher_scores  [B, N, Q, S] float    the teacher's layer's, the same N heads
    mask            [B, S]                1 for a real token, 0 for padding (queries Q = S)
    Returns a float32 scalar: sum over b, n, real q of sum over real keys p_T (log p_T - log p_S), divided by
    N x the real queries.
    Example: at = attention_kl(student_scores[l - 1], teacher_scores[l - 1], batch["input_mask"])
    """
    t = jax.nn.log_softmax(teacher_scores.astype(jnp.float32), axis=-1)
    s = jax.nn.log_softmax(student_scores.astype(jnp.float32), axis=-1)
    keys = mask[:, None, None, :] > 0  # [B, 1, 1, S]
    kl = jnp.sum(jnp.where(keys, jnp.exp(t) * (t - s), 0.0), axis=-1)  # [B, N, Q]
    queries = jnp.broadcast_to(mask[:, None, :].astype(jnp.float32), kl.shape)
    return jnp.sum(queries * kl) / jnp.maximum(jnp.sum(queries), 1e-12)


def stage_loss(plan: Progressive, stage, student: dict, teacher: dict, s_recorded: dict, t_recorded: dict,
               batch: dict):
    """(loss, metrics) of `stage` (1..L + 1, traced or not) on one forward pass of each model.

    student, teacher   BertForPreTraining's outputs (mlm_logits [B, P, V], nsp_logits [B, 2])
    s_recorded, ...    the collections each recorded: bert.HIDDEN_STATES (L + 1 x [B, S, H], the embedding's
                       first), bert.ATTENTION_SCORES (L x [B, N, S, S])
    batch              a pretraining batch (input_mask, masked_lm_*, next_sentence_labels)
    Only the stage's layer is compared (lax.switch computes one branch). The metrics: pretraining_loss's (the
    labels' masked-LM loss, the sentence task's), kd_loss (every stage) and fmt_loss, at_loss (0 in PD).
    """
    num_layers, mask = plan.num_layers, batch["input_mask"]
    s_hidden, t_hidden = recorded(s_recorded, bert.HIDDEN_STATES), recorded(t_recorded, bert.HIDDEN_STATES)
    s_scores, t_scores = recorded(s_recorded, bert.ATTENTION_SCORES), recorded(t_recorded, bert.ATTENTION_SCORES)
    layer = jnp.clip(jnp.asarray(stage, jnp.int32) - 1, 0, num_layers - 1)
    fmt = jax.lax.switch(layer, [functools.partial(hidden_mse, s_hidden[m + 1], t_hidden[m + 1], mask)
                                 for m in range(num_layers)])
    at = jax.lax.switch(layer, [functools.partial(attention_kl, s_scores[m], t_scores[m], mask)
                                for m in range(num_layers)])
    _, sums = bert.pretraining_loss(student["mlm_logits"], student.get("nsp_logits"), batch["masked_lm_ids"],
                                    batch["masked_lm_weights"], batch["next_sentence_labels"], objective=plan.objective,
                                    sentence_weights=batch.get("sentence_weights"))
    kd = soft_cross_entropy(student["mlm_logits"], teacher["mlm_logits"], batch["masked_lm_weights"],
                            plan.temperature)
    pd = plan.pd_alpha * sums["mlm_loss"] + (1.0 - plan.pd_alpha) * kd
    if plan.objective != "none":
        pd = pd + sums[f"{plan.objective}_loss"]
    in_pd = jnp.asarray(stage) > num_layers
    zero = jnp.float32(0.0)
    loss = jnp.where(in_pd, pd, plan.alpha_fmt * fmt + plan.alpha_at * at)
    return loss, dict(sums, kd_loss=kd, fmt_loss=jnp.where(in_pd, zero, fmt), at_loss=jnp.where(in_pd, zero, at))


def progressive_loss(params, batch, dropout_rng, teacher_params, *, stage, scales, net, teacher_net,
                     plan: Progressive):
    """The loss of the step's stage, as step.train_step takes it: one forward pass of the student (the params
    of scale 0 held by stop_gradient) and of the teacher (no dropout, no gradient), recording what the
    transfers compare."""
    collections = (bert.HIDDEN_STATES, bert.ATTENTION_SCORES)
    student, s_recorded = pretraining_step.forward(net, frozen(params, scales), batch, False,
                                                   {"dropout": dropout_rng}, heads_only=False, mutable=collections)
    teacher, t_recorded = jax.lax.stop_gradient(pretraining_step.forward(
        teacher_net, teacher_params, batch, True, None, heads_only=False, mutable=collections))
    return stage_loss(plan, stage, student, teacher, s_recorded, t_recorded, batch)


def summarize_progressive(window: dict) -> dict:
    """A logged line: general distillation's, and the stage losses' means."""
    out = summarize(window)
    steps_done = max(float(window["steps"]), 1.0)
    out.update({name: float(window[name]) / steps_done for name in METRICS if name in window})
    return out


# --------------------------------------------------------------------------------------------------
# Freezing, and the step
# --------------------------------------------------------------------------------------------------


def update_scales(plan: Progressive, params, stage):
    """What each parameter's update is multiplied by in `stage` (traced): a tree of params' structure, float32
    scalars, [K, 1, ...] for the K layers of a scanned stack (the last K of the L). Layer l (1-based) takes 1 in
    stage l, lower_layers_lr in the stages after it, 0 before; everything outside the layers 0 until PD, where
    every parameter takes 1."""
    layer = jnp.arange(1, plan.num_layers + 1)
    in_pd = stage > plan.num_layers
    per_layer = jnp.where(in_pd | (layer == stage), 1.0,
                          jnp.where(layer < stage, plan.lower_layers_lr, 0.0)).astype(jnp.float32)  # [L]
    outside = jnp.where(in_pd, 1.0, 0.0).astype(jnp.float32)

    def scale(path, leaf):
        key = _path(path)
        if not in_layers(key):
            return outside
        if key[2] == "layers":  # scanned: the stack is the last K layers (models.config.scanned_layout)
            return per_layer[plan.num_layers - leaf.shape[0]:].reshape((-1,) + (1,) * (leaf.ndim - 1))
        return per_layer[int(key[2].removeprefix("layers_"))]

    return jax.tree_util.tree_map_with_path(scale, params)


def frozen(params, scales):
    """params, those of scale 0 behind stop_gradient: their gradient is 0 (and so out of the clipping norm)."""
    return jax.tree_util.tree_map(lambda p, s: jnp.where(s > 0, p, jax.lax.stop_gradient(p)), params, scales)


def scaled(tx: optax.GradientTransformation, scales, factor) -> optax.GradientTransformation:
    """tx, its updates (weight decay and the learning rate included) multiplied by scales x factor: 0 for a
    frozen parameter, the stage's learning rate over tx's constant peak for the others. The same state."""

    def update(updates, state, params=None):
        updates, state = tx.update(updates, state, params)
        return jax.tree_util.tree_map(lambda u, s: (u * (s * factor)).astype(u.dtype), updates, scales), state

    return optax.GradientTransformation(tx.init, update)


def compile_step(setup, teacher_net, teacher_params, plan: Progressive, data_sharding, grad_accum_steps: int):
    """The jitted train step of progressive transfer, the teacher's params an argument of it (as
    distillation.compile_step_with_teacher's): the stage, the frozen parameters and the learning rate from
    state.step. Returns (state, batch, dropout_key) -> (state, sums), as the loop calls a step."""

    def one_step(state, batch, dropout_key, teacher):
        stage = plan.stage(state.step)
        scales = update_scales(plan, state.params, stage)
        loss_fn = functools.partial(progressive_loss, teacher_params=teacher, stage=stage, scales=scales,
                                    net=setup.net, teacher_net=teacher_net, plan=plan)
        return steps.train_step(state, batch, dropout_key, loss_fn=loss_fn,
                                tx=scaled(setup.tx, scales, plan.lr_factor(state.step)),
                                grad_accum_steps=grad_accum_steps, mean_metrics=plan.mean_metrics())

    teacher_sharding = jax.tree_util.tree_map(lambda a: a.sharding, teacher_params)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        jitted = jax.jit(under_rules(one_step, setup.rules),
                         in_shardings=(setup.state_sharding, data_sharding, None, teacher_sharding),
                         out_shardings=(setup.state_sharding, None), donate_argnums=(0,))
    return lambda state, batch, dropout_key: jitted(state, batch, dropout_key, teacher_params)
