"""The config files: their model shapes against the one size table, and loading them as programs do
(by path, from any working directory, with a recipe and --config overrides)."""

import json
import os
import pathlib
import runpy
import sys

import pytest


from bertjax.models.config import SIZES, BertConfig
from conftest import run_command  # tests/ is on sys.path under pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHAPE = ("num_layers", "hidden_size", "num_heads", "intermediate_size")

# What a program does with --config=FILE[:recipe] --config.key=value, run from another directory.
LOAD = """
import json, sys
from absl import flags
from ml_collections import config_flags
values = flags.FlagValues()
config_flags.DEFINE_config_file("config", None, "", flag_values=values)
try:
    values(["prog", *sys.argv[1:]])
    config = values.config
except Exception as e:  # absl reports the config file's error as a flags.Error
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"num_layers": config.model.num_layers, "max_seq_length": config.data.max_seq_length,
                      "learning_rate": config.optimizer.learning_rate, "num_steps": config.train.num_steps}))
"""


# configs/<family>_<size>.py: the model families beside BERT's size files (DESIGN.md, wave 3).
FAMILY_FILES = {"roberta_base", "roberta_tiny", "albert_base", "albert_tiny", "modernbert_base", "modernbert_large",
                "modernbert_tiny", "electra_tiny", "electra_small", "electra_base", "mobilebert", "mobilebert_tiny",
                "ibbert", "ibbert_tiny"}


def test_every_size_has_a_config_file():
    files = {p.stem for p in (REPO / "configs").glob("*.py")} - {"__init__", "common"}
    assert files == set(SIZES) | FAMILY_FILES


@pytest.mark.parametrize("name", sorted(FAMILY_FILES))
def test_family_config_file_is_a_valid_model(name):
    """Each family file's model section makes a BertConfig (the family's options agree with each other)."""
    config = runpy.run_path(str(REPO / "configs" / f"{name}.py"))["get_config"]()
    cfg = BertConfig.from_dict(config.model.to_dict(), platform="cpu")
    family = name.split("_")[0]
    # RoBERTa: positions from [PAD]'s id + 1, and bertjax vocabularies put [PAD] at 0.
    expected = {"roberta": ("none", 1, "learned"), "albert": ("sop", 0, "learned"),
                "modernbert": ("none", 0, "rotary"), "electra": ("none", 0, "learned"),
                "mobilebert": ("nsp", 0, "learned"), "ibbert": ("nsp", 0, "learned")}[family]
    assert (config.data.objective, cfg.position_offset, cfg.position_embedding) == expected


@pytest.mark.parametrize("size", SIZES)
def test_config_file_model_shape_is_the_size_table(size):
    """Each file writes its shape out; bertjax.models.config.SIZES (through BertConfig.from_size) is the source."""
    config = runpy.run_path(str(REPO / "configs" / f"{size}.py"))["get_config"]()
    expected = BertConfig.from_size(size)
    assert {k: config.model[k] for k in SHAPE} == {k: getattr(expected, k) for k in SHAPE}


def load(tmp_path, *args):
    result = run_command([sys.executable, "-c", LOAD, *args], cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_config_file_loads_by_path_from_another_directory(tmp_path):
    large = REPO / "configs" / "large.py"
    assert load(tmp_path, f"--config={large}:adam_seq512", "--config.train.num_steps=7") == dict(
        num_layers=24, max_seq_length=512, learning_rate=1e-5, num_steps=7)
    error = load(tmp_path, f"--config={large}:lamb_phase3")["error"]
    assert "unknown recipe 'lamb_phase3' for configs/large.py: choose one of adam, adam_seq512" in error


def test_data_objective_and_mask_keys_are_written_out():
    from configs import common

    data = common.base_config().data
    assert data.objective == "nsp" and data.mask_rate == 0.15 and data.eval_mask_rate is None
    assert (data.mask_token_fraction, data.random_token_fraction) == (0.8, 0.1)
    assert "masked_lm_prob" not in data  # the older name is read where a config sets it, not defaulted


def test_objective_and_mask_rates_from_the_command_line(tmp_path):
    tiny = REPO / "configs" / "tiny.py"
    code = LOAD.replace('{"num_layers": config.model.num_layers', '{"objective": config.data.objective, '
                        '"eval_mask_rate": config.data.eval_mask_rate, "num_layers": config.model.num_layers')
    result = run_command([sys.executable, "-c", code, f"--config={tiny}", "--config.data.objective=sop",
                          "--config.data.eval_mask_rate=0.15"], cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["objective"] == "sop" and out["eval_mask_rate"] == 0.15


def test_data_settings_defaults_are_configs_common():
    """bertjax.data.settings.DataSettings is the data section typed: the same keys, the same defaults."""
    import dataclasses

    from bertjax.data.settings import DataSettings
    from configs import common

    data = common.base_config().data
    fields = {field.name: field.default for field in dataclasses.fields(DataSettings)}
    assert set(fields) == set(data.keys())
    for key, default in fields.items():
        assert default == data[key] and type(default) is type(data[key]), key
    assert DataSettings.from_config(data) == DataSettings()


@pytest.mark.parametrize("name,ratio", [("electra_tiny", 4), ("electra_small", 4), ("electra_base", 3)])
def test_electra_configs_have_the_paper_s_generator_and_pass_the_run_s_checks(name, ratio):
    """Clark et al. 2020: the generator 1/4 of the discriminator's width (Small), 1/3 (Base); loss weight 50."""
    from bertjax.runs import config_checks

    config = runpy.run_path(str(REPO / "configs" / f"{name}.py"))["get_config"]()
    assert config.model.hidden_size == ratio * config.electra.generator_hidden_size
    assert config.electra.discriminator_weight == 50.0
    config_checks.check_pretraining(config)
