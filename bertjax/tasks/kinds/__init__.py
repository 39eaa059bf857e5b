"""The task kinds, one module each; `KINDS` maps a kind's name to its `Kind` (bertjax/tasks/kinds/base.py).

A new kind is one module here and one row below (and its network and loss in bertjax.models.heads);
fine-tuning, scoring, bertjax.load(...).predict, the SavedModel and the Hugging Face classes look the
kind up here rather than branching on its name.
"""

from bertjax.tasks.kinds.base import Kind
from bertjax.tasks.kinds.classification import CLASSIFICATION, REGRESSION
from bertjax.tasks.kinds.contrastive import CONTRASTIVE
from bertjax.tasks.kinds.multiple_choice import MULTIPLE_CHOICE
from bertjax.tasks.kinds.rerank import RERANK
from bertjax.tasks.kinds.span import SPAN
from bertjax.tasks.kinds.tagging import TAGGING

KINDS: dict[str, Kind] = {kind.name: kind for kind in (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE, SPAN, TAGGING,
                                                      CONTRASTIVE, RERANK)}


def get(name: str) -> Kind:
    """KINDS[name], or one line listing the kinds."""
    if name not in KINDS:
        raise ValueError(f"task kind {name!r} is unknown: choose one of {list(KINDS)}")
    return KINDS[name]
