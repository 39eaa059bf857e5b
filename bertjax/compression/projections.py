"""TinyBERT's learned projections (W_e, W_h: the fit_dense of its published code): a student narrower than its
teacher maps its states to the teacher's width through them before the embedding and hidden-state MSEs
(compression/distillation.py). They train with the student and live in the train state's params under
PROJECTIONS, but are saved beside the optimizer state (ProjectionCheckpointer), never with the student's
params: what bertjax.load, export, evaluate and train.init_from read is the student alone. A task stage
goes on from the projections its general distillation learned (saved_projections)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import layers as model_layers
from bertjax.training import checkpoint

# The student's learned projections to the teacher's width (TinyBERT's W_e, W_h): trained with the student,
# kept in the train state's params under this key, saved beside the optimizer state (ProjectionCheckpointer),
# never in the `params` item that bertjax.load, train.init_from and export read.
PROJECTIONS = "distill_projections"


def project(projection, x):
    """A learned projection (TinyBERT's fit_dense: x W + b) of x [..., H'] -> [..., H]; None: x as it is."""
    if projection is None:
        return x
    return (jnp.einsum("...i,ij->...j", x.astype(jnp.float32), projection["kernel"].astype(jnp.float32))
            + projection["bias"].astype(jnp.float32))


def adding_projections(names: tuple, student_width: int, teacher_width: int, stddev: float, init_key,
                       prepare_params=None, start: dict | None = None):
    """state.Setup's prepare_params: prepare_params' (fine-tuning's pretrained encoder; None: the fresh
    params), then the student's projections under PROJECTIONS: `start`'s values (saved_projections') or
    fresh ones. No names: prepare_params as given."""
    if not names:
        return prepare_params
    key = jax.random.fold_in(init_key, 1)

    def prepare(params):
        params = prepare_params(params) if prepare_params is not None else params
        projections = (init_projections(key, names, student_width, teacher_width, stddev) if start is None
                       else boxed_projections(start))
        return dict(params, **{PROJECTIONS: projections})

    return prepare


def saved_projections(path: str, names: tuple, student_width: int, teacher_width: int) -> dict | None:
    """The projections `names` that a distillation run saved in the newest checkpoint under `path` (beside
    its optimizer state: ProjectionCheckpointer), where they map this student's width to this teacher's:
    TinyBERT's task stage goes on from its general distillation's, as its published code does. None where
    there are none to go on from (a Hugging Face directory, a run that learned none, other widths)."""
    try:
        saved = checkpoint.restore_saved_part(path, "opt_state", PROJECTIONS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if saved is None or not set(names) <= set(saved):
        return None
    if any(np.shape(saved[name]["kernel"]) != (student_width, teacher_width) for name in names):
        return None
    return {name: {part: np.asarray(saved[name][part]) for part in ("kernel", "bias")} for name in names}


def without_projections(params: dict) -> dict:
    """The student's params alone (or anything of their structure: shapes, shardings): the model a run
    evaluates, exports and saves where bertjax.load reads."""
    return {k: v for k, v in params.items() if k != PROJECTIONS}


def init_projections(rng, names: tuple, student_width: int, teacher_width: int, stddev: float) -> dict:
    """Fresh projections {name: {kernel [H', H], bias [H]}}, boxed (boxed_projections): BERT's truncated
    normal, zero bias."""
    return boxed_projections({name: {
        "kernel": model_layers.truncated_normal_init(stddev)(jax.random.fold_in(rng, i),
                                                            (student_width, teacher_width)),
        "bias": jnp.zeros((teacher_width,), jnp.float32)} for i, name in enumerate(names)})


def boxed_projections(values: dict) -> dict:
    """{name: {kernel [H', H], bias [H]}} with logical axis names: the student's width sharded as its
    "embed", the teacher's replicated."""
    return {name: {"kernel": nn.LogicallyPartitioned(jnp.asarray(v["kernel"], jnp.float32), ("embed", None)),
                   "bias": nn.LogicallyPartitioned(jnp.asarray(v["bias"], jnp.float32), (None,))}
            for name, v in values.items()}


class ProjectionCheckpointer:
    """A training.checkpoint.Checkpointer for a state whose params carry PROJECTIONS, general distillation's
    and task distillation's alike: the checkpoint's `params` item holds the student alone (what
    bertjax.load, train.init_from, evaluate and export read, so the workdir reads as any pretraining or
    fine-tuning workdir), and its `opt_state` item {"optimizer": the optimizer's state, PROJECTIONS: the
    projections}, so that a resumed run goes on exactly. Anything else is the wrapped checkpointer's."""

    def __init__(self, checkpointer: checkpoint.Checkpointer):
        self._inner = checkpointer

    @classmethod
    def wrap(cls, checkpointer: checkpoint.Checkpointer, names: tuple):
        """checkpointer, wrapped where the student learns projections (names: projection_names'; () none)."""
        return cls(checkpointer) if names else checkpointer

    @staticmethod
    def describe(names: tuple) -> str:
        """The run's line saying where the projections (projection_names') go."""
        return (f"learned projections to the teacher's width ({', '.join(names)}): saved beside the optimizer "
                "state, not with the student's params")

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def save(self, step: int, params, opt_state, meta, force: bool = False, fp8=None) -> bool:
        return self._inner.save(step, without_projections(params),
                                {"optimizer": opt_state, PROJECTIONS: params[PROJECTIONS]}, meta, force=force, fp8=fp8)

    def restore_latest(self, abstract_params, abstract_opt_state, check_meta=None, abstract_fp8=None):
        restored = self._inner.restore_latest(
            without_projections(abstract_params),
            {"optimizer": abstract_opt_state, PROJECTIONS: abstract_params[PROJECTIONS]}, check_meta, abstract_fp8)
        if restored is None:
            return None
        return dataclasses.replace(restored,
                                   params=dict(restored.params, **{PROJECTIONS: restored.opt_state[PROJECTIONS]}),
                                   opt_state=restored.opt_state["optimizer"])
