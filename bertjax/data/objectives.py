"""The sentence-level objectives by name (data.objective): how an epoch's examples are planned, whether
they are pairs, and what their label means. No TensorFlow here: the settings check names against it.

A new objective is its plan builder (a function of the TokenizedCorpus, as in bertjax/data/plans.py,
returning rows in plans' columns) in a module of its own, and one row of OBJECTIVES.
"""

import dataclasses
from collections.abc import Callable

import numpy as np

from bertjax.data import plans


@dataclasses.dataclass(frozen=True)
class Objective:
    """plan: (corpus, *, seed, epoch, shard, max_seq_length, short_seq_prob) -> int64 [N, 5] plan rows.
    pairs: its rows are two segments, [CLS] A [SEP] B [SEP] with a label; else one range of the stream
    with separators between documents, [CLS] ... [SEP], label 0. labels: what next_sentence_labels 0 and 1
    mean (None: there is no sentence task, and 0 means nothing)."""

    name: str
    plan: Callable[..., np.ndarray]
    pairs: bool
    labels: tuple[str, str] | None


OBJECTIVES: dict[str, Objective] = {objective.name: objective for objective in (
    # BERT (Devlin et al. 2018): a segment and its continuation, or a random document's text.
    Objective("nsp", plans.build_epoch_plan, pairs=True, labels=("IsNext", "NotNext (B from a random document)")),
    # ALBERT (Lan et al. 2020): two consecutive segments of one document, half of them swapped.
    Objective("sop", plans.build_sop_plan, pairs=True, labels=("in order", "swapped (B comes first in the document)")),
    # RoBERTa FULL-SENTENCES, ModernBERT: full rows across documents, masked LM only.
    Objective("none", plans.build_full_sentences_plan, pairs=False, labels=None),
)}


def get(name: str) -> Objective:
    """The objective called `name`, or one line naming the choices."""
    if name not in OBJECTIVES:
        raise ValueError(f"data.objective={name!r} is not one of {', '.join(map(repr, OBJECTIVES))}")
    return OBJECTIVES[name]


def example_lengths(plan: np.ndarray, objective: str) -> np.ndarray:
    """Each plan row's length in tokens, special tokens included: int64 [N]."""
    if not get(objective).pairs:
        return plan[:, plans.A_END] - plan[:, plans.A_START] + 2  # [CLS] ... [SEP]
    # [CLS] A [SEP] B [SEP]
    return plan[:, plans.A_END] - plan[:, plans.A_START] + plan[:, plans.B_END] - plan[:, plans.B_START] + 3
