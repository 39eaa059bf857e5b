"""Settings a run cannot use are refused early, in one line that says what to change."""

import pathlib
import subprocess
import sys

import pytest

from bertjax.models import bert
from bertjax.training import sharding

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_zero_batch_is_refused():
    mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
    rules = sharding.logical_rules([("batch", ("data", "fsdp"))])
    with pytest.raises(ValueError, match=r"train.batch_size=0 must be at least 1"):
        sharding.check_batch_size(0, 1, mesh, rules)


@pytest.mark.parametrize("seq,predictions,message", [
    (128, 126, r"max_predictions_per_seq=126 must lie in \[1, data.max_seq_length - 3 = 125\]"),
    (128, 0, r"max_predictions_per_seq=0"),
    (1024, 20, r"max_seq_length=1024 must lie in \[8, model.max_position_embeddings=512\]"),
])
def test_impossible_shapes_are_refused(seq, predictions, message):
    with pytest.raises(ValueError, match=message):
        bert.check_input_shapes(bert.BertConfig(), seq, predictions)
    bert.check_input_shapes(bert.BertConfig(), 128, 20)  # BERT's own setting passes


@pytest.mark.parametrize("override,expected", [
    ("--config.train.batchsize=3",
     "unknown config key 'batchsize' in --config.train.batchsize=3 (Did you mean \"batch_size\""),
    ("--config.train.zzz=3", "unknown config key 'zzz' in --config.train.zzz=3: check the spelling"),
])
def test_unknown_config_key_is_one_readable_line(override, expected):
    result = subprocess.run([sys.executable, "-m", "bertjax.summary", "--config=configs/tiny.py", override],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "\\n" not in lines[0] and "\\'" not in lines[0]
