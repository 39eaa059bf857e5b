"""Phases of a run (runs/pretraining.py): a run continuing another's checkpoint with a new sequence length,
RoPE thetas, rate, schedule and batch; the line that names every change; the optimizer state carried with
its schedule restarted; learned position tables that cannot carry over; ModernBERT's three recipes."""

import dataclasses
import runpy

import jax
import numpy as np
import optax
import pytest
from conftest import REPO, copy_of, shared_directory, small_run_settings, write_word_corpus

from bertjax.runs import config_checks, phases, pretraining, start
from bertjax.training import checkpoint, pretraining_step
from bertjax.training.checkpoint_meta import CheckpointMeta
from bertjax.training.state import root_keys


def recipe_config(config_file: str, recipe: str, settings: dict | None = None):
    config = runpy.run_path(str(REPO / config_file))["get_config"](recipe)
    for key, value in (settings or {}).items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def starting_state(config, workdir):
    """(the state a run of `config` in `workdir` starts from, as pretrain() restores it, its setup): no step run."""
    config, _ = config_checks.check_pretraining(config)
    layout = start.make_layout(config.mesh, config.logical_axis_rules, config.train.batch_size,
                               config.train.grad_accum_steps)
    init_key, _ = root_keys(config.train.seed, config.train.dropout_rng)
    setup = pretraining_step.setup(config, layout.mesh, layout.rules, init_key)
    checkpointer = pretraining.make_checkpointer(config, str(workdir), setup.abstract_state)
    try:
        with layout.active():
            parent = phases.read_parent(config.train.init_from, config, "train.init_from")
            return pretraining.restore(config, setup, checkpointer, init_key, parent), setup
    finally:
        checkpointer.close()


# --------------------------------------------------------------------------------------------------- recipes

@pytest.mark.parametrize("name,lr,start_batch,batch", [("modernbert_base", 8e-4, 768, 4608),
                                                       ("modernbert_large", 5e-4, 448, 4928)])
def test_modernbert_recipes_are_the_paper_s_phases(name, lr, start_batch, batch, tmp_path):
    """Warner et al. 2024: pretrain at 1,024 (30% masking, StableAdamW betas (0.9, 0.98), warmup then
    constant, batch warmup), extend over 250B tokens at 8,192 with the global theta 10k -> 160k, lr 3e-4,
    batch 576, constant; decay over 50B tokens by 1 - sqrt; the later two carry the optimizer state."""
    pretrain, extend, decay = (recipe_config(f"configs/{name}.py", r) for r in ("pretrain", "extend", "decay"))
    assert (pretrain.data.max_seq_length, pretrain.data.mask_rate, pretrain.optimizer.learning_rate) == (1024, 0.3, lr)
    assert pretrain.optimizer.name == "decoupled_stable_adamw" and (pretrain.optimizer.b1, pretrain.optimizer.b2) == (
        0.9, 0.98)
    assert (pretrain.schedule.decay, pretrain.schedule.decay_steps) == ("wsd", 0) and pretrain.schedule.warmup_steps
    assert (pretrain.train.batch_warmup_start, pretrain.train.batch_size) == (start_batch, batch)
    assert (pretrain.model.rotary_theta, pretrain.model.global_rotary_theta) == (10000.0, 10000.0)
    for phase in (extend, decay):
        assert (phase.data.max_seq_length, phase.train.batch_size, phase.optimizer.learning_rate) == (8192, 576, 3e-4)
        assert (phase.model.rotary_theta, phase.model.global_rotary_theta) == (10000.0, 160000.0)
        assert phase.train.init_from_optimizer and not phase.train.batch_warmup_start
        assert phase.data.max_predictions_per_seq >= 0.3 * 8192 and phase.optimizer.name == pretrain.optimizer.name
    tokens = lambda c: c.train.num_steps * c.train.batch_size * c.data.max_seq_length  # noqa: E731
    assert tokens(extend) == pytest.approx(250e9, rel=0.002) and tokens(decay) == pytest.approx(50e9, rel=0.002)
    assert (extend.schedule.warmup_steps, extend.schedule.decay_steps) == (0, 0)  # constant
    assert (decay.schedule.warmup_steps, decay.schedule.decay_steps) == (0, decay.train.num_steps)  # 1 - sqrt to 0
    assert extend.train.continues == f"configs/{name}.py:pretrain"
    assert decay.train.continues == f"configs/{name}.py:extend"
    config_checks.check_pretraining(pretrain)
    with pytest.raises(ValueError) as error:  # the parent run is the user's to name
        config_checks.check_pretraining(extend)
    assert str(error.value) == (f"this recipe continues a run of configs/{name}.py:pretrain: set "
                                "--config.train.init_from=<that run's workdir>")
    decay.train.init_from = str(tmp_path)
    config_checks.check_pretraining(decay)


def test_modernbert_tiny_phases_are_sized_for_a_cpu():
    pretrain, extend, decay = (recipe_config("configs/modernbert_tiny.py", r) for r in ("pretrain", "extend", "decay"))
    assert pretrain.data.source == extend.data.source == "demo"
    assert (pretrain.data.max_seq_length, extend.data.max_seq_length, decay.data.max_seq_length) == (1024, 8192, 8192)
    assert extend.model.attention_impl == decay.model.attention_impl == "blockwise"  # a CPU holds the 8,192-token row
    assert (pretrain.model.global_rotary_theta, extend.model.global_rotary_theta) == (10000.0, 160000.0)
    assert decay.schedule.decay_steps == decay.train.num_steps
    config_checks.check_pretraining(pretrain)
    assert runpy.run_path(str(REPO / "configs/modernbert_tiny.py"))["get_config"]().data.max_seq_length == 128


def test_phase_keys_are_checked_in_one_line(tmp_path):
    base = recipe_config("configs/modernbert_tiny.py", "one_phase")
    for settings, message in [
        ({"train.extend_positions": "interpolate"}, "train.extend_positions='interpolate': choose one of"),
        ({"train.init_from_optimizer": True}, "train.init_from_optimizer=True carries the optimizer state of"),
    ]:
        config = recipe_config("configs/modernbert_tiny.py", "one_phase", settings)
        with pytest.raises(ValueError) as error:
            config_checks.check_pretraining(config)
        assert message in str(error.value) and "\n" not in str(error.value)
    config_checks.check_pretraining(base)


# --------------------------------------------------------------------------------------------------- a phase

PHASE_SHAPES = {"model.num_layers": 2, "model.hidden_size": 64, "model.num_heads": 2, "model.intermediate_size": 96,
                "model.attention_impl": "xla", "train.batch_size": 8, "train.grad_accum_steps": 1,
                "train.batch_warmup_start": 0, "schedule.warmup_steps": 1, "logging.log_every": 1,
                "logging.eval_batches": 1}


@pytest.fixture(scope="module")
def modernbert_parent(tmp_path_factory):
    """A ModernBERT-tiny-shaped :pretrain run of 3 steps at seq 32 on the small run's word corpus."""

    def build(root):
        write_word_corpus(root)
        settings = small_run_settings(root, **PHASE_SHAPES, **{
            "data.max_predictions_per_seq": 10, "train.num_steps": 3, "checkpoint.every_steps": 3,
            "logging.eval_every": 3})
        pretraining.pretrain(recipe_config("configs/modernbert_tiny.py", "pretrain", settings), str(root / "run"))

    root = shared_directory(tmp_path_factory, "modernbert-phase-1", build)
    return dict(corpus=root, workdir=root / "run")


@pytest.mark.slow
def test_a_phase_says_its_changes_and_starts_from_the_parent_s_moments(modernbert_parent, tmp_path, capsys):
    """:extend from the :pretrain run at twice the length with the global theta raised: the start names
    every change, and the state it starts from holds the parent's parameters and moments (their count too)
    with the step and the schedule at 0."""
    parent = modernbert_parent["workdir"]
    settings = small_run_settings(modernbert_parent["corpus"], **PHASE_SHAPES, **{
        "data.max_seq_length": 64, "data.max_predictions_per_seq": 20, "train.num_steps": 1,
        "logging.eval_every": 100, "checkpoint.every_steps": 100, "train.init_from": str(parent)})
    config = recipe_config("configs/modernbert_tiny.py", "extend", settings)
    pretraining.pretrain(config, str(tmp_path / "phase2"))
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(f"phase from {parent}: "))
    for change in ("data.max_seq_length 32 -> 64", "model.global_rotary_theta 10000 -> 160000",
                   "optimizer.learning_rate 0.001 -> 0.000375", "train.init_from_optimizer False -> True"):
        assert change in line, line
    assert "model.rotary_theta" not in line and "train.init_from " not in line
    assert f"optimizer state from {parent} (step 3)" in out

    state, setup = starting_state(config, tmp_path / "fresh")
    checkpointer = checkpoint.Checkpointer(str(copy_of(parent, tmp_path / "parent")), every_steps=100, keep=3)
    parent_state = checkpointer.restore_latest(setup.abstract_state.params, setup.abstract_state.opt_state)
    checkpointer.close()
    assert int(state.step) == 0 and parent_state.step == 3
    jax.tree_util.tree_map(np.testing.assert_array_equal, state.params, parent_state.params)
    schedules = lambda s: [n for n in jax.tree_util.tree_leaves(  # noqa: E731
        s, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)) if isinstance(n, optax.ScaleByScheduleState)]
    assert [int(n.count) for n in schedules(parent_state.opt_state)] == [3]
    assert [int(n.count) for n in schedules(state.opt_state)] == [0]  # the new phase's schedule from its start
    restarted = phases.restarted_schedule(parent_state.opt_state)
    jax.tree_util.tree_map(np.testing.assert_array_equal, state.opt_state, restarted)  # moments and their count
    moments = [leaf for leaf in jax.tree_util.tree_leaves(state.opt_state) if leaf.ndim]
    assert moments and any(np.abs(np.asarray(m)).max() > 0 for m in moments)


TINY_BERT = {"data.source": "synthetic", "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
             "model.num_layers": 1, "model.hidden_size": 32, "model.num_heads": 2, "model.intermediate_size": 64,
             "model.vocab_size": 128, "model.max_position_embeddings": 64, "train.batch_size": 8, "train.num_steps": 2}


def tiny_bert_config(**changes):
    config = runpy.run_path(str(REPO / "configs/tiny.py"))["get_config"]()
    for key, value in {**TINY_BERT, **changes}.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.fixture(scope="module")
def bert_parent(tmp_path_factory):
    """A checkpoint of a one-layer BERT (a learned table of 64 rows, adamw) as a run writes it, untrained."""
    workdir = tmp_path_factory.mktemp("bert-parent")
    config = tiny_bert_config()
    state, setup = starting_state(config, workdir)
    meta = CheckpointMeta(1, dataclasses.asdict(setup.bert_config), config.optimizer.to_dict(), config=config.to_dict())
    checkpointer = pretraining.make_checkpointer(config, str(workdir), setup.abstract_state)
    checkpointer.save(1, state.params, state.opt_state, meta, force=True)
    checkpointer.wait()
    checkpointer.close()
    return workdir, state


def test_learned_positions_shorter_than_the_new_table_are_refused_in_one_line(bert_parent, tmp_path):
    parent, _ = bert_parent
    longer = {"train.init_from": str(parent), "model.max_position_embeddings": 128}
    with pytest.raises(ValueError) as error:
        starting_state(tiny_bert_config(**longer), tmp_path / "refused")
    message = str(error.value)
    assert "learned position table of 64 rows, the config model.max_position_embeddings=128" in message
    assert "train.extend_positions=copy" in message and "\n" not in message
    other = tiny_bert_config(**{"train.init_from": str(parent), "optimizer.name": "lamb",
                                "train.init_from_optimizer": True})
    with pytest.raises(ValueError) as error:
        starting_state(other, tmp_path / "other-optimizer")
    assert "optimizer.name='adamw', whose state is not 'lamb''s" in str(error.value)


def test_extend_positions_copy_tiles_the_learned_table(bert_parent, tmp_path):
    parent, saved = bert_parent
    config = tiny_bert_config(**{"train.init_from": str(parent), "model.max_position_embeddings": 128,
                                 "train.extend_positions": "copy"})
    state, _ = starting_state(config, tmp_path / "copied")
    old = np.asarray(saved.params["bert"]["embeddings"]["position_embeddings"]["embedding"])
    new = np.asarray(state.params["bert"]["embeddings"]["position_embeddings"]["embedding"])
    assert new.shape == (128, old.shape[1])
    np.testing.assert_array_equal(new, np.concatenate([old, old]))


def test_copied_positions_keep_the_offset_rows():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)  # 2 offset rows (RoBERTa's), 4 positions
    out = phases.copied_positions(table, 12, offset=2)
    assert out.shape == (12, 2)
    np.testing.assert_array_equal(out[:6], table)
    np.testing.assert_array_equal(out[6:10], table[2:])
    np.testing.assert_array_equal(out[10:], table[2:4])


def test_config_changes_name_each_key_from_the_parent_s_json():
    parent = {"data": {"max_seq_length": 1024, "mixture": [], "vocab_path": "runs/a/vocab.txt"},
              "model": {"global_rotary_theta": 10000.0},
              "optimizer": {"learning_rate": 8e-4}, "train": {"init_from": None}}
    config = recipe_config("configs/modernbert_base.py", "extend", {"train.init_from": "runs/a"})
    assert phases.config_changes(parent, config) == [
        "data.max_seq_length 1024 -> 8192", "model.global_rotary_theta 10000 -> 160000",
        "optimizer.learning_rate 0.0008 -> 0.0003"]
