"""Distillation: the losses against torch (DistilBERT's own functions), the student made from the teacher's
layers, the step with the teacher as an argument (not trained, not saved, the loss going down), the
program's resume after SIGKILL, and task distillation's hook in fine-tuning (alpha=0 is plain fine-tuning exactly)."""

import functools
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bertjax.runs import finetuning, general_distillation
from bertjax.runs import pretraining as pretraining_runs
from bertjax.tasks import steps
from bertjax.compression import distillation, projections
from bertjax import init_from as pretrained_models
from bertjax.models import bert, heads
from bertjax.models.config import BertConfig
from bertjax.training import checkpoint, optim, pretraining_step, sharding
from bertjax.training.state import Setup
from bertjax.data import synthetic
from configs.distill import tiny as tiny_distill
from conftest import one_device_layout  # tests/ is on sys.path under pytest

SEQ, PREDS, BATCH = 16, 3, 8
TEACHER = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64,
               max_position_embeddings=32)
LAYERS = (0, 2)  # the student's, of the teacher's three


# configs/distill/tiny.py made small: "section.key" -> value, as the tests set them in-process and as a
# command line's --config.section.key=value.
SMALL = {**{f"model.{k}": v for k, v in TEACHER.items()}, "model.num_layers": 2, "model.hidden_dropout_rate": 0.0,
         "model.attention_dropout_rate": 0.0, "distill.student_layers": LAYERS, "data.source": "synthetic",
         "data.max_seq_length": SEQ, "data.max_predictions_per_seq": PREDS, "train.batch_size": BATCH,
         "train.num_steps": 4, "schedule.warmup_steps": 1, "optimizer.learning_rate": 3e-3,
         "checkpoint.every_steps": 2, "checkpoint.async_save": False, "logging.log_every": 1,
         "logging.eval_every": 2, "logging.eval_batches": 1}


def distill_config(**overrides):
    config = tiny_distill.get_config()
    for key, value in {**SMALL, **overrides}.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A 3-layer teacher saved as a pretraining workdir (random weights: what is taught does not matter here)."""
    workdir = str(tmp_path_factory.mktemp("teacher"))
    config = distill_config()
    config.model.num_layers = TEACHER["num_layers"]
    mesh, rules, _ = one_device_layout(config)
    setup = pretraining_step.setup(config, mesh, rules, jax.random.key(1))
    state = setup.init(jax.random.key(1))
    checkpointer = pretraining_runs.make_checkpointer(config, workdir, setup.abstract_state)
    pretraining_runs.Run(config, workdir, setup, checkpointer, pretraining_runs.Stream(None, [], None, None),
                         None).save(state, 1, True)
    checkpointer.wait()
    checkpointer.close()
    return dict(workdir=workdir, config=setup.bert_config, params=jax.device_get(state.params))


# ---------------------------------------------------------------------------------------------------
# The losses, against DistilBERT's torch functions
# ---------------------------------------------------------------------------------------------------


def test_losses_match_torch_kl_div_and_cosine_embedding_loss():
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(2, 3, 4, 11)).astype(np.float32) * 3  # [B, P, V]
    weights = (rng.random((3, 4)) < 0.6).astype(np.float32)
    temperature = 2.0
    got = float(distillation.soft_cross_entropy(student, teacher, weights, temperature))
    # DistilBERT: the masked positions selected, KLDivLoss(batchmean) of the softened log-probs, x T^2.
    rows = weights.reshape(-1) > 0
    s = torch.tensor(student.reshape(-1, 11)[rows]) / temperature
    t = torch.tensor(teacher.reshape(-1, 11)[rows]) / temperature
    want = torch.nn.functional.kl_div(torch.log_softmax(s, -1), torch.softmax(t, -1), reduction="batchmean")
    np.testing.assert_allclose(got, float(want) * temperature ** 2, rtol=1e-5)

    hs, ht = rng.normal(size=(2, 3, 5, 6)).astype(np.float32)  # [B, S, H]
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], np.float32)
    keep = mask.reshape(-1) > 0
    want = torch.nn.functional.cosine_embedding_loss(torch.tensor(hs.reshape(-1, 6)[keep]),
                                                     torch.tensor(ht.reshape(-1, 6)[keep]),
                                                     torch.ones(int(keep.sum())))
    np.testing.assert_allclose(float(distillation.cosine_loss(hs, ht, mask)), float(want), rtol=1e-5)
    assert float(distillation.soft_cross_entropy(teacher, teacher, weights, temperature)) == pytest.approx(0, abs=1e-6)


# ---------------------------------------------------------------------------------------------------
# The student, the step with the teacher
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scan_layers", [False, True])
def test_the_student_is_made_of_the_teachers_layers(teacher, scan_layers):
    layers = LAYERS
    config = distill_config(**{"model.scan_layers": scan_layers})
    student_config = distillation.student_config_from_teacher(teacher["config"], layers,
                                                              dict(scan_layers=scan_layers))
    assert (student_config.num_layers, student_config.hidden_size) == (2, 32)
    config = general_distillation.with_model(config, student_config)
    mesh, rules, _ = one_device_layout(config)
    setup = pretraining_step.setup(config, mesh, rules, jax.random.key(0))
    params = distillation.student_params(teacher["params"], teacher["config"], setup.bert_config, layers,
                                         setup.abstract_state.params)
    encoder = params["bert"]["encoder"]
    if scan_layers:
        encoder = bert.unstack_layers(encoder, setup.bert_config)
    for i, j in enumerate(layers):
        jax.tree_util.tree_map(np.testing.assert_array_equal, encoder[f"layers_{i}"],
                               teacher["params"]["bert"]["encoder"][f"layers_{j}"])
    for part in ("embeddings", "pooler"):
        jax.tree_util.tree_map(np.testing.assert_array_equal, params["bert"][part], teacher["params"]["bert"][part])
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["mlm_head"], teacher["params"]["mlm_head"])


@pytest.mark.parametrize("recipe,teacher_config,teacher_layers", [
    ("tiny", "tiny", 4), ("modernbert_tiny", "modernbert_tiny", 6), ("distilbert", "base", 12)])
def test_each_recipe_names_layers_its_teacher_has_and_writes_out_the_students_shape(recipe, teacher_config,
                                                                                    teacher_layers):
    """configs/distill/<recipe>.py against the teacher its docstring trains: its layers are the teacher's
    (ModernBERT's: each keeping its kind of attention), and its model section is the student they make."""
    import importlib

    config = importlib.import_module(f"configs.distill.{recipe}").get_config()
    model = dict(importlib.import_module(f"configs.{teacher_config}").get_config().model, num_layers=teacher_layers)
    teacher_cfg = BertConfig.from_dict(model, platform="cpu")
    student = distillation.student_config_from_teacher(teacher_cfg, config.distill.student_layers, {})
    shape = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
    assert {k: getattr(student, k) for k in shape} == {k: config.model[k] for k in shape}


def test_a_student_of_another_width_needs_alpha_cos_zero(teacher):
    narrow = BertConfig(**dict(TEACHER, hidden_size=16, num_layers=2))
    with pytest.raises(ValueError, match="distill.alpha_cos=1.0 compares last hidden states.*set distill.alpha_cos=0"):
        distillation.check_student(teacher["config"], narrow, distillation.LossWeights())
    distillation.check_student(teacher["config"], narrow, distillation.LossWeights(alpha_cos=0.0))
    with pytest.raises(ValueError, match="distinct layers of the teacher's 0..2"):
        distillation.check_layers(teacher["config"], (0, 3))


def test_steps_lower_the_loss_and_leave_the_teacher_alone(teacher):
    config = general_distillation.with_model(
        distill_config(**{"train.num_steps": 100}), distillation.student_config_from_teacher(
            teacher["config"], LAYERS, dict(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)))
    mesh, rules, data_sharding = one_device_layout(config)
    setup = pretraining_step.setup(config, mesh, rules, jax.random.key(0))
    teacher_net = bert.BertForPreTraining(teacher["config"])
    teacher_params = distillation.place_params(teacher_net, bert.dummy_batch(1, SEQ, PREDS), teacher["params"],
                                               mesh, rules)
    weights = distillation.LossWeights()
    loss_fn = functools.partial(distillation.pretraining_distillation_loss, net=setup.net, teacher_net=teacher_net,
                                weights=weights, objective="none")
    step = distillation.compile_step_with_teacher(setup, loss_fn, teacher_params, data_sharding, 1,
                                                  weights.mean_metrics("none"))
    state = setup.init(jax.random.key(0))
    batch = sharding.global_batch(synthetic.synthetic_batch(0, batch_size=BATCH, max_seq_length=SEQ,
                                                            max_predictions_per_seq=PREDS, vocab_size=64),
                                  data_sharding)
    keys = pretraining_step.batch_keys(False)
    losses = []
    with jax.set_mesh(mesh):
        for _ in range(5):
            state, sums = step(state, {k: batch[k] for k in keys}, jax.random.key(0))
            losses.append(float(sums["loss_sum"]))
    assert all(later < earlier for earlier, later in zip(losses[1:], losses[2:])), losses  # step 1's lr is 0
    assert losses[-1] < losses[0] - 0.3, losses
    # The step's loss is the recipe's sum of its parts.
    assert losses[-1] == pytest.approx(5 * float(sums["ce_loss"]) + 2 * float(sums["mlm_loss"])
                                       + float(sums["cos_loss"]), rel=1e-5)
    # The teacher was an argument: not donated, not changed, not in the state.
    jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(teacher_params), teacher["params"])
    assert set(state.params["bert"]["encoder"]) == {"layers_0", "layers_1"}


# ---------------------------------------------------------------------------------------------------
# The program: a pretraining workdir, resumed exactly
# ---------------------------------------------------------------------------------------------------


def train_losses(workdir):
    import json
    import pathlib

    records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "split" not in r}


# Every loss at once but the cosine (which needs one width): DistilBERT's soft targets and masked-LM labels,
# and TinyBERT's embeddings, hidden states and attention scores, into a fresh student half the teacher's
# width, whose learned projections are saved beside the optimizer state, never with the student. (A
# student made of the teacher's layers starts from other weights; it resumes through the same code.)
EVERY_LOSS = {"distill.student_layers": (), "model.hidden_size": 16, "model.intermediate_size": 32,
              "distill.alpha_ce": 1.0, "distill.alpha_mlm": 1.0, "distill.alpha_cos": 0.0,
              "distill.alpha_embedding": 1.0, "distill.alpha_hidden": 1.0, "distill.alpha_attention": 1.0,
              "distill.layer_map": (1, 3)}  # of the teacher's three layers


@pytest.mark.slow
def test_the_program_writes_a_pretraining_workdir_and_resumes_exactly_after_sigkill(teacher, tmp_path):
    from conftest import REPO, start_command, wait_for

    settings = {**SMALL, "distill.teacher": teacher["workdir"], "train.num_steps": 12, "logging.eval_every": 12,
                **EVERY_LOSS}
    uninterrupted = str(tmp_path / "uninterrupted")
    general_distillation.distill(distill_config(**settings), uninterrupted)
    losses = train_losses(uninterrupted)
    assert sorted(losses) == list(range(1, 13)) and all(np.isfinite(list(losses.values())))
    import json
    lines = [json.loads(x) for x in (tmp_path / "uninterrupted" / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in lines if "split" not in x]
    for name in ("ce_loss", "embedding_loss", "hidden_loss", "attention_loss"):  # each logged, and learned
        assert lines[-1][name] < lines[0][name], (name, lines[0][name], lines[-1][name])
    # The program, killed once its first checkpoint is complete; then run again on its workdir.
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "bertjax.distill", f"--config={REPO / 'configs/distill/tiny.py'}",
               f"--workdir={killed}"] + [f"--config.{key}={value}" for key, value in settings.items()]
    proc = start_command(command)
    wait_for(lambda: (killed / "checkpoints" / "2" / "params").is_dir(), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    saved = max(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert saved < 12, "the run finished before it was killed"
    general_distillation.distill(distill_config(**settings), str(killed))
    resumed = train_losses(killed)  # a step logged before the kill and again after it: the later
    assert [resumed[s] for s in range(saved + 1, 13)] == [losses[s] for s in range(saved + 1, 13)]
    final, _ = checkpoint.restore_params(uninterrupted)
    again, meta = checkpoint.restore_params(str(killed))
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, final)
    # The student alone is saved, and it loads as any pretrained model does.
    assert meta.distill == {"teacher": teacher["workdir"], "student_layers": []}
    assert set(final) == {"bert", "mlm_head", "nsp_head"}  # no projection among the student's params
    assert set(final["bert"]["encoder"]) == {"layers_0", "layers_1"}
    model = pretrained_models.load(pretrained_models.resolve(uninterrupted))
    assert (model.config.num_layers, model.config.hidden_size) == (2, 16) and model.task is None
    jax.tree_util.tree_map(np.testing.assert_array_equal, model.params, final)


# ---------------------------------------------------------------------------------------------------
# A teacher without a masked-LM head (a Hugging Face BertModel, a sentence-transformers BERT)
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def headless_teacher(tmp_path_factory):
    """A Hugging Face BertModel directory (an encoder and pooler, no masked-LM head) of TEACHER's shape,
    random, as save_pretrained writes it (model.safetensors under transformers' tensor names, config.json),
    with a vocab.txt. Written with safetensors directly: building transformers' BertModel takes 4 s here."""
    import json
    from safetensors.numpy import save_file

    directory = tmp_path_factory.mktemp("headless")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(TEACHER["vocab_size"] - 5)]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    h, f = TEACHER["hidden_size"], TEACHER["intermediate_size"]
    shapes = {"embeddings.word_embeddings.weight": (TEACHER["vocab_size"], h),
              "embeddings.position_embeddings.weight": (TEACHER["max_position_embeddings"], h),
              "embeddings.token_type_embeddings.weight": (2, h), "pooler.dense.weight": (h, h),
              "pooler.dense.bias": (h,),
              "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)}
    for j in range(TEACHER["num_layers"]):
        layer = f"encoder.layer.{j}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes.update({layer + name + ".weight": (h, h), layer + name + ".bias": (h,)})
        shapes.update({layer + "intermediate.dense.weight": (f, h), layer + "intermediate.dense.bias": (f,),
                       layer + "output.dense.weight": (h, f), layer + "output.dense.bias": (h,)})
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes.update({layer + norm + ".weight": (h,), layer + norm + ".bias": (h,)})
    rng = np.random.default_rng(0)
    state = {name: (0.02 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": TEACHER["vocab_size"],
              "hidden_size": h, "num_hidden_layers": TEACHER["num_layers"], "num_attention_heads": TEACHER["num_heads"],
              "intermediate_size": f, "max_position_embeddings": TEACHER["max_position_embeddings"],
              "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
              "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "pad_token_id": 0}
    (directory / "config.json").write_text(json.dumps(config))
    return dict(directory=str(directory), state=state)


def test_a_teacher_without_a_head_gives_its_layers_and_refuses_only_the_soft_target_loss(headless_teacher):
    """The run's own steps (general_distillation.distill: distill_settings, load_teacher, the student's
    config and params from the teacher's layers), on one device: the whole run on the eight-device mesh
    also saves the workdir, which takes 13 s here and is the same save_extracted whatever the teacher."""
    config = distill_config(**{"distill.teacher": headless_teacher["directory"], "train.num_steps": 0})
    weights, layers, extract_only = general_distillation.distill_settings(config)
    assert extract_only and weights.alpha_ce > 0  # the recipe's soft-target loss, which extraction never runs
    teacher = general_distillation.load_teacher(config, general_distillation.read_starts(config)[0], weights,
                                                extract_only)
    assert any(m.startswith("mlm_head") for m in teacher.missing)
    config = general_distillation.with_model(config, distillation.student_config_from_teacher(
        teacher.config, layers, {}))
    mesh, rules, _ = one_device_layout(config)
    setup = pretraining_step.setup(general_distillation.one_step(config), mesh, rules, jax.random.key(0))
    params = distillation.student_params(teacher.params, teacher.config, setup.bert_config, layers,
                                         setup.abstract_state.params)
    state = headless_teacher["state"]
    encoder = params["bert"]["encoder"]
    assert set(encoder) == {"layers_0", "layers_1"}
    for i, j in enumerate(LAYERS):
        jax.tree_util.tree_map(np.testing.assert_array_equal, encoder[f"layers_{i}"],
                               teacher.params["bert"]["encoder"][f"layers_{j}"])
        # and against torch's own tensors: a dense kernel is its weight transposed
        np.testing.assert_array_equal(encoder[f"layers_{i}"]["mlp"]["intermediate"]["kernel"],
                                      state[f"encoder.layer.{j}.intermediate.dense.weight"].T)
        np.testing.assert_array_equal(encoder[f"layers_{i}"]["mlp"]["output"]["kernel"],
                                      state[f"encoder.layer.{j}.output.dense.weight"].T)
    np.testing.assert_array_equal(params["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                  state["embeddings.word_embeddings.weight"])
    # Training without the soft targets (the masked-LM labels and the hidden-state cosine) needs no head;
    # with them, one line names the loss and the head.
    teacher_start = general_distillation.read_starts(config)[0]
    general_distillation.load_teacher(config, teacher_start, distillation.LossWeights(alpha_ce=0.0), False)
    with pytest.raises(ValueError) as raised:
        general_distillation.load_teacher(config, teacher_start, weights, False)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        f"distill.alpha_ce=5.0 (the soft-target masked-LM loss) reads the teacher's masked-LM head, and "
        f"distill.teacher={headless_teacher['directory']} has none (mlm_head")
    assert message.endswith("set distill.alpha_ce=0 (the masked-LM labels and the hidden-state cosine need no "
                            "head), or give a checkpoint with its pretraining heads (BertForPreTraining / "
                            "BertForMaskedLM)")


# ---------------------------------------------------------------------------------------------------
# Task distillation: the fine-tuning hook
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_task_distillation_is_exact_at_alpha_zero_and_follows_the_teacher_above():
    config = distill_config()
    mesh, rules, data_sharding = one_device_layout(config)
    student_cfg = BertConfig(**dict(TEACHER, num_layers=1, hidden_dropout_rate=0.0))
    net = heads.network("classification", student_cfg, 3)
    tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, 4)
    setup = Setup.create(net, heads.dummy_inputs("classification", 1, SEQ), tx, schedule, mesh, rules,
                         jax.random.key(0))
    # A fine-tuned teacher stands in as another random network (1 layer each: compiling is this test's time).
    teacher_net = heads.network("classification", BertConfig(**dict(TEACHER, num_layers=1)), 3)
    teacher_params = distillation.place_params(
        teacher_net, heads.dummy_inputs("classification", 1, SEQ),
        jax.jit(teacher_net.init)(jax.random.key(5), **heads.dummy_inputs("classification", 1, SEQ))["params"],
        mesh, rules)
    rng = np.random.default_rng(0)
    host = synthetic.synthetic_batch(0, batch_size=BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
                                     vocab_size=64)
    batch = sharding.global_batch({k: host[k] for k in steps.INPUT_KEYS} | {
        "label": rng.integers(0, 3, BATCH).astype(np.int32), "example_weight": np.ones(BATCH, np.float32)},
        data_sharding)
    inputs = [batch[k] for k in steps.INPUT_KEYS]
    teacher_probs = jax.nn.softmax(jax.jit(teacher_net.apply)({"params": teacher_params}, *inputs), -1)

    @jax.jit
    def kl_to_teacher(params):
        logits = net.apply({"params": params}, *inputs)
        return jnp.mean(jnp.sum(teacher_probs * (jnp.log(teacher_probs) - jax.nn.log_softmax(logits, -1)), -1))

    initial = jax.device_get(setup.init(jax.random.key(0)))

    def run(step_fn):
        state = jax.device_put(initial, setup.state_sharding)  # a fresh copy: the step donates it
        with jax.set_mesh(mesh):
            for _ in range(4):
                state, sums = step_fn(state, batch, jax.random.key(0))
        return state.params, float(kl_to_teacher(state.params)), sums

    plain = run(setup.compile_train_step(functools.partial(steps.task_loss, net=net,
                                                           loss=heads.classification_loss), data_sharding, 1))
    hook = functools.partial(distillation.task_distillation_step, setup, teacher_net, teacher_params, "classification",
                             2.0, data_sharding=data_sharding, grad_accum_steps=1)
    at_zero = run(hook(alpha=0.0))
    jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), at_zero[0], plain[0])
    assert float(at_zero[2]["loss_sum"]) == pytest.approx(float(plain[2]["loss_sum"]), rel=1e-6)
    at_one = run(hook(alpha=1.0))
    assert at_one[1] < 0.5 * plain[1], (at_one[1], plain[1])  # the student's distribution nears the teacher's
    assert "soft_loss_sum" in at_one[2]
    with pytest.raises(ValueError, match="supports classification.*not span"):
        distillation.check_task_distillation("span", 2.0, 0.5)


# ---------------------------------------------------------------------------------------------------
# The intermediate-layer losses (TinyBERT, BERT-PKD): against torch, written from the papers' formulas
# ---------------------------------------------------------------------------------------------------


def _recorded(hidden=None, scores=None):
    """What BertModel records, as distillation.layer_losses reads it."""
    out = {}
    if hidden is not None:
        out[bert.HIDDEN_STATES] = {"bert": {"layers": (tuple(hidden),)}}
    if scores is not None:
        out[bert.ATTENTION_SCORES] = {"bert": {"layers": (tuple(scores),)}}
    return out


@pytest.mark.parametrize("layer_map", ["skip", "last"])
def test_layer_losses_match_torch(layer_map):
    """TinyBERT's embedding, hidden (narrower student, learned projections) and attention MSEs and BERT-PKD's
    normalised [CLS] loss, each against torch on the same random tensors; the student has M=3 layers, the
    teacher N=6, so skip reads teacher layers 2, 4 (6 for the top) and last 4, 5 (6)."""
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    b, s, n, hs, ht, m, big_n = 3, 5, 2, 4, 6, 3, 6
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], np.float32)
    s_hidden = [rng.normal(size=(b, s, hs)).astype(np.float32) for _ in range(m + 1)]
    t_hidden = [rng.normal(size=(b, s, ht)).astype(np.float32) for _ in range(big_n + 1)]
    lowest = np.finfo(np.float32).min  # the model's masked score

    def scores():
        a = (3 * rng.normal(size=(b, n, s, s))).astype(np.float32)
        return np.where(mask[:, None, None, :] > 0, a, lowest)
    s_scores, t_scores = [scores() for _ in range(m)], [scores() for _ in range(big_n)]
    proj = {name: {"kernel": rng.normal(size=(hs, ht)).astype(np.float32) * 0.5,
                   "bias": rng.normal(size=(ht,)).astype(np.float32)} for name in ("embedding", "hidden")}
    example_weights = np.array([1, 1, 0], np.float32)  # the third a padding example
    settings = distillation.LayerLosses(alpha_embedding=1.0, alpha_hidden=2.0, alpha_attention=3.0,
                                        layer_map=layer_map)
    g = distillation.teacher_layer_map(layer_map, m, big_n)
    total, got = distillation.layer_losses(settings, g, _recorded(s_hidden, s_scores), _recorded(t_hidden, t_scores),
                                           mask, example_weights, proj)
    # PKD compares states of one width: a student of the teacher's
    s_wide = [rng.normal(size=(b, s, ht)).astype(np.float32) for _ in range(m + 1)]
    pkd_total, pkd = distillation.layer_losses(distillation.LayerLosses(alpha_pkd=0.5, layer_map=layer_map), g,
                                               _recorded(s_wide), _recorded(t_hidden), mask, example_weights, None)
    got.update(pkd)

    # torch, from the formulas: the teacher layer of student layer i (1-indexed), the [CLS] layers of PKD
    k = big_n // m
    mapped = [k * i for i in range(1, m + 1)] if layer_map == "skip" else list(range(big_n - m + 1, big_n + 1))
    real = torch.tensor(mask.reshape(-1) > 0)

    def linear(name):
        layer = torch.nn.Linear(hs, ht)
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(proj[name]["kernel"].T))
            layer.bias.copy_(torch.tensor(proj[name]["bias"]))
        return layer

    def mse_real(student, teacher):  # over the real tokens' features
        return F.mse_loss(student.reshape(-1, ht)[real], torch.tensor(teacher).reshape(-1, ht)[real])

    with torch.no_grad():
        w_e, w_h = linear("embedding"), linear("hidden")
        want = {"embedding_loss": mse_real(w_e(torch.tensor(s_hidden[0])), t_hidden[0])}
        want["hidden_loss"] = sum(mse_real(w_h(torch.tensor(s_hidden[i])), t_hidden[j])
                                  for i, j in zip(range(1, m + 1), mapped))
        zeroed = lambda a: torch.where(torch.tensor(a) <= -1e2, torch.zeros(()), torch.tensor(a))  # noqa: E731
        want["attention_loss"] = sum(F.mse_loss(zeroed(s_scores[i - 1]), zeroed(t_scores[j - 1]))
                                     for i, j in zip(range(1, m + 1), mapped))
        keep = torch.tensor(example_weights > 0)
        per_example = sum(((F.normalize(torch.tensor(s_wide[i][:, 0]), dim=-1)
                            - F.normalize(torch.tensor(t_hidden[j][:, 0]), dim=-1)) ** 2).sum(-1)
                          for i, j in zip(range(1, m), mapped[:-1]))
        want["pkd_loss"] = per_example[keep].mean()
    assert g == tuple(mapped)
    for name, value in want.items():
        assert abs(float(got[name]) - float(value)) < 1e-6 * max(1.0, abs(float(value))), (name, float(got[name]),
                                                                                          float(value))
    assert float(total) == pytest.approx(sum(a * float(want[k]) for a, k in zip(
        (1.0, 2.0, 3.0), ("embedding_loss", "hidden_loss", "attention_loss"))), rel=1e-6)
    assert float(pkd_total) == pytest.approx(0.5 * float(want["pkd_loss"]), rel=1e-6)
    print({name: abs(float(got[name]) - float(value)) for name, value in want.items()})


def test_layer_maps_and_their_checks_say_what_to_change():
    assert distillation.teacher_layer_map("uniform", 4, 12) == (3, 6, 9, 12)
    assert distillation.teacher_layer_map("skip", 6, 12)[:-1] == (2, 4, 6, 8, 10)
    assert distillation.teacher_layer_map("last", 6, 12)[:-1] == (7, 8, 9, 10, 11)
    assert distillation.teacher_layer_map((1, 5), 2, 6) == (1, 5)
    with pytest.raises(ValueError, match=r"layer_map=\(1, 5, 6\): give 2 increasing teacher layers in 1..6"):
        distillation.teacher_layer_map((1, 5, 6), 2, 6)
    with pytest.raises(ValueError, match="not a whole number"):
        distillation.teacher_layer_map("uniform", 4, 6)
    student = BertConfig(**dict(TEACHER, num_layers=1, num_heads=4))
    with pytest.raises(ValueError, match=r"student has \[4\] heads and the teacher's layers \[2\].*model.num_heads"):
        distillation.check_layer_losses(distillation.LayerLosses(alpha_attention=1.0), student,
                                        BertConfig(**TEACHER))
    with pytest.raises(ValueError, match="set model.attention_impl=xla for attention distillation"):
        distillation.check_layer_losses(distillation.LayerLosses(alpha_attention=1.0),
                                        BertConfig(**dict(TEACHER, attention_impl="blockwise",
                                                          attention_dropout_rate=0.0)),
                                        BertConfig(**TEACHER))
    narrow = BertConfig(**dict(TEACHER, hidden_size=16, num_layers=1))
    with pytest.raises(ValueError, match="alpha_pkd=1.0 compares .CLS. states of one width"):
        distillation.check_layer_losses(distillation.LayerLosses(alpha_pkd=1.0), narrow, BertConfig(**TEACHER))
    assert distillation.projection_names(distillation.LayerLosses(alpha_hidden=1.0), narrow,
                                         BertConfig(**TEACHER)) == ("hidden",)
    # A narrower student learns projections (general and task distillation alike); a wider one has none to learn.
    assert distillation.check_layer_losses(distillation.LayerLosses(alpha_hidden=1.0, alpha_embedding=1.0), narrow,
                                           BertConfig(**TEACHER)) == (3,)
    with pytest.raises(ValueError, match="hidden_size 32 exceeds the teacher's 16: make the student narrower"):
        distillation.check_layer_losses(distillation.LayerLosses(alpha_hidden=1.0),
                                        BertConfig(**dict(TEACHER, num_layers=1)),
                                        BertConfig(**dict(TEACHER, hidden_size=16)))


# ---------------------------------------------------------------------------------------------------
# The model's attention scores
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_attention_scores_are_what_the_layers_attend_with(family):
    """Attention recomputed from the recorded scores (softmax, then the values) gives each layer's context:
    the output through the scores equals the fused attention's, and scanned and unrolled record the same
    scores (ModernBERT: local and global layers alternating, rotary positions)."""
    import dataclasses

    import flax.linen as nn

    from bertjax.models import attention as attention_layers
    from bertjax.models.config import BertConfig as Config

    if family == "modernbert":
        from configs import modernbert_tiny
        base = Config.from_dict(dict(modernbert_tiny.get_config().model, num_layers=4, vocab_size=64, hidden_size=32,
                                     num_heads=2, intermediate_size=48, max_position_embeddings=64,
                                     local_attention_window=4), platform="cpu")
    else:
        base = BertConfig(**TEACHER)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 60, (2, SEQ)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, 10:].set(0)
    unrolled = dataclasses.replace(base, scan_layers=False)
    params = nn.unbox(bert.BertModel(unrolled).init(jax.random.key(0), ids, ids * 0, mask)["params"])
    out, recorded = jax.jit(functools.partial(bert.BertModel(unrolled).apply, mutable=[
        bert.ATTENTION_SCORES, bert.HIDDEN_STATES]))({"params": params}, ids, ids * 0, mask)
    scores = out["attention_scores"]
    assert len(scores) == base.num_layers and scores[0].shape == (2, base.num_heads, SEQ, SEQ)
    assert len(recorded[bert.ATTENTION_SCORES]["layers"][0]) == base.num_layers
    # Layer 0's attention recomputed from its scores and its own value projection.
    x = out["hidden_states"][0]
    layer = params["encoder"]["layers_0"]["attention"]
    value = jnp.einsum("bsh,hnd->bsnd", x, layer["value"]["kernel"]) + layer["value"].get("bias", 0.0)
    context = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(scores[0], -1), value)
    attention = (jnp.einsum("bsnd,ndh->bsh", context, layer["output"]["kernel"]) + layer["output"].get("bias", 0.0))
    direct = jax.jit(attention_layers.SelfAttention(unrolled, True, unrolled.is_local(0)).apply)({"params": layer}, x,
                                                                                       _padding(mask))
    np.testing.assert_allclose(attention, direct, atol=1e-5)
    # the padding keys masked as the model masks them; scanned records the same numbers
    assert float(jnp.max(scores[0][1, :, :, 10:])) == float(jnp.finfo(jnp.float32).min)
    fused = bert.BertModel(dataclasses.replace(unrolled, attention_impl="blockwise", attention_dropout_rate=0.0))
    with pytest.raises(ValueError, match="set model.attention_impl=xla for attention distillation"):
        fused.apply({"params": params}, ids, ids * 0, mask, mutable=[bert.ATTENTION_SCORES])
    # init makes every collection mutable, and asks for no recording: a fused-attention model is shaped as usual
    shaped = jax.eval_shape(lambda: fused.init(jax.random.key(0), ids, ids * 0, mask))
    assert set(shaped) == {"params"}
    if family == "bert":
        return  # the scanned stack's own case: alternating layers
    scanned = dataclasses.replace(base, scan_layers=True)
    stacked = dict(params, encoder=bert.stack_layers(dict(params["encoder"]), scanned))
    again = jax.jit(functools.partial(bert.BertModel(scanned).apply, mutable=[bert.ATTENTION_SCORES]))(
        {"params": stacked}, ids, ids * 0, mask)[0]
    for a, b in zip(scores, again["attention_scores"]):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _padding(mask):
    from bertjax.models import attention
    return attention.Padding((mask > 0)[:, None, None, :], jnp.sum(mask, -1), None, mask)


@pytest.mark.slow
def test_task_distillation_with_pkd_runs_and_logs_its_loss():
    """BERT-PKD's patient loss in task distillation: a 2-layer student of a 2-layer teacher (PKD-skip reads
    teacher layer 1 for student layer 1), its pkd_loss a logged mean that the steps lower."""
    config = distill_config()
    mesh, rules, data_sharding = one_device_layout(config)
    cfg = BertConfig(**dict(TEACHER, num_layers=2, hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
    net = heads.network("classification", cfg, 3)
    tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, 4)
    inputs = heads.dummy_inputs("classification", 1, SEQ)
    setup = Setup.create(net, inputs, tx, schedule, mesh, rules, jax.random.key(0))
    teacher_params = distillation.place_params(net, inputs, jax.jit(net.init)(jax.random.key(5), **inputs)["params"],
                                               mesh, rules)
    host = synthetic.synthetic_batch(0, batch_size=BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
                                     vocab_size=64)
    batch = sharding.global_batch({k: host[k] for k in steps.INPUT_KEYS} | {
        "label": np.arange(BATCH, dtype=np.int32) % 3, "example_weight": np.ones(BATCH, np.float32)}, data_sharding)
    settings = distillation.LayerLosses(alpha_pkd=100.0, layer_map="skip")
    layer_map = distillation.check_layer_losses(settings, cfg, cfg)
    step = distillation.task_distillation_step(setup, net, teacher_params, "classification", 2.0, 0.5, data_sharding, 1,
                                               settings, layer_map)
    state = setup.init(jax.random.key(0))
    pkd = []
    with jax.set_mesh(mesh):
        for _ in range(4):
            state, sums = step(state, batch, jax.random.key(0))
            pkd.append(float(sums["pkd_loss"]))
    line = steps.summarize_train(jax.device_get(sums))
    assert line["pkd_loss"] == pytest.approx(pkd[-1]) and "soft_loss" in line
    assert pkd[-1] < pkd[1], pkd  # step 1's learning rate is 0


# ---------------------------------------------------------------------------------------------------
# TinyBERT's task stage: a narrower student learns a fine-tuned teacher's layers through projections
# ---------------------------------------------------------------------------------------------------

TASK_STAGE = dict(alpha=0.5, temperature=2.0, alpha_embedding=1.0, alpha_hidden=1.0, alpha_attention=1.0)


def task_stage_config(pretrained, made, **distill):
    """configs/finetune/classification.py from made's narrower student, distilled from made's teacher: one epoch
    of 6 steps (96 examples, batches of 16), logging every step."""
    from conftest import finetune_config

    config = finetune_config("classification", pretrained, labels=("no", "yes"), **made["files"])
    config.train.init_from = made["student"]
    config.data.update(max_seq_length=32, packing=False)  # the layer losses compare whole rows
    config.logging.log_every = 1
    config.distill.update(teacher=made["teacher"], **{**TASK_STAGE, **distill})
    return config


@pytest.fixture(scope="module")
def task_stage(pretrained, finetuned, tmp_path_factory):
    """conftest's `finetuned` (2 layers, hidden 64) as the teacher of a student of one layer half its width (a
    pretraining workdir of random weights, drawn in NumPy, in the teacher's vocabulary), and the uninterrupted
    run of TASK_STAGE."""
    import pathlib
    import shutil

    import flax.linen as nn
    from bertjax.training.checkpoint_meta import CheckpointMeta, TokenizerRecord

    root = tmp_path_factory.mktemp("task-stage")
    cfg = BertConfig(**dict(pretrained["cfg"].__dict__, hidden_size=32, intermediate_size=64,
                                               num_layers=1))
    shapes = nn.unbox(jax.eval_shape(lambda key: bert.BertForPreTraining(cfg).init(
        key, **bert.dummy_batch(1, 16, 2))["params"], jax.random.key(0)))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda a: rng.normal(0.0, 0.02, a.shape).astype(a.dtype), shapes)
    student = root / "student"
    saver = checkpoint.Checkpointer(str(student), every_steps=1, keep=1, async_save=False)
    saver.save(1, params, {"count": np.zeros((), np.int32)},
               CheckpointMeta(step=1, model=cfg.__dict__, tokenizer=TokenizerRecord("wordpiece", "vocab.txt", True)),
               force=True)
    saver.wait()
    saver.close()
    shutil.copy(pathlib.Path(pretrained["workdir"]) / "vocab.txt", student / "vocab.txt")
    made = dict(student=str(student), teacher=finetuned["workdir"], files={})
    for split, lines in (("train", slice(0, 96)), ("validation", slice(0, 16))):
        made["files"][split] = str(root / f"{split}.jsonl")
        pathlib.Path(made["files"][split]).write_text(
            "\n".join(pathlib.Path(pretrained["files"][split]).read_text().splitlines()[lines]) + "\n")
    config = task_stage_config(pretrained, made)
    workdir = root / "run"
    return dict(made, config=config, workdir=workdir, made=made, pretrained=pretrained,
                summary=finetuning.finetune(config, str(workdir)))


def test_a_narrower_student_learns_the_fine_tuned_teachers_layers_and_saves_the_student_alone(task_stage):
    """TinyBERT's task stage (768 -> 312 there, 64 -> 32 here): embedding, hidden and attention losses logged
    with the soft loss; the projections are in the checkpoints' optimizer-state item, never in best/ or the
    checkpoints' params (what bertjax.load, export and a later train.init_from read); the student predicts."""
    import json
    import pathlib

    import bertjax

    workdir = pathlib.Path(task_stage["workdir"])
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if "split" not in x]
    assert [x["step"] for x in train_lines] == list(range(1, 7))
    for name in ("soft_loss", "embedding_loss", "hidden_loss", "attention_loss"):
        assert all(np.isfinite(x[name]) and x[name] >= 0 for x in train_lines), name
    step = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert projections.PROJECTIONS in (workdir / "checkpoints" / str(step) / "opt_state" / "_METADATA").read_text()
    assert projections.PROJECTIONS not in (workdir / "checkpoints" / str(step) / "params" / "_METADATA").read_text()
    for path in (workdir / "checkpoints", workdir / checkpoint.BEST_DIR):
        params, meta = checkpoint.restore_params(str(path))
        assert set(params) == {"bert", "classifier"} and meta.model["hidden_size"] == 32
    start = finetuning.load_pretrained(str(workdir), "classification", 2, {})  # a later train.init_from
    assert start.whole_head and set(start.params) == {"bert", "classifier"} and start.bert_config.hidden_size == 32
    texts = [json.loads(x)["text"] for x in pathlib.Path(task_stage["files"]["validation"]).read_text().splitlines()]
    predicted = [x.split("\t")[1] for x in (workdir / "predictions" / "validation.tsv").read_text().splitlines()[1:]]
    model = bertjax.load(str(workdir))
    assert [p["label"] for p in model.predict(texts[:8])] == predicted[:8]


def test_the_task_stage_starts_from_the_projections_its_general_distillation_learned(task_stage, tmp_path, capsys):
    """A student whose checkpoint carries projections (as general distillation saves them, beside its optimizer
    state: the task stage starts from them, as TinyBERT's code does (at a learning rate of 1e-12 they come out
    as they went in); one of another width is not taken, and a student without any starts fresh (task_stage)."""
    import pathlib
    import shutil

    from bertjax.training.checkpoint_meta import CheckpointMeta

    student = pathlib.Path(task_stage["made"]["student"])
    params, meta = checkpoint.restore_params(str(student))
    rng = np.random.default_rng(1)
    learned = {name: {"kernel": rng.normal(size=(32, 64)).astype(np.float32),
                      "bias": rng.normal(size=(64,)).astype(np.float32)} for name in ("embedding", "hidden")}
    general = tmp_path / "general"
    saver = projections.ProjectionCheckpointer(checkpoint.Checkpointer(str(general), every_steps=1, keep=1,
                                                                        async_save=False))
    saver.save(1, dict(params, **{projections.PROJECTIONS: learned}), {"count": np.zeros((), np.int32)},
               CheckpointMeta(step=1, model=meta.model, tokenizer=meta.tokenizer), force=True)
    saver.wait()
    saver.close()
    shutil.copy(student / "vocab.txt", general / "vocab.txt")
    assert projections.saved_projections(str(general), ("hidden",), 32, 128) is None  # another teacher's width
    assert projections.saved_projections(str(student), ("hidden",), 32, 64) is None  # none saved

    config = task_stage_config(task_stage["pretrained"], dict(task_stage["made"], student=str(general)))
    config.optimizer.learning_rate = 1e-12  # Adam moves a weight by about the learning rate a step
    finetuning.finetune(config, str(tmp_path / "run"))
    assert f"the projections (embedding, hidden) start from those {general} learned" in capsys.readouterr().out
    after = checkpoint.restore_saved_part(str(tmp_path / "run"), "opt_state", projections.PROJECTIONS)
    for name in learned:
        for part in ("kernel", "bias"):
            np.testing.assert_allclose(np.asarray(after[name][part]), learned[name][part], rtol=0, atol=1e-9)


def test_a_stopped_task_distillation_with_projections_resumes_exactly(task_stage, tmp_path):
    """Stopped after step 4 (saved mid-epoch, runs.start.Stopped), then re-run: the uninterrupted run's losses,
    the projected hidden losses among them, step for step; the same student at the end."""
    import json

    from conftest import finetune_stopped_then_resumed

    workdir = tmp_path / "stopped"
    finetune_stopped_then_resumed(task_stage["config"], workdir, stop_at=4)

    def losses(path):
        lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return {x["step"]: (x["loss"], x["hidden_loss"], x["embedding_loss"]) for x in lines if "split" not in x}

    expected, got = losses(task_stage["workdir"]), losses(workdir)
    assert sorted(expected) == list(range(1, 7)) and got == expected
    final, _ = checkpoint.restore_params(str(task_stage["workdir"]))
    again, _ = checkpoint.restore_params(str(workdir))
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, final)
