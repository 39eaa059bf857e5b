"""BERT-of-Theseus (bertjax/compression/theseus.py, fine-tuning's `theseus` section): the mixed forward
against explicitly built models, p = 0 and p = 1 against their references, the draws and the schedule,
the program's run stopped and resumed exactly, and its successor loaded by bertjax.load."""

import functools
import json
import pathlib
import re
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import finetune_config, train_losses

from bertjax.compression import theseus
from bertjax.models import heads
from bertjax.models.config import BertConfig
from bertjax.runs import finetuning
from bertjax.tasks import steps
from bertjax.training import sharding
from bertjax.training import state as train_state
from configs.finetune import common as finetune_configs

KIND, LABELS = "classification", 3
PREDECESSOR = BertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2, intermediate_size=64,
                         max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
SUCCESSOR = theseus.successor_config(PREDECESSOR, 2)


def plain(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(tree)))


def init_params(cfg, seed, num_labels=LABELS):
    """Random params of the network's shapes (drawn in NumPy: nothing to compile)."""
    net = heads.network(KIND, cfg, num_labels)
    shapes = nn.unbox(jax.eval_shape(lambda key: net.init(key, **heads.dummy_inputs(KIND, 1, 16))["params"],
                                     jax.random.key(0)))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda a: rng.normal(0.0, 0.2, a.shape).astype(a.dtype), shapes)


def make_batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(1, 64, (8, 16)).astype(np.int32), "segment_ids": np.zeros((8, 16), np.int32),
             "input_mask": (np.arange(16) < rng.integers(4, 17, (8, 1))).astype(np.int32),
             "label": rng.integers(0, LABELS, (8,)).astype(np.int32), "example_weight": np.ones((8,), np.float32)}
            for _ in range(n)]


def explicit_model_loss(successor_params, predecessor_params, replaced, batch):
    """The mixed model built as a plain network: its layers the chosen modules' in order, the successor's
    embeddings, pooler and head."""
    pred = predecessor_params["bert"]["encoder"]
    succ = successor_params["bert"]["encoder"]
    chosen = []
    for g, r in enumerate(replaced):
        chosen += [succ[f"layers_{g}"]] if r else [pred[f"layers_{2 * g}"], pred[f"layers_{2 * g + 1}"]]
    cfg = BertConfig(**{**PREDECESSOR.__dict__, "num_layers": len(chosen)})
    encoder = {f"layers_{i}": p for i, p in enumerate(chosen)}
    params = dict(successor_params, bert=dict(successor_params["bert"], encoder=encoder))
    net = heads.network(KIND, cfg, LABELS)
    return steps.task_loss(params, batch, jax.random.key(0), net=net, loss=heads.head(KIND).loss)[0]


def test_the_mixed_model_is_the_chosen_modules_in_order():
    """The two mixed patterns of 4 -> 2 (all kept and all replaced: the p = 0 and p = 1 test below): the loss
    of the network made of those layers."""
    pred, succ = init_params(PREDECESSOR, 1), init_params(SUCCESSOR, 2)
    batch = make_batches(1)[0]
    net = heads.network(KIND, SUCCESSOR, LABELS)
    loss = jax.jit(functools.partial(theseus.theseus_loss, net=net, loss=heads.head(KIND).loss,
                                     predecessor=PREDECESSOR, successor=SUCCESSOR))
    layers = theseus.predecessor_layers(pred, PREDECESSOR)
    explicit = jax.jit(explicit_model_loss, static_argnums=2)
    for replaced in ((0, 1), (1, 0)):
        got = loss(succ, batch, jax.random.key(0), layers, jnp.asarray(replaced, bool))[0]
        np.testing.assert_allclose(got, explicit(succ, pred, replaced, batch), rtol=2e-5)


@pytest.fixture(scope="module")
def compression():
    """A successor Setup (the paper's start: predecessor layers 0 and 1) on 2 devices: {"setup", "fresh_state"
    (a function), "step" (rate -> the compiled step: one program for any rate), "pred", "data_sharding",
    "loss", "layers"}."""
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:2])
    rules = sharding.logical_rules(finetune_configs.finetune_config(KIND).logical_axis_rules)
    data_sharding = sharding.batch_sharding(mesh, rules)
    net = heads.network(KIND, SUCCESSOR, LABELS)
    tx = theseus.successor_layers_only(optax.adam(1e-2))
    init_key, _ = train_state.root_keys(0)
    setup = train_state.Setup.create(net, heads.dummy_inputs(KIND, 1, 16), tx, None, mesh, rules, init_key)
    pred = init_params(PREDECESSOR, 1)
    start = theseus.successor_params(pred, PREDECESSOR, SUCCESSOR)
    # The start's params and their optimizer state, in the step's shardings.
    fresh_state = jax.jit(lambda p: train_state.TrainState(jnp.int32(0), p, setup.tx.init(p)),
                          out_shardings=setup.state_sharding)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    layers = jax.device_put(theseus.predecessor_layers(pred, PREDECESSOR), replicated)
    loss = functools.partial(theseus.theseus_loss, net=net, loss=heads.head(KIND).loss, predecessor=PREDECESSOR,
                             successor=SUCCESSOR)
    step = lambda rate: theseus.compile_step(setup, loss, layers, rate, theseus.replacement_key(3), 2,  # noqa: E731
                                             data_sharding, 1)
    return dict(setup=setup, fresh_state=lambda: fresh_state(start), step=step, pred=pred,
                data_sharding=data_sharding, loss=loss, layers=layers)


def run_steps(step, state, batches, data_sharding, mesh, before=None):
    losses, sums_seen = [], []
    _, dropout_key = train_state.root_keys(0)
    with jax.set_mesh(mesh):
        for b in batches:
            if before is not None:
                before(state)
            state, sums = step(state, sharding.global_batch(b, data_sharding), dropout_key)
            losses.append(float(sums["loss_sum"]))
            sums_seen.append(jax.device_get(sums))
    return np.array(losses), state, sums_seen


@pytest.mark.mesh
def test_p0_is_the_frozen_predecessor_and_p1_fine_tunes_the_successor_alone(compression):
    c = compression
    setup, data_sharding, pred = c["setup"], c["data_sharding"], c["pred"]
    batches = make_batches(3, seed=1)
    # p = 0: every module the predecessor's, nothing that runs is trained: its loss on each batch.
    losses, state, sums = run_steps(c["step"](theseus.ReplaceRate(0.0)), c["fresh_state"](), batches, data_sharding,
                                    setup.mesh)
    pred_loss = jax.jit(functools.partial(steps.task_loss, net=heads.network(KIND, PREDECESSOR, LABELS),
                                          loss=heads.head(KIND).loss))
    expected = [pred_loss(pred, b, jax.random.key(0))[0] for b in batches]
    np.testing.assert_allclose(losses, expected, rtol=2e-5)
    assert [float(s["replaced_sum"]) for s in sums] == [0, 0, 0]
    # p = 1: the successor alone, trained as fine-tuning trains it with the same frozen parts and start.
    losses, state, sums = run_steps(c["step"](theseus.ReplaceRate(1.0)), c["fresh_state"](), batches, data_sharding,
                                    setup.mesh)
    assert [float(s["replaced_sum"]) for s in sums] == [2, 2, 2]
    reference = setup.compile_train_step(functools.partial(steps.task_loss, net=setup.net, loss=heads.head(KIND).loss),
                                         data_sharding, 1)
    ref_losses, ref_state, _ = run_steps(reference, c["fresh_state"](), batches, data_sharding, setup.mesh)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    assert len(set(np.round(losses, 5))) == 3  # it learns: the successor's layers change between steps
    for a, b in zip(jax.tree_util.tree_leaves(plain(state.params)), jax.tree_util.tree_leaves(plain(ref_state.params))):
        np.testing.assert_allclose(a, b, atol=1e-3)  # Adam: rounding-level gradient differences, lr-sized steps
    # The frozen parts kept the predecessor's values, and have no optimizer state.
    np.testing.assert_array_equal(plain(state.params)["classifier"]["kernel"], pred["classifier"]["kernel"])
    moments = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]]
    assert any(".mu" in m for m in moments) and all("encoder" in m for m in moments if ".mu" in m or ".nu" in m)


@pytest.mark.mesh
def test_each_step_draws_one_bernoulli_per_module_from_its_key(compression):
    """The step's choices are bernoulli(fold_in(key, step), p) per module, the same for the whole batch: its
    loss is the mixed model's with those choices (recomputed outside the step), and over many steps the
    draws' rate is p."""
    c = compression
    batches = make_batches(6, seed=2)
    key = theseus.replacement_key(3)
    seen = []
    losses, _, sums = run_steps(c["step"](theseus.ReplaceRate(0.5)), c["fresh_state"](), batches, c["data_sharding"],
                                c["setup"].mesh, before=lambda s: seen.append((int(s.step), plain(s.params))))
    p_loss = jax.jit(c["loss"])
    patterns = set()
    for (t, params), b, got, s in zip(seen, batches, losses, sums):
        u = jax.random.uniform(jax.random.fold_in(key, t), (2,))  # bernoulli(p) is u < p
        replaced = np.asarray(u < 0.5)
        patterns.add(tuple(replaced))
        assert float(s["replaced_sum"]) == replaced.sum() and float(s["replace_rate_sum"]) == 0.5
        expected = p_loss(params, b, jax.random.key(0), jax.device_get(c["layers"]), jnp.asarray(replaced))[0]
        np.testing.assert_allclose(got, expected, rtol=2e-5)
    assert len(patterns) > 1  # the steps drew different modules
    # Over 3000 module-steps at p = 0.3: within 5 standard deviations (a fixed key: it cannot flake).
    draws = jax.vmap(lambda t: theseus.replacement_draws(key, t, 3, 0.3))(jnp.arange(1000))
    assert abs(float(jnp.mean(draws)) - 0.3) < 5 * np.sqrt(0.3 * 0.7 / 3000)
    assert 0.2 < float(jnp.mean(draws[:, 0])) < 0.4 and 0.2 < float(jnp.mean(draws[:, 2])) < 0.4


def test_the_linear_schedule_and_bad_settings_are_one_line():
    linear = theseus.replace_rate(0.5, 0.3, 0.1)  # replace_rate unused where the schedule is given
    np.testing.assert_allclose([float(linear(t)) for t in (0, 1, 5, 7, 100)], [0.3, 0.4, 0.8, 1.0, 1.0], rtol=1e-6)
    assert float(theseus.replace_rate(0.5, None, None)(10_000)) == 0.5
    cases = [(lambda: theseus.replace_rate(1.5, None, None), "theseus.replace_rate=1.5 must lie in [0, 1]"),
             (lambda: theseus.replace_rate(0.5, -0.1, 0.1), "theseus.replace_rate_start=-0.1 must lie in [0, 1]"),
             (lambda: theseus.replace_rate(0.5, 0.3, -1e-4), "theseus.replace_rate_slope=-0.0001 must be >= 0"),
             (lambda: theseus.replace_rate(0.5, 0.3, None), "needs both theseus.replace_rate_start"),
             (lambda: theseus.check_predecessor(PREDECESSOR, 3, "p"), "does not divide the predecessor's 4 layers"),
             (lambda: theseus.check_predecessor(PREDECESSOR, 4, "p"), "must be a whole number in [1, 3]"),
             (lambda: theseus.check_predecessor(BertConfig(**{**PREDECESSOR.__dict__, "num_hidden_groups": 1}), 2,
                                                "theseus.predecessor=x"), "(ALBERT): there are no modules")]
    for call, fragment in cases:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            call()


# --------------------------------------------------------------------------------------------------
# The program's run: python -m bertjax.finetune with a theseus section
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def predecessor(pretrained, tmp_path_factory):
    """A 'fine-tuned' keyword classifier of 4 layers in the vocabulary of conftest's `pretrained` (random
    weights: these tests check the run's mechanics, not what it learns), and small data files."""
    from bertjax.training import checkpoint
    from bertjax.training.checkpoint_meta import CheckpointMeta, TaskRecord, TokenizerRecord

    root = tmp_path_factory.mktemp("theseus")
    workdir = root / "predecessor"
    cfg = BertConfig(**{**pretrained["cfg"].__dict__, "num_layers": 4})
    params = init_params(cfg, 4, num_labels=2)
    meta = CheckpointMeta(step=1, model=cfg.__dict__, tokenizer=TokenizerRecord("wordpiece", "vocab.txt", True),
                          task=TaskRecord(KIND, KIND, ("no", "yes"), None, 32))
    checkpoint.save_params(str(workdir), checkpoint.BEST_DIR, 1, params, meta)
    shutil.copy(pathlib.Path(pretrained["workdir"]) / "vocab.txt", workdir / "vocab.txt")
    files = {}
    for split, lines in (("train", slice(0, 48)), ("validation", slice(0, 16))):
        source = pathlib.Path(pretrained["files"][split]).read_text().splitlines()
        files[split] = str(root / f"{split}.jsonl")
        pathlib.Path(files[split]).write_text("\n".join(source[lines]) + "\n")
    return dict(workdir=str(workdir), files=files)


def theseus_config(pretrained, made, **theseus_settings):
    """2 epochs of 3 steps (48 examples, batches of 16), 4 -> 2 layers, logging every step."""
    config = finetune_config(KIND, pretrained, labels=("no", "yes"), **made["files"])
    config.train.init_from = None
    config.data.max_seq_length = 32
    config.train.epochs = 2.0
    config.logging.log_every = 1
    config.theseus.update(**{"predecessor": made["workdir"], "successor_layers": 2, **theseus_settings})
    return config


@pytest.fixture(scope="module")
def compressed(pretrained, predecessor, tmp_path_factory):
    """The uninterrupted compression run (linear curriculum from 0.3, +0.1 a step): its workdir and summary."""
    config = theseus_config(pretrained, predecessor, replace_rate_start=0.3, replace_rate_slope=0.1)
    workdir = tmp_path_factory.mktemp("compressed") / "run"
    return dict(workdir=workdir, config=config, summary=finetuning.finetune(config, str(workdir)))


def test_a_stopped_compression_run_resumes_exactly(compressed, tmp_path):
    """Stopped after step 4 (saved, runs.start.Stopped), then re-run: the uninterrupted run's losses and the
    schedule's rates, step for step."""
    from conftest import finetune_stopped_then_resumed

    workdir = tmp_path / "stopped"
    finetune_stopped_then_resumed(compressed["config"], workdir, stop_at=4)
    expected, got = train_losses(compressed["workdir"]), train_losses(workdir)
    assert sorted(expected) == list(range(1, 7)) and got == expected
    lines = [json.loads(line) for line in (compressed["workdir"] / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["replace_rate"] for r in lines if "replace_rate" in r}
    np.testing.assert_allclose([rates[t] for t in range(1, 7)], [0.3, 0.4, 0.5, 0.6, 0.7, 0.8], rtol=1e-6)


def test_the_successor_loads_predicts_and_is_an_init_from(compressed, predecessor):
    """WORKDIR's model is the successor alone (2 layers): bertjax.load predicts what its prediction file
    says, and it is the train.init_from of successor fine-tuning."""
    import bertjax
    from bertjax.training import checkpoint

    workdir = compressed["workdir"]
    params, meta = checkpoint.restore_params(str(workdir / checkpoint.BEST_DIR))
    assert meta.model["num_layers"] == 2 and set(params["bert"]["encoder"]) == {"layers_0", "layers_1"}
    texts = [json.loads(line)["text"]
             for line in pathlib.Path(predecessor["files"]["validation"]).read_text().splitlines()]
    predicted = [line.split("\t")[1]
                 for line in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    model = bertjax.load(str(workdir))
    assert [p["label"] for p in model.predict(texts[:8])] == predicted[:8]
    # Successor fine-tuning reads it as train.init_from: a fine-tuning workdir of this task (its whole head).
    start = finetuning.load_pretrained(str(workdir), KIND, 2, {})
    assert start.whole_head and start.bert_config.num_layers == 2


def test_bad_theseus_settings_are_one_line(pretrained, predecessor, tmp_path):
    cases = [(dict(successor_layers=3), "theseus.successor_layers=3 does not divide the predecessor's 4 layers"),
             (dict(replace_rate=-0.5), "theseus.replace_rate=-0.5 must lie in [0, 1]"),
             (dict(predecessor=pretrained["workdir"], successor_layers=1),
              "is not a model fine-tuned on classification"),
             (dict(predecessor=str(tmp_path / "nowhere")), "theseus.predecessor=" + str(tmp_path / "nowhere"))]
    for settings, fragment in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=re.escape(fragment)):
            finetuning.finetune(theseus_config(pretrained, predecessor, **settings), str(tmp_path / "bad"))
    config = theseus_config(pretrained, predecessor)
    config.train.init_from = pretrained["workdir"]
    with pytest.raises(ValueError, match="unset train.init_from"):
        finetuning.finetune(config, str(tmp_path / "bad"))
    config = theseus_config(pretrained, predecessor)
    config.distill.teacher = predecessor["workdir"]
    with pytest.raises(ValueError, match="set one of them"):
        finetuning.finetune(config, str(tmp_path / "bad"))
