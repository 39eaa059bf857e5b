"""FP8 matmuls (model.matmul_dtype=fp8, models/fp8.py) on the CPU: one dense layer against float32, the model
applied with params alone, a tiny run of the library's train step against bfloat16 compute, a resume
through the checkpoint code that gives the uninterrupted run's losses bit for bit, and the scaling state
over microbatches. docs/performance.md ("FP8 matmuls") has the figures."""

import dataclasses
import pathlib
import runpy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from bertjax.models import bert, fp8, layers
from bertjax.models.config import BertConfig
from bertjax.training import checkpoint, pretraining_step, sharding
from bertjax.training import state as train_state
from bertjax.training.checkpoint_meta import CheckpointMeta

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, RESUME_AT, LAST = 200, 100, 20  # the run's steps, where it is resumed, the steps its end is judged on
BATCH, SEQ, PREDS, VOCAB, TOPICS = 16, 32, 5, 200, 20
E4M3_MAX, E5M2_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max), float(jnp.finfo(jnp.float8_e5m2).max)


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_an_fp8_dense_layer_against_float32_and_its_scaling_state():
    # x: [R, H] rows; cotangent: [R, F], what the loss gives the layer's output (R rows, H in, F out)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128,
                     max_position_embeddings=SEQ, matmul_dtype="fp8")
    exact = layers.dense(dataclasses.replace(cfg, matmul_dtype="default"), 128, ("embed", "mlp"), "d")
    layer = layers.dense(cfg, 128, ("embed", "mlp"), "d")
    x = 2.0 * jax.random.normal(jax.random.key(1), (32, 64))
    cotangent = 1e-3 * jax.random.normal(jax.random.key(2), (32, 128))
    variables = nn.unbox(layer.init(jax.random.key(0), x))
    params, state = variables["params"], variables[fp8.COLLECTION]["ScaledDot_0"]
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
        nn.unbox(exact.init(jax.random.key(0), x))["params"])  # the params tree is the default's

    def grads_of(net):  # (variables, x) -> ((dvariables, dx), output)
        def loss(v, x):
            y = net.apply(v, x)
            return jnp.vdot(y, cotangent), y

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))

    grads = grads_of(layer)

    # Step 1 quantizes by the scales of an empty history (1) and records this step's amaxes.
    (dvars, _), _ = grads({"params": params, fp8.COLLECTION: {"ScaledDot_0": state}}, x)
    new = dvars[fp8.COLLECTION]["ScaledDot_0"]
    amax = {"input": jnp.max(jnp.abs(x)), "kernel": jnp.max(jnp.abs(params["kernel"])),
            "output_grad": jnp.max(jnp.abs(cotangent))}
    for name, value in amax.items():
        assert float(new[f"{name}_amax_history"][0]) == float(value)
        assert float(new[f"{name}_scale"][0]) == 1.0 and float(state[f"{name}_amax_history"][0]) == 0.0
    # Step 2: delayed scaling, each scale the last amax over the format's largest value.
    (dvars, dx), y = grads({"params": params, fp8.COLLECTION: {"ScaledDot_0": new}}, x)
    newer = dvars[fp8.COLLECTION]["ScaledDot_0"]
    for name, top in (("input", E4M3_MAX), ("kernel", E4M3_MAX), ("output_grad", E5M2_MAX)):
        np.testing.assert_allclose(newer[f"{name}_scale"][0], amax[name] / top, rtol=1e-6)
    (dvars_exact, dx_exact), y_exact = grads_of(exact)({"params": params}, x)
    errors = {"output": relative_error(y, y_exact), "d input": relative_error(dx, dx_exact),
              "d kernel": relative_error(dvars["params"]["kernel"], dvars_exact["params"]["kernel"]),
              "d bias": relative_error(dvars["params"]["bias"], dvars_exact["params"]["bias"])}
    # Rounding to 3 mantissa bits (e4m3) is about 2.6% RMS, to 2 (e5m2) about 5%: the output, of two e4m3
    # operands, about 3.7%; the gradients, e5m2 against e4m3, about 6%; the bias's is not quantized.
    assert 0.01 < errors["output"] < 0.05, errors
    assert 0.01 < errors["d input"] < 0.08 and 0.01 < errors["d kernel"] < 0.08, errors
    assert errors["d bias"] < 1e-6, errors


def test_without_the_scaling_state_an_fp8_model_computes_the_default_one():
    # Evaluation, bertjax.load and export apply params alone.
    fields = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=SEQ)
    batch = bert.dummy_batch(2, SEQ, PREDS)
    default, scaled = (bert.BertForPreTraining(BertConfig(**fields, matmul_dtype=m)) for m in ("default", "fp8"))
    variables = jax.jit(lambda: scaled.init({"params": jax.random.key(0)}, **batch))()
    assert set(variables) == {"params", fp8.COLLECTION}
    apply = lambda net: jax.jit(lambda p: net.apply({"params": p}, **batch, deterministic=True))  # noqa: E731
    params = nn.unbox(variables["params"])
    np.testing.assert_allclose(apply(scaled)(params)["mlm_logits"], apply(default)(params)["mlm_logits"],
                               rtol=1e-5, atol=1e-5)


def test_a_scanned_stack_carries_each_layers_scaling_state():
    """Under scan_layers the scaling state is stacked per layer as the params are: the loss and the new state
    of a differentiated step equal the unrolled stack's, from the same params and state."""
    fields = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=SEQ, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
                  matmul_dtype="fp8")
    batch = bert.dummy_batch(2, SEQ, PREDS)
    unrolled, scanned = (bert.BertForPreTraining(BertConfig(**fields, scan_layers=s)) for s in (False, True))
    variables = nn.unbox(jax.jit(lambda: unrolled.init({"params": jax.random.key(0)}, **batch))())
    cfg = BertConfig(**fields, scan_layers=True)

    def stacked(tree):
        return dict(tree, bert=dict(tree["bert"], encoder=bert.stack_layers(tree["bert"]["encoder"], cfg)))

    def step(net, variables):
        def loss(v):
            return jnp.sum(net.apply(v, **batch, deterministic=True)["mlm_logits"] ** 2)
        return jax.jit(jax.value_and_grad(loss))(variables)

    value, grads = step(unrolled, variables)
    scanned_vars = {name: stacked(tree) for name, tree in variables.items()}
    assert jax.tree_util.tree_structure(nn.unbox(jax.eval_shape(
        lambda: scanned.init({"params": jax.random.key(0)}, **batch)))) == jax.tree_util.tree_structure(scanned_vars)
    scanned_value, scanned_grads = step(scanned, scanned_vars)
    np.testing.assert_allclose(float(scanned_value), float(value), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(scanned_grads[fp8.COLLECTION]),
                    jax.tree_util.tree_leaves(stacked(grads[fp8.COLLECTION]))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def config(matmul_dtype: str):
    """configs/tiny.py, shrunk: bfloat16 compute, float32 params and AdamW, no dropout."""
    c = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    c.model.update(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=VOCAB,
                   max_position_embeddings=SEQ, dtype="bfloat16", param_dtype="float32", matmul_dtype=matmul_dtype,
                   hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    c.data.update(source="synthetic", max_seq_length=SEQ, max_predictions_per_seq=PREDS)
    c.train.update(batch_size=BATCH, num_steps=STEPS)
    c.optimizer.update(learning_rate=3e-3)
    c.schedule.warmup_steps = 20
    return c


def batch(step: int) -> dict:
    """Rows of one topic each (a block of 9 tokens, drawn uniformly): the masked tokens are learnable from
    the rest of the row, the sentence label is the topic's parity."""
    rng = np.random.default_rng([7, step])
    topic = rng.integers(0, TOPICS, (BATCH, 1))
    ids = (5 + 9 * topic + rng.integers(0, 9, (BATCH, SEQ))).astype(np.int32)  # [B, S]
    ids[:, 0] = 2  # [CLS]
    positions = np.sort(np.argsort(rng.random((BATCH, SEQ - 1)), axis=1)[:, :PREDS] + 1, axis=1).astype(np.int32)
    labels = np.take_along_axis(ids, positions, axis=1)  # [B, P]
    np.put_along_axis(ids, positions, 4, axis=1)  # [MASK]
    return dict(input_ids=ids, segment_ids=np.repeat((np.arange(SEQ)[None] >= SEQ // 2).astype(np.int32), BATCH, 0),
                input_mask=np.ones((BATCH, SEQ), np.int32), masked_lm_positions=positions, masked_lm_ids=labels,
                masked_lm_weights=np.ones((BATCH, PREDS), np.float32),
                next_sentence_labels=(topic[:, 0] % 2).astype(np.int32))


class Run:
    """A run as train.py lays it out (Setup, the jitted train_step), saving through checkpoint.Checkpointer."""

    def __init__(self, matmul_dtype: str, workdir):
        self.config = config(matmul_dtype)
        self.mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
        rules = sharding.logical_rules(self.config.logical_axis_rules)
        self.init_key, self.dropout_key = train_state.root_keys(0)
        self.setup = pretraining_step.setup(self.config, self.mesh, rules, self.init_key)
        self.data_sharding = sharding.batch_sharding(self.mesh, rules)
        self.step_fn, _ = self.setup.compile_steps(self.data_sharding, 1)
        self.checkpointer = checkpoint.Checkpointer(str(workdir), every_steps=RESUME_AT, keep=1, async_save=False)

    def train(self, state, start: int, stop: int, save_at: int | None = None):
        losses = []
        with jax.set_mesh(self.mesh):
            for step in range(start, stop):
                state, sums = self.step_fn(state, sharding.global_batch(batch(step), self.data_sharding),
                                           self.dropout_key)
                losses.append(float(sums["loss_sum"]))
                if step + 1 == save_at:
                    meta = CheckpointMeta(step + 1, {})
                    self.checkpointer.save(step + 1, state.params, state.opt_state, meta, force=True, fp8=state.fp8)
                    self.checkpointer.wait()
        return state, np.array(losses)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{matmul_dtype: (Run, final state, its STEPS losses)}, each saved at step RESUME_AT."""
    out = {}
    for matmul_dtype in ("default", "fp8"):
        run = Run(matmul_dtype, tmp_path_factory.mktemp(matmul_dtype))
        state, losses = run.train(run.setup.init(run.init_key), 0, STEPS, save_at=RESUME_AT)
        out[matmul_dtype] = (run, state, losses)
    return out


def test_a_tiny_fp8_run_follows_the_bfloat16_loss_curve(runs):
    (_, bf16_state, bf16), (_, fp8_state, scaled) = runs["default"], runs["fp8"]
    assert bf16_state.fp8 is None
    assert jax.tree_util.tree_structure(fp8_state.params) == jax.tree_util.tree_structure(bf16_state.params)
    assert np.all(np.isfinite(scaled)) and not np.array_equal(scaled, bf16)  # computed in fp8 indeed
    assert scaled[-LAST:].mean() < scaled[:LAST].mean() - 1.0  # it learns (about 6.0 -> 4.6)
    assert abs(scaled[-LAST:].mean() / bf16[-LAST:].mean() - 1) < 0.01
    layer = fp8_state.fp8["bert"]["encoder"]["layers_1"]["attention"]["output"]["ScaledDot_0"]
    for name in ("input", "kernel", "output_grad"):  # delayed scaling from the history of every step
        history = np.asarray(layer[f"{name}_amax_history"])
        assert np.count_nonzero(history) == STEPS
        np.testing.assert_allclose(layer[f"{name}_scale"][0], history[1:].max() / (
            E5M2_MAX if name == "output_grad" else E4M3_MAX), rtol=1e-6)


def test_a_resumed_fp8_run_takes_the_uninterrupted_runs_steps(runs):
    run, _, uninterrupted = runs["fp8"]
    default_dir = epath.Path(runs["default"][0].checkpointer.directory) / str(RESUME_AT)
    saved = epath.Path(run.checkpointer.directory) / str(RESUME_AT)
    assert {p.name for p in default_dir.iterdir() if p.is_dir()} == {"params", "opt_state", "meta"}
    assert {p.name for p in saved.iterdir() if p.is_dir()} == {"params", "opt_state", "meta", checkpoint.FP8_ITEM}
    abstract = run.setup.abstract_state
    restored = run.checkpointer.restore_latest(abstract.params, abstract.opt_state, abstract_fp8=abstract.fp8)
    assert restored.step == RESUME_AT and restored.fp8 is not None
    # A checkpoint saved without fp8 matmuls has no scaling state to give: the run starts one afresh.
    assert runs["default"][0].checkpointer.restore_latest(abstract.params, abstract.opt_state,
                                                          abstract_fp8=abstract.fp8).fp8 is None
    fresh = run.setup.init_fp8(run.init_key)["mlm_head"]["transform"]["ScaledDot_0"]
    assert float(fresh["input_scale"][0]) == 1.0 and not np.any(fresh["input_amax_history"])
    state = train_state.TrainState(jnp.int32(restored.step), restored.params, restored.opt_state, restored.fp8)
    _, losses = run.train(state, RESUME_AT, STEPS)
    np.testing.assert_array_equal(losses, uninterrupted[RESUME_AT:])


def test_over_microbatches_the_scaling_state_takes_the_largest_amax(runs):
    # Each microbatch starts from the same state; the step's history records the amax of the whole batch.
    run = runs["fp8"][0]
    whole = batch(0)
    accumulated, _ = run.setup.compile_steps(run.data_sharding, 2)
    apart = []
    with jax.set_mesh(run.mesh):
        state, _ = accumulated(run.setup.init(run.init_key), sharding.global_batch(whole, run.data_sharding),
                               run.dropout_key)
        for i in range(2):  # microbatch i holds examples i::2 (optim.accumulate_gradients)
            part = sharding.global_batch({k: v[i::2] for k, v in whole.items()}, run.data_sharding)
            apart.append(run.step_fn(run.setup.init(run.init_key), part, run.dropout_key)[0].fp8)
    largest = jax.tree_util.tree_map(jnp.maximum, *apart)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), state.fp8, largest)
    # The microbatches' amaxes differ (the output gradient's by up to 20%): neither one of them, nor their mean.
    assert any(not np.allclose(a, b, rtol=0.05) for a, b in zip(*map(jax.tree_util.tree_leaves, apart)))
