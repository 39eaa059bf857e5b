"""The task kinds' registry: one record per kind, the same names everywhere, and what each record says."""

import dataclasses

import numpy as np
import pytest

from bertjax.interop import hf
from bertjax.models import contrastive_losses, heads
from bertjax.tasks import kinds, registry, scoring
from bertjax.tasks.kinds.base import Kind


def test_every_kind_has_one_record_one_head_and_one_hf_class():
    assert list(kinds.KINDS) == list(heads.HEADS) == list(registry.KINDS)
    for name, kind in kinds.KINDS.items():
        assert isinstance(kind, Kind) and kind.name == name
        if kind.hf_class is None:  # no transformers task class (contrastive: an encoder and its pooling)
            assert name not in hf.HF_HEADS
            continue
        assert set(kind.hf_class) == {f.name for f in dataclasses.fields(hf.HFHead)}
        assert hf.HF_HEADS[name] == hf.HFHead(**kind.hf_class)
    assert [name for name, kind in kinds.KINDS.items() if kind.hf_class is None] == ["contrastive"]


def test_the_registry_knows_the_scored_contrastive_losses():
    assert registry.SCORED_CONTRASTIVE_LOSSES == contrastive_losses.SCORED


def test_an_unknown_kind_is_one_line():
    with pytest.raises(ValueError, match="task kind 'poetry' is unknown: choose one of"):
        kinds.get("poetry")


@pytest.mark.parametrize("task, width", [("sst2", 2), ("stsb", None), ("hellaswag", None), ("squad", None),
                                         ("conll2003", 9)])
def test_the_head_width_comes_from_the_labels_where_the_kind_says_so(task, width):
    task = registry.get_task(task)
    kind = kinds.get(task.kind)
    assert kind.num_labels(task.labels) == width
    assert heads.resolve_num_labels(task.kind, width) == task.num_labels


def test_only_tagging_has_a_feature_based_variant():
    assert [name for name, kind in kinds.KINDS.items() if kind.feature_based] == ["tagging"]


def test_scoring_goes_through_the_kind():
    task = registry.get_task("sst2")
    features = {"label": np.array([0, 1, 1], np.int32), "idx": np.arange(3, dtype=np.int32)}
    split = scoring.Split(examples=[None] * 3, features=features, labeled=True)
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]], np.float32)
    scored = scoring.score(task, "validation", split, logits)
    assert scored.metrics["accuracy"] == pytest.approx(2 / 3)
    assert scored.files["validation.tsv"].splitlines()[1:] == ["0\t0", "1\t1", "2\t0"]
