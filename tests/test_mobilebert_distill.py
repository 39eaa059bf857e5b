"""MobileBERT's progressive knowledge transfer (compression/progressive.py) on general distillation's program:
each stage's loss against NumPy on the same tensors (feature-map MSE, attention KL, pre-training distillation),
which parameters each stage trains (the frozen ones bit for bit unchanged), a run stopped mid-stage and resumed
against the uninterrupted one, the one-line errors, and the recipes against their teachers. The networks are
random 2-layer MobileBERT/IB-BERT pairs, 32 wide between layers (16 inside the student's, 64 inside the
teacher's), on synthetic data (tests/test_distill.py's corpus)."""

import dataclasses
import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.compression import distillation, progressive
from bertjax.models import bert
from bertjax.models.config import BertConfig
from bertjax.runs import general_distillation
from bertjax.runs import pretraining as pretraining_runs
from bertjax.training import checkpoint, pretraining_step, sharding
from bertjax.data import synthetic
from conftest import one_device_layout, tiny_config  # tests/ is on sys.path under pytest

RECIPE = "configs/distill/mobilebert_tiny.py"

SEQ, PREDS, BATCH, VOCAB = 16, 3, 4, 64
STUDENT = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=32,
               max_position_embeddings=32, block="mobilebert", intra_bottleneck_size=16,
               key_query_shared_bottleneck=True, num_feedforward_networks=2, embedding_size=16, trigram_input=True,
               norm="no_norm", activation="relu", pooler="first", hidden_dropout_rate=0.0,
               attention_dropout_rate=0.0, attention_impl="xla")
TEACHER = dict(STUDENT, intra_bottleneck_size=64, intermediate_size=64, num_feedforward_networks=1, norm="layernorm",
               activation="gelu", pooler="tanh")
# configs/distill/mobilebert_tiny.py made small: 2 layer stages of 2 steps, then 2 steps of PD.
SMALL = {**{f"model.{k}": v for k, v in STUDENT.items()}, "data.source": "synthetic", "data.max_seq_length": SEQ,
         "data.max_predictions_per_seq": PREDS, "train.batch_size": BATCH, "distill.stage_steps": 2,
         "distill.pd_steps": 2, "distill.stage_warmup_steps": 0, "train.num_steps": 6, "schedule.warmup_steps": 1,
         "optimizer.learning_rate": 3e-3, "checkpoint.every_steps": 2, "checkpoint.async_save": False,
         "logging.log_every": 1, "logging.eval_every": 6, "logging.eval_batches": 1}


def progressive_config(**overrides):
    return tiny_config({**SMALL, **overrides}, RECIPE)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """An IB-BERT-shaped teacher of random weights saved as a pretraining workdir, with its heads."""
    workdir = str(tmp_path_factory.mktemp("ibbert"))
    config = progressive_config(**{f"model.{k}": v for k, v in TEACHER.items()})
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
# The losses, against NumPy
# ---------------------------------------------------------------------------------------------------


def _recorded(hidden, scores):
    """What BertModel records, as progressive.stage_loss reads it."""
    return {bert.HIDDEN_STATES: {"bert": {"layers": (tuple(hidden),)}},
            bert.ATTENTION_SCORES: {"bert": {"layers": (tuple(scores),)}}}


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_each_stage_loss_is_the_papers_formula_computed_in_numpy():
    """Stage l: MSE of layer l's feature maps over the real tokens + KL(teacher || student) of each head's
    attention over the real keys, averaged over the heads and the real queries; the PD stage: alpha x the
    labels' masked-LM loss + (1 - alpha) x T^2 x KL of the masked-LM distributions + NSP."""
    rng = np.random.default_rng(0)
    b, s, h, n, layers, p, v = 3, 6, 5, 2, 2, 4, 7
    mask = np.array([[1, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 1, 0, 0, 0]], np.int32)
    lowest = np.finfo(np.float32).min  # the model's masked score

    def scores():
        return np.where(mask[:, None, None, :] > 0, 3 * rng.normal(size=(b, n, s, s)), lowest).astype(np.float32)
    s_hidden, t_hidden = ([rng.normal(size=(b, s, h)).astype(np.float32) for _ in range(layers + 1)] for _ in "st")
    s_scores, t_scores = [scores() for _ in range(layers)], [scores() for _ in range(layers)]
    student = {"mlm_logits": rng.normal(size=(b, p, v)).astype(np.float32) * 2,
               "nsp_logits": rng.normal(size=(b, 2)).astype(np.float32)}
    teacher = {"mlm_logits": rng.normal(size=(b, p, v)).astype(np.float32) * 2}
    batch = {"input_mask": mask, "masked_lm_ids": rng.integers(0, v, (b, p)).astype(np.int32),
             "masked_lm_weights": np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32),
             "next_sentence_labels": np.array([0, 1, 1], np.int32)}
    plan = progressive.Progressive(num_layers=layers, stage_steps=2, pd_steps=2, alpha_fmt=2.0, alpha_at=0.5,
                                   pd_alpha=0.3, temperature=2.0, objective="nsp", pd_schedule=lambda t: 1.0)
    real = mask > 0

    def fmt(layer):  # (1 / (T N)) sum over the real tokens t and features n of (H_T - H_S)^2
        return np.mean(np.square(s_hidden[layer] - t_hidden[layer])[real])

    def at(layer):  # (1 / (T A)) sum over real queries t and heads a of KL over the real keys
        total = count = 0.0
        for i in range(b):
            keys = real[i]
            for head in range(n):
                for q in np.flatnonzero(keys):
                    lt = _log_softmax(t_scores[layer - 1][i, head, q, keys].astype(np.float64))
                    ls = _log_softmax(s_scores[layer - 1][i, head, q, keys].astype(np.float64))
                    total += np.sum(np.exp(lt) * (lt - ls))
                    count += 1
        return total / count

    weights = batch["masked_lm_weights"]
    nll = -np.take_along_axis(_log_softmax(student["mlm_logits"].astype(np.float64)),
                              batch["masked_lm_ids"][..., None], -1)[..., 0]
    mlm = np.sum(weights * nll) / (weights.sum() + 1e-5)  # BERT's, the 1e-5 included
    lt, ls = (_log_softmax(x.astype(np.float64) / 2.0) for x in (teacher["mlm_logits"], student["mlm_logits"]))
    kd = 4.0 * np.sum(weights * np.sum(np.exp(lt) * (lt - ls), -1)) / weights.sum()  # T^2 KL, T = 2
    nsp_logp = _log_softmax(student["nsp_logits"].astype(np.float64))
    nsp = -np.mean(nsp_logp[np.arange(b), batch["next_sentence_labels"]])
    want = {1: 2.0 * fmt(1) + 0.5 * at(1), 2: 2.0 * fmt(2) + 0.5 * at(2), 3: 0.3 * mlm + 0.7 * kd + nsp}
    recorded_s, recorded_t = _recorded(s_hidden, s_scores), _recorded(t_hidden, t_scores)
    for stage, expected in want.items():
        loss, metrics = jax.jit(progressive.stage_loss, static_argnums=0)(plan, stage, student, teacher, recorded_s,
                                                                        recorded_t, batch)
        assert float(loss) == pytest.approx(expected, rel=1e-5), stage
        assert float(metrics["kd_loss"]) == pytest.approx(kd, rel=1e-5)
        if stage <= layers:
            assert float(metrics["fmt_loss"]) == pytest.approx(fmt(stage), rel=1e-5)
            assert float(metrics["at_loss"]) == pytest.approx(at(stage), rel=1e-5)
        else:
            assert float(metrics["fmt_loss"]) == float(metrics["at_loss"]) == 0.0
            assert float(metrics["mlm_loss"]) == pytest.approx(mlm, rel=1e-5)
            assert float(metrics["nsp_loss"]) == pytest.approx(nsp, rel=1e-5)
    # A student that matches its teacher has nothing to learn in the layer stages.
    same = _recorded(t_hidden, t_scores)
    loss, _ = progressive.stage_loss(plan, 1, student, teacher, same, recorded_t, batch)
    assert float(loss) == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------------------------------
# What each stage trains
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scan_layers", [False, True])
def test_each_stage_scales_its_layer_and_holds_the_rest(scan_layers):
    """update_scales: layer l takes 1 in stage l, lower_layers_lr after, 0 before; the embedding and heads 0
    until PD; every parameter 1 in PD; a scanned stack one scale per layer. lr_factor: each layer stage's
    warmup, then PD's schedule."""
    cfg = BertConfig(**dict(STUDENT, scan_layers=scan_layers))
    shapes = nn.unbox(jax.eval_shape(lambda k: bert.BertForPreTraining(cfg).init(
        k, **bert.dummy_batch(1, SEQ, PREDS)), jax.random.key(0))["params"])
    plan = progressive.Progressive(num_layers=2, stage_steps=4, pd_steps=4, stage_warmup_steps=2, lower_layers_lr=0.1,
                                   peak_learning_rate=2.0, pd_schedule=lambda t: 2.0 * (1.0 - t / 4.0))

    def layer_scale(scales, i):
        encoder = scales["bert"]["encoder"]
        if scan_layers:
            return float(np.ravel(encoder["layers"]["attention"]["query"]["kernel"])[i])
        return float(encoder[f"layers_{i}"]["attention"]["query"]["kernel"])

    expected = {1: (1.0, 0.0, 0.0), 2: (0.1, 1.0, 0.0), 3: (1.0, 1.0, 1.0)}  # (layer 1, layer 2, outside)
    for stage, (first, second, outside) in expected.items():
        scales = jax.jit(progressive.update_scales, static_argnums=0)(plan, shapes, stage)
        assert (layer_scale(scales, 0), layer_scale(scales, 1)) == pytest.approx((first, second))
        for part in (scales["bert"]["embeddings"], scales["mlm_head"], scales["nsp_head"]):
            assert {float(x) for x in jax.tree_util.tree_leaves(part)} == {outside}
        if scan_layers:
            assert scales["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 1, 1, 1)
    stages = [1] * 4 + [2] * 4 + [3] * 4
    assert [int(plan.stage(t)) for t in range(12)] == [plan.stage_of(t) for t in range(12)] == stages
    assert [float(plan.lr_factor(t)) for t in range(12)] == [0, 0.5, 1, 1, 0, 0.5, 1, 1, 1, 0.75, 0.5, 0.25]


def test_a_stage_trains_its_layer_and_leaves_the_frozen_parameters_as_they_were(teacher):
    """The jitted step over the three stages: the student starts with the teacher's embedding (its own NoNorm,
    the teacher's being a LayerNorm) and heads; in stage 1 only layer 1 moves, in stage 2 only layer 2 (layer 1,
    the embedding and the heads bit for bit as they were), in PD everything."""
    config = progressive_config()
    plan = general_distillation.progressive_plan(config)
    mesh, rules, data_sharding = one_device_layout(config)
    setup = pretraining_step.setup(general_distillation.constant_learning_rate(config), mesh, rules,
                                   jax.random.key(0))
    teacher_net = bert.BertForPreTraining(teacher["config"])
    teacher_params = distillation.place_params(teacher_net, bert.dummy_batch(1, SEQ, PREDS), teacher["params"], mesh,
                                               rules)
    state = setup.init(jax.random.key(0))
    fresh_norm = jax.device_get(state.params["bert"]["embeddings"]["layer_norm"])
    params, copied = progressive.teacher_parts(state.params, teacher_params, setup.bert_config, teacher["config"])
    assert copied == ["bert/embeddings", "mlm_head", "nsp_head"]  # the student has no pooler dense
    start = jax.device_get(params)
    for part in ("word_embeddings", "word_projection", "position_embeddings", "token_type_embeddings"):
        jax.tree_util.tree_map(np.testing.assert_array_equal, start["bert"]["embeddings"][part],
                               teacher["params"]["bert"]["embeddings"][part])
    jax.tree_util.tree_map(np.testing.assert_array_equal, start["bert"]["embeddings"]["layer_norm"], fresh_norm)
    jax.tree_util.tree_map(np.testing.assert_array_equal, start["mlm_head"], teacher["params"]["mlm_head"])
    step = progressive.compile_step(setup, teacher_net, teacher_params, plan, data_sharding, 1)
    state = state.replace(params=params)
    snapshots, losses = [start], []
    with jax.set_mesh(mesh):
        for t in range(6):
            batch = synthetic.synthetic_batch(t, batch_size=BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDS,
                                              vocab_size=VOCAB)
            state, sums = step(state, sharding.global_batch({k: batch[k] for k in pretraining_step.BATCH_KEYS},
                                                            data_sharding), jax.random.key(0))
            losses.append({k: float(sums[k]) for k in ("fmt_loss", "at_loss", "kd_loss", "loss_sum")})
            if t % 2:
                snapshots.append(jax.device_get(state.params))

    def same(a, b, part):
        return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, part(a), part(b))))

    layer = lambda i: lambda p: p["bert"]["encoder"][f"layers_{i}"]  # noqa: E731
    outside = lambda p: (p["bert"]["embeddings"], p["mlm_head"], p["nsp_head"])  # noqa: E731
    start, after1, after2, after_pd = snapshots
    assert not same(start, after1, layer(0)) and same(start, after1, layer(1)) and same(start, after1, outside)
    assert same(after1, after2, layer(0)) and not same(after1, after2, layer(1)) and same(after1, after2, outside)
    for part in (layer(0), layer(1), lambda p: p["bert"]["embeddings"]["word_embeddings"], lambda p: p["mlm_head"]):
        assert not same(after2, after_pd, part)
    assert all(x["fmt_loss"] > 0 and x["at_loss"] > 0 for x in losses[:4])
    assert all(x["fmt_loss"] == x["at_loss"] == 0 for x in losses[4:])
    assert losses[1]["fmt_loss"] < losses[0]["fmt_loss"] and losses[3]["at_loss"] < losses[2]["at_loss"]


# ---------------------------------------------------------------------------------------------------
# The program: stages said, a resume mid-stage exact
# ---------------------------------------------------------------------------------------------------


def _lines(workdir):
    lines = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {x["step"]: x for x in lines if "split" not in x}


@pytest.mark.slow  # three runs of the program: about 20 s on 2 busy cores
def test_a_run_stopped_mid_stage_resumes_exactly(teacher, tmp_path, capsys, monkeypatch):
    """python -m bertjax.distill's run, uninterrupted and stopped after step 3 (inside stage 2) then re-run: the
    same losses step for step and the same student; the console says each stage as it starts, and the resumed
    run the stage it goes on in."""
    from bertjax.runs import start

    config = progressive_config(**{"distill.teacher": teacher["workdir"]})
    general_distillation.distill(config, str(tmp_path / "whole"))
    said = capsys.readouterr().out
    assert "the teacher's bert/embeddings, mlm_head, nsp_head" in said
    for line in ("stage 1/3, layer 1 (steps 1..2)", "stage 2/3, layer 2 (steps 3..4)",
                 "stage 3/3, pre-training distillation (steps 5..6)"):
        assert line in said, said
    original = pretraining_runs.hooks
    monkeypatch.setattr(pretraining_runs, "hooks", lambda run, writer, preemption: dataclasses.replace(
        original(run, writer, preemption), should_stop=lambda step: step == 3))
    with pytest.raises(start.Stopped):
        general_distillation.distill(config, str(tmp_path / "stopped"))
    monkeypatch.setattr(pretraining_runs, "hooks", original)
    capsys.readouterr()
    general_distillation.distill(config, str(tmp_path / "stopped"))
    out = capsys.readouterr().out
    assert "stage 2/3, layer 2 (steps 3..4, resumed after step 3)" in out, out
    whole, resumed = _lines(tmp_path / "whole"), _lines(tmp_path / "stopped")
    assert sorted(whole) == sorted(resumed) == list(range(1, 7))
    for key in ("loss", "fmt_loss", "at_loss", "kd_loss", "mlm_loss", "learning_rate"):
        assert [resumed[s][key] for s in range(1, 7)] == [whole[s][key] for s in range(1, 7)], key
    final, meta = checkpoint.restore_params(str(tmp_path / "whole"))
    again, _ = checkpoint.restore_params(str(tmp_path / "stopped"))
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, final)
    assert meta.distill["progressive"] == {"stage_steps": 2, "pd_steps": 2}


# ---------------------------------------------------------------------------------------------------
# One-line errors
# ---------------------------------------------------------------------------------------------------


def _message(fn, *args) -> str:
    with pytest.raises(ValueError) as raised:
        fn(*args)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_pair_that_cannot_transfer_is_one_line_naming_the_field(teacher, tmp_path):
    ib = BertConfig(**TEACHER)
    pair = progressive.check_pair
    message = _message(pair, ib, BertConfig(**dict(STUDENT, hidden_size=64)))
    assert message.startswith("distill.progressive: the bottlenecks do not match (the teacher's feature maps are 32 "
                              "wide, the student's 64): set model.hidden_size=32")
    assert "set model.num_layers=2" in _message(pair, ib, BertConfig(**dict(STUDENT, num_layers=3)))
    assert "set model.num_heads=2" in _message(pair, ib, BertConfig(**dict(STUDENT, num_heads=4)))
    assert "set model.embedding_size=16, model.trigram_input=True" in _message(
        pair, ib, BertConfig(**dict(STUDENT, embedding_size=8, trigram_input=False)))
    shared = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=32,
                  num_hidden_groups=1)
    assert "unset model.num_hidden_groups" in _message(pair, ib, BertConfig(**shared))
    assert "set model.attention_impl=xla" in _message(
        pair, ib, BertConfig(**dict(STUDENT, attention_impl="blockwise")))
    pair(ib, BertConfig(**STUDENT))
    # Through the program: one line, before anything is written, and no workdir left behind.
    workdir = tmp_path / "never"
    config = progressive_config(**{"distill.teacher": teacher["workdir"], "model.num_heads": 4,
                                   "model.intra_bottleneck_size": 32})
    assert "set model.num_heads=2" in _message(general_distillation.distill, config, str(workdir))
    assert not workdir.exists()


@pytest.mark.parametrize("overrides,expected", [
    ({"train.num_steps": 7}, "stages take 2 layers x distill.stage_steps=2 + distill.pd_steps=2 = 6 steps: set "
                             "train.num_steps=6"),
    ({"distill.stage_steps": 0, "train.num_steps": 2}, "distill.stage_steps=0 must be >= 1"),
    ({"distill.stage_warmup_steps": 3}, "distill.stage_warmup_steps=3 must lie in [0, distill.stage_steps=2]"),
    ({"distill.pd_alpha": 1.5}, "distill.pd_alpha=1.5 must lie in [0, 1]"),
    ({"distill.alpha_fmt": 0.0, "distill.alpha_at": 0.0}, "not both 0"),
    ({"distill.alpha_ce": 5.0}, "has losses of its own (distill.alpha_fmt, alpha_at, pd_alpha): set "
                                "distill.alpha_ce=5.0 to 0"),
    ({"distill.student_layers": (0, 1)}, "set distill.student_layers=() and unset train.init_from"),
    ({"schedule.warmup_steps": 3}, "schedule.warmup_steps=3 warms up the pre-training distillation stage"),
])
def test_bad_stage_settings_are_one_line(overrides, expected):
    config = progressive_config(**overrides)
    assert expected in _message(general_distillation.distill_settings, config)


@pytest.mark.parametrize("name,teacher_name", [("mobilebert", "ibbert"), ("mobilebert_tiny", "ibbert_tiny")])
def test_the_recipes_are_valid_and_their_teachers_line_up(name, teacher_name, tmp_path):
    """configs/distill/mobilebert*.py pass the run's checks, and configs/ibbert*.py teach their students: one
    width between layers, depth and head count, the embedding of one shape."""
    import importlib

    config = importlib.import_module(f"configs.distill.{name}").get_config()
    config.distill.teacher = str(tmp_path)
    general_distillation.check(config)
    plan = general_distillation.progressive_plan(config)
    assert plan.total_steps == config.train.num_steps and plan.lower_layers_lr == 0.0
    teacher_config = importlib.import_module(f"configs.{teacher_name}").get_config().model
    ib = BertConfig.from_dict(teacher_config, platform="cpu")
    student = BertConfig.from_dict(config.model, platform="cpu")
    progressive.check_pair(ib, student)
    assert ib.intra_bottleneck_size > ib.hidden_size > student.intra_bottleneck_size  # inverted, and a bottleneck
