"""Settings a run cannot use are refused early, in one line that says what to change."""

import pathlib
import sys

import pytest
from conftest import run_command  # tests/ is on sys.path under pytest

from bertjax.models import bert

from bertjax.models.config import BertConfig
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
        bert.check_input_shapes(BertConfig(), seq, predictions)
    bert.check_input_shapes(BertConfig(), 128, 20)  # BERT's own setting passes


@pytest.mark.parametrize("override,expected", [
    ("--config.train.batchsize=3",
     "unknown config key 'batchsize' in --config.train.batchsize=3 (Did you mean \"batch_size\""),
    ("--config.train.zzz=3", "unknown config key 'zzz' in --config.train.zzz=3: check the spelling"),
])
def test_unknown_config_key_is_one_readable_line(override, expected):
    result = run_command([sys.executable, "-m", "bertjax.summary", "--config=configs/tiny.py", override], timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "\\n" not in lines[0] and "\\'" not in lines[0]


# ---------------------------------------------------------------------------------------------------
# The data section (bertjax/data/settings.py): every key checked once, when it is read
# ---------------------------------------------------------------------------------------------------


def data_section(**overrides):
    """configs/common.py's data section as a dict (a ConfigDict refuses values of another type itself)."""
    from configs import common

    return {**common.base_config().data.to_dict(), **overrides}


@pytest.mark.parametrize("overrides,message", [
    (dict(source="wiki"), "data.source='wiki' is not one of 'demo', 'text', 'tfds', 'parquet', 'hf_datasets', "
                          "'prepared', 'synthetic'"),
    (dict(text_format="csv"), "data.text_format='csv' is not one of 'sentences', 'documents', 'jsonl'"),
    (dict(objective="mlm"), "data.objective='mlm' is not one of 'nsp', 'sop', 'none'"),
    (dict(tokenizer="unigram"), "data.tokenizer='unigram' is not one of 'wordpiece', 'sentencepiece', 'bpe'"),
    (dict(sentence_splitter="klingon"), "data.sentence_splitter='klingon' is not one of 'default', 'multilingual'"),
    (dict(packing="yes"), "data.packing='yes': set True or False"),
    (dict(max_sequences_per_row=0), "data.max_sequences_per_row=0: set a whole number of at least 1"),
    (dict(max_sequences_per_row=2.5), "data.max_sequences_per_row=2.5"),
    (dict(packing_window=0), "data.packing_window=0"),
    (dict(max_seq_length=-1), "data.max_seq_length=-1"),
    (dict(mask_rate=1.0), "data.mask_rate=1.0 must lie in (0, 1) (BERT 0.15, ModernBERT 0.3)"),
    (dict(eval_mask_rate=0.0), "data.eval_mask_rate=0.0 must lie in (0, 1)"),
    (dict(masked_lm_prob=1.5), "data.masked_lm_prob=1.5 must lie in (0, 1)"),
    (dict(eval_fraction=1.5), "data.eval_fraction=1.5 must lie in [0, 1]"),
    (dict(short_seq_prob=-0.1), "data.short_seq_prob=-0.1 must lie in [0, 1]"),
    (dict(mask_token_fraction=0.9, random_token_fraction=0.2),
     "data.mask_token_fraction=0.9 and data.random_token_fraction=0.2 must be >= 0 and add up to at most 1"),
    (dict(input_pattern=3), "data.input_pattern=3: set a string"),
    (dict(seed=-1), "data.seed=-1: set a whole number of at least 0"),
    (dict(bogus=1), "data.bogus is not a key of the data section (configs/common.py)"),
    (dict(mixture=(dict(source="text", input_pattern=7, weight=1),)), "data.mixture[0] input_pattern=7: set a string"),
])
def test_bad_data_settings_are_one_line(overrides, message):
    from bertjax.data.settings import DataSettings

    with pytest.raises(ValueError) as error:
        DataSettings.from_config(data_section(**overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_data_settings_resolve_older_keys_and_mixtures():
    from bertjax.data.settings import DataSettings, MixtureSource

    settings = DataSettings.from_config(data_section(mask_rate=0.3, masked_lm_prob=0.2, eval_mask_rate=None))
    assert (settings.mask_rate, settings.held_out_mask_rate) == (0.2, 0.2)
    assert DataSettings(mask_rate=0.3, eval_mask_rate=0.15).held_out_mask_rate == 0.15
    mixed = DataSettings.from_config(data_section(source="text", input_pattern="books/*.txt", mixture=(
        dict(source="parquet", input_pattern="web/*.parquet", weight=4), dict(source="demo", weight=1))))
    assert mixed.mixture == (
        MixtureSource(DataSettings(source="parquet", input_pattern="web/*.parquet"), 4.0),
        MixtureSource(DataSettings(source="demo", input_pattern="books/*.txt"), 1.0),
    )
    # A section with keys left out (a config written before them) takes configs/common.py's values.
    assert DataSettings.from_config({"source": "text"}) == DataSettings(source="text")
