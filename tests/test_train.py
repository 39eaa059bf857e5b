"""The training program: meshes against one device, gradient accumulation, exact resume after SIGKILL,
SIGTERM, a broken checkpoint, NaN, bad settings, init_from, bertjax.load, and the tiny config learning."""

import json
import runpy
import signal
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import (REPO, TINY_RUN_SETTINGS, config_flags, copy_of, run_command, start_command, tiny_config,
                      train_losses, wait_for)

from bertjax.runs import pretraining as pretraining_runs
from bertjax.training import sharding
from bertjax.training import pretraining_step
from bertjax.training import workdir as workdirs
from bertjax.data import synthetic

# Every test here compiles and runs training steps.
pytestmark = pytest.mark.slow


def small_config(**train_overrides):
    config = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    config.model.update(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128, vocab_size=96,
                        max_position_embeddings=64)
    config.data.update(source="synthetic", max_seq_length=32, max_predictions_per_seq=5)
    config.train.update(batch_size=16, num_steps=10, **train_overrides)
    config.schedule.warmup_steps = 2
    return config


def run_steps(config, mesh_shape, num_steps=4, devices=None):
    """Losses and final params of num_steps train steps, as train.py runs them, on the given mesh."""
    mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)), devices)
    rules = sharding.logical_rules(config.logical_axis_rules)
    init_key, dropout_key = jax.random.split(jax.random.key(config.train.seed))
    setup = pretraining_step.setup(config, mesh, rules, init_key)
    data_sharding = sharding.batch_sharding(mesh, rules)
    step_fn, _ = setup.compile_steps(data_sharding, config.train.grad_accum_steps)
    state = setup.init(init_key)
    losses = []
    with jax.set_mesh(mesh):
        for step in range(num_steps):
            host = synthetic.synthetic_batch(step, batch_size=config.train.batch_size,
                                             max_seq_length=config.data.max_seq_length,
                                             max_predictions_per_seq=config.data.max_predictions_per_seq,
                                             vocab_size=config.model.vocab_size)
            state, sums = step_fn(state, sharding.global_batch(host, data_sharding), dropout_key)
            losses.append(float(sums["loss_sum"]))
    return np.array(losses), state, setup


def _sharding_constraints(lowered_text: str) -> int:
    return lowered_text.count("sdy.sharding_constraint") + lowered_text.count("@Sharding")


@pytest.mark.mesh
def test_the_step_keeps_its_activation_shardings_wherever_it_is_lowered():
    """The model's logical activation constraints hold in the compiled step even when the caller (the
    planner, the benchmark) lowers it without entering the logical axis rules itself: without them the
    partitioner chose its own layouts, and fsdp over every chip asked for 100 GiB per chip."""
    config = small_config()
    mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1})
    rules = sharding.logical_rules(config.logical_axis_rules)
    init_key, dropout_key = jax.random.split(jax.random.key(0))
    setup = pretraining_step.setup(config, mesh, rules, init_key)
    data_sharding = sharding.batch_sharding(mesh, rules)
    host = synthetic.synthetic_batch(0, batch_size=16, max_seq_length=32, max_predictions_per_seq=5, vocab_size=96)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=data_sharding) for k, v in host.items()}
    # Two jitted steps, so that neither lowering comes from the other's trace cache.
    with jax.set_mesh(mesh):
        bare = setup.compile_steps(data_sharding, 1)[0].lower(setup.abstract_state, batch, dropout_key).as_text()
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        under_rules = setup.compile_steps(data_sharding, 1)[0].lower(setup.abstract_state, batch,
                                                                     dropout_key).as_text()
    assert _sharding_constraints(under_rules) > 10
    assert _sharding_constraints(bare) == _sharding_constraints(under_rules)


def layer_config(scan_layers):
    config = small_config()
    config.model.scan_layers = scan_layers
    return config


@pytest.fixture(scope="module")
def one_device_runs():
    """The reference, per layer layout (scanned and unrolled init differently, so each has its own)."""
    return {scan: run_steps(layer_config(scan), (1, 1, 1), devices=jax.devices()[:1]) for scan in (False, True)}


# Each mesh shape once; the layers unrolled (the default) on two of them, scanned on the other two.
@pytest.mark.mesh
@pytest.mark.parametrize("mesh_shape,scan_layers", [((8, 1, 1), False), ((1, 8, 1), True), ((2, 2, 2), True),
                                                    ((1, 2, 4), False)])
def test_meshes_give_the_losses_of_one_device(one_device_runs, mesh_shape, scan_layers):
    assert jax.device_count() == 8
    losses, state, setup = run_steps(layer_config(scan_layers), mesh_shape)
    ref_losses, ref_state, _ = one_device_runs[scan_layers]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    # The parameters and the Adam moments really are laid out as the rules say.
    data, fsdp, tensor = mesh_shape
    word = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]  # [V, H] = (vocab, embed)
    assert word.addressable_shards[0].data.shape == (96 // tensor, 64 // fsdp)
    encoder = state.params["bert"]["encoder"]
    if scan_layers:
        kernel = encoder["layers"]["mlp"]["intermediate"]["kernel"]  # [L, H, F]: the layer axis is not sharded
        assert kernel.addressable_shards[0].data.shape == (2, 64 // fsdp, 128 // tensor)
    else:
        kernel = encoder["layers_1"]["mlp"]["intermediate"]["kernel"]  # [H, F]
        assert kernel.addressable_shards[0].data.shape == (64 // fsdp, 128 // tensor)
    moments = [x for x in jax.tree_util.tree_leaves(state.opt_state) if getattr(x, "shape", None) == kernel.shape]
    assert moments and all(m.sharding.is_equivalent_to(kernel.sharding, kernel.ndim) for m in moments)


@pytest.mark.mesh
def test_gradient_accumulation_equals_a_larger_batch():
    # No dropout: microbatch i draws its own dropout mask, which a single big batch does not.
    def config(k):
        c = small_config(grad_accum_steps=k)
        c.model.update(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
        return c

    two = jax.devices()[:2]
    losses, state, _ = run_steps(config(1), (2, 1, 1), num_steps=3, devices=two)
    acc_losses, acc_state, _ = run_steps(config(4), (2, 1, 1), num_steps=3, devices=two)
    np.testing.assert_allclose(acc_losses, losses, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(acc_state.params), jax.tree_util.tree_leaves(state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


# --------------------------------------------------------------------------------------------------
# The program, as a user runs it
#
# The run under test is conftest's small_run: the small text-corpus run made once per test run, in-process
# as `python -m bertjax.train` makes it (runs/pretraining.py). The program itself runs where its signals,
# its exit code and its one-line errors are what is tested; it compiles what this process compiles
# (conftest.program_env), so that a run it starts and one resumed here agree bit for bit.
# --------------------------------------------------------------------------------------------------


def train_command(workdir, settings):
    return [sys.executable, "-m", "bertjax.train", "--config=configs/tiny.py", f"--workdir={workdir}",
            *config_flags(settings)]


def test_a_run_logs_evaluates_and_checkpoints(small_run):
    workdir = small_run["workdir"]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "split" not in r]
    assert [r["step"] for r in train_records] == list(range(1, 13))
    for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm"):
        assert all(np.isfinite(r[key]) for r in train_records), key
    assert all("tokens_per_second" in r for r in train_records[1:])
    # Packed by default (data.packing): rows of several sequences, little padding, logged beside the speed.
    assert np.mean([r["padding_efficiency"] for r in train_records]) > 0.9
    assert [r["step"] for r in records if r.get("split") == "eval"] == [6, 12]
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [4, 8, 12]
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))


def test_sigkill_then_rerun_reproduces_every_step(small_run, tmp_path, capsys):
    workdir = tmp_path / "killed"
    proc = start_command(train_command(workdir, small_run["settings"]))
    # Kill it once the step-4 checkpoint is complete (Orbax renames a finished checkpoint into place): the
    # first one, so that the run cannot have finished its 12 steps by the time the signal lands.
    wait_for(lambda: (workdir / "checkpoints" / "4" / "params").is_dir(), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved < 12, "the run finished before it was killed"
    # The killed run's lock is left behind, and the re-run takes it over (its process is gone).
    assert json.loads((workdir / workdirs.LOCK_FILE).read_text())["pid"] == proc.pid
    pretraining_runs.pretrain(tiny_config(small_run["settings"]), str(workdir))  # the same command, re-run
    assert f"resumed from step {saved}" in capsys.readouterr().out
    assert not (workdir / workdirs.LOCK_FILE).exists()
    expected, got = train_losses(small_run["workdir"]), train_losses(workdir)
    for step in range(saved + 1, 13):
        assert got[step] == expected[step], step  # exactly, not approximately


def test_sigterm_saves_and_exits_cleanly(small_run, tmp_path):
    workdir = tmp_path / "preempted"
    proc = start_command(train_command(workdir, small_run["settings"]))
    wait_for(lambda: (workdir / "metrics.jsonl").exists() and len(train_losses(workdir)) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM: saved the checkpoint of step" in out
    saved = int(out.split("SIGTERM: saved the checkpoint of step ")[1].split(";")[0])
    assert (workdir / "checkpoints" / str(saved) / "params").is_dir() and saved < 12


def test_unreadable_latest_checkpoint_falls_back(small_run, tmp_path, capsys):
    workdir = copy_of(small_run["workdir"], tmp_path / "broken")
    # Truncate every data file of the newest checkpoint's parameters.
    for f in (workdir / "checkpoints" / "12" / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and f.suffix not in (".json",):
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    pretraining_runs.pretrain(tiny_config(small_run["settings"]), str(workdir))
    out = capsys.readouterr().out
    assert "checkpoint at step 12 is unreadable" in out
    assert "resumed from step 8" in out
    expected, got = train_losses(small_run["workdir"]), train_losses(workdir)
    assert all(got[s] == expected[s] for s in range(9, 13))
    assert list((workdir / "checkpoints").glob("unreadable-12-*"))  # kept aside, not deleted


def test_init_from_and_load(small_run, tmp_path, capsys):
    import bertjax

    trained = small_run["workdir"]
    settings = dict(small_run["settings"], **{"train.init_from": str(trained), "train.num_steps": 2,
                                              "logging.eval_every": 2})
    pretraining_runs.pretrain(tiny_config(settings), str(tmp_path / "phase2"))
    assert f"parameters from {trained}" in capsys.readouterr().out
    first = train_losses(tmp_path / "phase2")[1]
    assert first < train_losses(trained)[1]  # starts from trained parameters, not from scratch

    bert = bertjax.load(trained)
    out = bert.encode(["The old bridge was built.", "A museum."])
    assert out["sequence_output"].shape[:2] == out["input_ids"].shape and out["pooled_output"].shape == (2, 64)
    assert np.isfinite(out["sequence_output"]).all()


def test_bad_settings_and_nan_get_one_clear_line(small_run, tmp_path):
    def expect_error(result, *fragments):
        assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
        last = result.stderr.strip().splitlines()[-1]
        assert "Traceback" not in result.stderr and "error:" in last, result.stderr[-2000:]
        for fragment in fragments:
            assert fragment in last, (fragment, last)

    def program(workdir, **changes):
        return run_command(train_command(workdir, dict(small_run["settings"], **changes)))

    # The program: an unknown key (its flags), a mesh the devices cannot make (the run's first check), and
    # a run that diverges (a step's own check), each one line and exit 2.
    expect_error(run_command(train_command(tmp_path / "a", small_run["settings"]) + ["--config.train.bach_size=8"]),
                 "bach_size")
    expect_error(program(tmp_path / "b", **{"mesh.data": 3}), "does not match")
    expect_error(program(tmp_path / "d", **{"optimizer.learning_rate": 1e30, "optimizer.clip_norm": 0.0,
                                            "data.source": "synthetic", "data.input_pattern": "",
                                            "data.vocab_path": ""}),  # no corpus to read: diverging is all
                 "NaN or inf between steps")
    assert not list((tmp_path / "d" / "checkpoints").glob("[0-9]*"))  # nothing non-finite was saved


@pytest.mark.mesh
def test_a_batch_the_devices_cannot_split_is_one_value_error(tmp_path):
    """As the run raises it (the program's line is the ValueError's, as the mesh's in the test above)."""
    assert jax.device_count() == 8
    with pytest.raises(ValueError, match=r"train.batch_size=12.*multiple of 8"):
        pretraining_runs.pretrain(tiny_config({"data.source": "synthetic", "train.batch_size": 12}),
                                  str(tmp_path / "c"))


def test_tiny_config_learns_on_the_demo_corpus(tiny_run):
    """Held-out masked-LM accuracy far above always guessing the most frequent token (conftest's tiny_run:
    the README's tiny config, 400 steps of 32 x 64)."""
    evals = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines() if '"split"' in line]
    assert [e["step"] for e in evals] == [200, 400]
    accuracy = evals[-1]["mlm_accuracy"]

    from bertjax.data import inputs

    config = tiny_config(TINY_RUN_SETTINGS)
    held_out = inputs.build_inputs(config.data, workdir=str(tiny_run)).eval_batches(32, 10)
    labels = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in held_out])
    baseline = np.bincount(labels).max() / len(labels)
    # Measured: 0.078 after 300 steps, 0.091 after 300 of 450; the baseline is about 0.056.
    assert accuracy > 1.4 * baseline, (accuracy, baseline)


def test_continued_pretraining_from_hugging_face(tmp_path, capsys):
    """train.init_from=<a Hugging Face BERT directory>: the run starts, and its first logged MLM loss is
    transformers' BertForMaskedLM loss on the same (synthetic) batch with the same weights."""
    import torch
    import transformers

    shape = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf_model = transformers.BertForPreTraining(transformers.BertConfig(**shape, attn_implementation="eager")).eval()
    hf_dir = tmp_path / "hf"
    hf_model.save_pretrained(hf_dir)
    pretraining_runs.pretrain(tiny_config({
        "data.source": "synthetic", "data.max_seq_length": 32, "data.max_predictions_per_seq": 5,
        "model.vocab_size": 512, "model.hidden_size": 64, "model.num_heads": 2, "model.intermediate_size": 128,
        "model.max_position_embeddings": 64, "model.hidden_dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
        "train.batch_size": 8, "train.num_steps": 2, "logging.log_every": 1, "logging.eval_every": 100,
        "schedule.warmup_steps": 1, "train.init_from": str(hf_dir),
        "data.packing": False}),  # the first batch's loss is compared with HF's, unpacked
        str(tmp_path / "run"))
    assert f"parameters from {hf_dir}" in capsys.readouterr().out
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1

    batch = synthetic.synthetic_batch(0, batch_size=8, max_seq_length=32, max_predictions_per_seq=5,
                                      vocab_size=512)
    masked_lm = transformers.BertForMaskedLM.from_pretrained(hf_dir).eval()
    ids = torch.as_tensor(batch["input_ids"], dtype=torch.long)
    labels = torch.full(ids.shape, -100, dtype=torch.long)
    rows = np.arange(8)[:, None].repeat(5, axis=1)
    labels[rows, batch["masked_lm_positions"]] = torch.as_tensor(batch["masked_lm_ids"], dtype=torch.long)
    with torch.no_grad():
        expected = float(masked_lm(input_ids=ids,
                                   token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long),
                                   attention_mask=torch.as_tensor(batch["input_mask"], dtype=torch.long),
                                   labels=labels).loss)
    assert abs(first["mlm_loss"] - expected) < 1e-4 * expected, (first["mlm_loss"], expected)


def test_constant_guess_accuracy_is_the_most_frequent_masked_label_share():
    """The baseline the training log prints: Counter over the real (weight 1) labels of all batches."""
    import collections

    from bertjax.training import pretraining_step as pretraining_lib

    rng = np.random.default_rng(0)
    batches = [{"masked_lm_ids": rng.integers(0, 6, (4, 5)),
                "masked_lm_weights": (rng.random((4, 5)) < 0.7).astype(np.float32)}
               for _ in range(3)]
    labels = [int(i) for b in batches for i, w in zip(b["masked_lm_ids"].ravel(), b["masked_lm_weights"].ravel()) if w]
    expected = collections.Counter(labels).most_common(1)[0][1] / len(labels)
    assert pretraining_lib.constant_guess_accuracy(batches) == pytest.approx(expected)
    empty = [{"masked_lm_ids": np.zeros((2, 3), np.int64), "masked_lm_weights": np.zeros((2, 3), np.float32)}]
    assert pretraining_lib.constant_guess_accuracy(empty) is None
