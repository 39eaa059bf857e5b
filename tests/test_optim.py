"""Optimizers and schedules against independent transcriptions of the originals.

References: google-research/bert optimization.py (create_optimizer, AdamWeightDecayOptimizer), NVIDIA
DeepLearningExamples schedulers.py (PolyWarmUpScheduler) and apex csrc/multi_tensor_lamb.cu (LAMB
stages 1 and 2), and torch.optim.AdamW. Each is written out below in float64 numpy (or run in torch)
from the sources, not from bertjax.training.optim.
"""

import functools
import pathlib
import re
import runpy
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from bertjax.models import bert as bert_model

from bertjax.models.config import BertConfig
from bertjax.training import optim

REPO = pathlib.Path(__file__).resolve().parents[1]
BERT_EXCLUDE = ["LayerNorm", "layer_norm", "bias"]  # create_optimizer's exclude_from_weight_decay
# NVIDIA's run_pretraining.py groups by ['bias', 'gamma', 'beta', 'LayerNorm'] on its own (PyTorch) names,
# e.g. "bert.encoder.layer.0.attention.output.LayerNorm.weight"; on our names ("layer_norm/scale") the
# same tensors are picked by BERT's list, so the references below group parameters with that.


def excluded(name):
    return any(re.search(r, name) is not None for r in BERT_EXCLUDE)


def base_config():
    return runpy.run_path(str(REPO / "configs" / "common.py"))["base_config"]()


# --- Reference transcriptions (float64) --------------------------------------------------------------


def bert_learning_rate(step, init_lr, num_warmup_steps, num_train_steps, power=1.0):
    """create_optimizer: polynomial_decay(init_lr, global_step, num_train_steps, 0.0, power), warmup."""
    global_step = min(step, num_train_steps)  # polynomial_decay, cycle=False
    lr = (init_lr - 0.0) * (1 - global_step / num_train_steps) ** power + 0.0
    if num_warmup_steps:
        is_warmup = float(step < num_warmup_steps)
        warmup_lr = init_lr * (step / num_warmup_steps)
        lr = (1.0 - is_warmup) * lr + is_warmup * warmup_lr
    return lr


def nvidia_learning_rate(step, base_lr, warmup_proportion, total_steps, degree=0.5):
    """PolyWarmUpScheduler.get_lr at last_epoch = step."""
    progress = step / total_steps
    if progress < warmup_proportion:
        return base_lr * progress / warmup_proportion
    return base_lr * (1.0 - progress) ** degree


def tf_clip_by_global_norm(grads, clip_norm):
    global_norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
    return {k: g * clip_norm / max(global_norm, clip_norm) for k, g in grads.items()}


class NumpyAdamWeightDecay:
    """AdamWeightDecayOptimizer.apply_gradients, per named variable."""

    def __init__(self, params, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 exclude_from_weight_decay=BERT_EXCLUDE):
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.wd, self.b1, self.b2, self.eps = weight_decay_rate, beta_1, beta_2, epsilon
        self.exclude = exclude_from_weight_decay

    def _do_use_weight_decay(self, name):
        if not self.wd:
            return False
        return not any(re.search(r, name) is not None for r in self.exclude)

    def apply(self, params, grads, learning_rate):
        out = {}
        for name, param in params.items():
            grad = grads[name]
            next_m = self.b1 * self.m[name] + (1.0 - self.b1) * grad
            next_v = self.b2 * self.v[name] + (1.0 - self.b2) * np.square(grad)
            update = next_m / (np.sqrt(next_v) + self.eps)
            if self._do_use_weight_decay(name):
                update += self.wd * param
            out[name] = param - learning_rate * update
            self.m[name], self.v[name] = next_m, next_v
        return out


class NumpyApexLamb:
    """apex multi_tensor_lamb (adam_w_mode, grad_averaging) with NVIDIA's two parameter groups."""

    def __init__(self, params, lr_fn, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, bias_correction=True,
                 max_grad_norm=1.0, use_nvlamb=False):
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.step = 0
        self.lr_fn, self.betas, self.eps, self.wd = lr_fn, betas, eps, weight_decay
        self.bias_correction, self.max_grad_norm, self.use_nvlamb = bias_correction, max_grad_norm, use_nvlamb

    def decay(self, name):
        return 0.0 if excluded(name) else self.wd

    def apply(self, params, grads):
        beta1, beta2 = self.betas
        lr = self.lr_fn(self.step)  # the schedule index as bertjax uses it (0-based)
        self.step += 1
        c1 = 1 - beta1**self.step if self.bias_correction else 1.0
        c2 = 1 - beta2**self.step if self.bias_correction else 1.0
        global_norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
        clipped = global_norm / self.max_grad_norm if global_norm > self.max_grad_norm else 1.0
        out = {}
        for name, p in params.items():
            decay = self.decay(name)
            g = grads[name] / clipped
            self.m[name] = self.m[name] * beta1 + (1 - beta1) * g
            self.v[name] = self.v[name] * beta2 + (1 - beta2) * g * g
            update = (self.m[name] / c1) / (np.sqrt(self.v[name] / c2) + self.eps) + decay * p
            ratio = lr
            if self.use_nvlamb or decay != 0.0:
                p_norm, u_norm = np.linalg.norm(p), np.linalg.norm(update)
                ratio = lr * (p_norm / u_norm) if (u_norm != 0 and p_norm != 0) else lr
            out[name] = p - ratio * update
        return out


# --- Helpers --------------------------------------------------------------------------------------------


def toy_params(rng):
    """A little tree with every kind of name: kernels, embeddings, biases, LayerNorm, a zero kernel."""
    return {
        "embeddings": {"word_embeddings": {"embedding": rng.normal(0, 0.5, (6, 4))},
                       "layer_norm": {"scale": 1 + rng.normal(0, 0.1, (4,)), "bias": rng.normal(0, 0.1, (4,))}},
        "dense": {"kernel": rng.normal(0, 0.5, (4, 3)), "bias": rng.normal(0, 0.1, (3,))},
        "zero_dense": {"kernel": np.zeros((3, 2)), "bias": np.zeros((2,))},  # zero norm: ratio 1
        "mlm_head": {"output_bias": rng.normal(0, 0.1, (6,))},
    }


def flat(tree):
    return {"/".join(k): np.asarray(v, np.float64) for k, v in traverse_util.flatten_dict(tree).items()}


def unflat(d):
    return traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in d.items()})


def to_jax(tree):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), tree)


def run_optax(tx, params, grads_seq):
    params = to_jax(params)
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for grads in grads_seq:
        params, state = step(params, state, to_jax(grads))
    return params, state


def random_grads(rng, params, steps, scale=1.0):
    return [jax.tree_util.tree_map(lambda p: scale * rng.normal(0, 1, np.shape(p)), params) for _ in range(steps)]


def small_model_config(**overrides):
    fields = dict(vocab_size=53, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=16, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    fields.update(overrides)
    return BertConfig(**fields)


@functools.lru_cache(maxsize=None)
def model_param_shapes(scan_layers, boxed=False):
    """The real model's parameter tree as shapes: the mask reads only names, and compiling init is slow."""
    cfg = small_model_config(scan_layers=scan_layers)
    variables = jax.eval_shape(
        lambda key: bert_model.BertForPreTraining(cfg).init({"params": key}, **bert_model.dummy_batch(2, 8, 3)),
        jax.random.key(0),
    )
    return variables["params"] if boxed else nn.unbox(variables["params"])


def model_params(scan_layers, seed=0):
    """Random values in the model's shapes (LayerNorm scales near 1, biases near 0, as at init)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32), model_param_shapes(scan_layers)
    )


# --- Schedules ------------------------------------------------------------------------------------------


def test_linear_schedule_matches_original_bert():
    peak, warmup, total = 1e-4, 10_000, 1_000_000
    schedule = optim.learning_rate_schedule(peak, warmup, total, "linear")
    steps = [0, 1, warmup // 2, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1, total, total + 7]
    got = [float(schedule(jnp.asarray(s, jnp.int32))) for s in steps]
    want = [bert_learning_rate(s, peak, warmup, total) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    # Decay measured from step 0: right after warmup the rate is already peak * (1 - warmup/total).
    assert got[steps.index(warmup)] == pytest.approx(peak * (1 - warmup / total), rel=1e-6)
    assert got[0] == 0.0 and got[-1] == 0.0


def test_poly_schedule_matches_nvidia_lamb_recipe():
    # Phase 1 of NVIDIA's recipe: lr 6e-3, 7,038 steps, warmup 28.43% (2,000 steps here, a whole number).
    peak, total, warmup = 6e-3, 7038, 2000
    schedule = optim.learning_rate_schedule(peak, warmup, total, "poly", power=0.5)
    steps = [0, warmup // 2, warmup - 1, warmup, (warmup + total) // 2, total - 1, total]
    got = [float(schedule(s)) for s in steps]
    nvidia = [nvidia_learning_rate(s, peak, warmup / total, total, 0.5) for s in steps]
    bert = [bert_learning_rate(s, peak, warmup, total, power=0.5) for s in steps]
    np.testing.assert_allclose(got, nvidia, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got, bert, rtol=1e-6, atol=1e-12)


def test_schedule_without_warmup_and_bad_arguments():
    schedule = optim.learning_rate_schedule(1.0, 0, 10)
    np.testing.assert_allclose([float(schedule(s)) for s in (0, 5, 10)], [1.0, 0.5, 0.0], atol=1e-7)
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.learning_rate_schedule(1.0, 11, 10)
    with pytest.raises(ValueError, match="decay"):
        optim.learning_rate_schedule(1.0, 1, 10, "cosine")


# --- Weight-decay mask ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scan_layers", [False, True])
def test_weight_decay_mask_on_the_model(scan_layers):
    params = model_param_shapes(scan_layers)
    mask = traverse_util.flatten_dict(optim.weight_decay_mask(params))
    assert mask.keys() == traverse_util.flatten_dict(params).keys()
    no_decay = {k for k, v in mask.items() if not v}
    decay = {k for k, v in mask.items() if v}
    # Exactly LayerNorm scale/bias and every bias (dense, attention projections, output_bias) are off.
    for path in no_decay:
        assert path[-1] in ("bias", "output_bias") or (path[-2].endswith("layer_norm") and path[-1] == "scale"), path
    for path in decay:
        assert path[-1] in ("kernel", "embedding"), path
    expected_no_decay = {k for k in mask if k[-1] in ("bias", "output_bias") or "layer_norm" in k[-2]}
    assert no_decay == expected_no_decay
    assert ("cls" not in str(no_decay)) and ("mlm_head", "output_bias") in no_decay
    assert ("bert", "embeddings", "layer_norm", "scale") in no_decay
    assert ("bert", "embeddings", "word_embeddings", "embedding") in decay
    layer = ("layers",) if scan_layers else ("layers_1",)
    assert ("bert", "encoder", *layer, "attention", "query", "kernel") in decay
    assert ("bert", "encoder", *layer, "attention", "query", "bias") in no_decay
    assert ("bert", "encoder", *layer, "mlp_layer_norm", "scale") in no_decay
    # Same answers as the original's regex rule on the '/'-joined names.
    for path, value in mask.items():
        assert value == (not any(re.search(r, "/".join(path)) for r in BERT_EXCLUDE))


def test_weight_decay_mask_on_boxed_params():
    boxed = model_param_shapes(scan_layers=True, boxed=True)
    mask = optim.weight_decay_mask(boxed)
    assert jax.tree_util.tree_structure(mask) == jax.tree_util.tree_structure(boxed)
    assert nn.unbox(mask) == optim.weight_decay_mask(nn.unbox(boxed))


# --- AdamW ----------------------------------------------------------------------------------------------


def test_bert_adamw_matches_original_adam_weight_decay():
    rng = np.random.default_rng(0)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 6)
    schedule = optim.learning_rate_schedule(1e-2, 2, 10)
    got, _ = run_optax(optim.bert_adamw(schedule, weight_decay=0.01, eps=1e-6), params, grads_seq)

    ref = NumpyAdamWeightDecay(flat(params), weight_decay_rate=0.01)
    p = flat(params)
    for step, grads in enumerate(grads_seq):
        p = ref.apply(p, flat(grads), bert_learning_rate(step, 1e-2, 2, 10))
    got = flat(got)
    for name in p:
        np.testing.assert_allclose(got[name], p[name], atol=1e-6, rtol=0, err_msg=name)
    # The decay really was applied where it should be (and not elsewhere): compare with no decay.
    no_wd, _ = run_optax(optim.bert_adamw(schedule, weight_decay=0.0), params, grads_seq)
    no_wd = flat(no_wd)
    assert not np.allclose(no_wd["dense/kernel"], got["dense/kernel"], atol=1e-7)
    np.testing.assert_array_equal(no_wd["dense/bias"], got["dense/bias"])
    np.testing.assert_array_equal(no_wd["embeddings/layer_norm/scale"], got["embeddings/layer_norm/scale"])


def test_full_bert_chain_from_config_matches_create_optimizer():
    """Clip 1.0 -> AdamWeightDecay with BERT's schedule, as create_optimizer builds it."""
    config = base_config()
    config.schedule.warmup_steps = 3
    num_steps = 8
    tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, num_steps)
    rng = np.random.default_rng(1)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 6, scale=5.0)  # global norm ~ 40: clipping is active
    got, _ = run_optax(tx, params, grads_seq)

    ref = NumpyAdamWeightDecay(flat(params), 0.01, 0.9, 0.999, 1e-6)
    p = flat(params)
    for step, grads in enumerate(grads_seq):
        lr = bert_learning_rate(step, 1e-4, 3, num_steps)
        assert float(schedule(step)) == pytest.approx(lr, rel=1e-6, abs=1e-12)
        p = ref.apply(p, tf_clip_by_global_norm(flat(grads), 1.0), lr)
    got = flat(got)
    for name in p:
        np.testing.assert_allclose(got[name], p[name], atol=1e-6, rtol=0, err_msg=name)


def test_bert_adamw_with_bias_correction_matches_torch_adamw():
    import torch
    rng = np.random.default_rng(2)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 5)
    lr, wd, eps = 1e-2, 0.01, 1e-6
    got, _ = run_optax(optim.bert_adamw(lr, eps=eps, weight_decay=wd, bias_correction=True), params, grads_seq)

    tensors = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in flat(params).items()}
    no_decay = [t for k, t in tensors.items() if excluded(k)]
    decay = [t for k, t in tensors.items() if not excluded(k)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.999), eps=eps,
    )
    for grads in grads_seq:
        for k, g in flat(grads).items():
            tensors[k].grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    got = flat(got)
    for k, t in tensors.items():
        np.testing.assert_allclose(got[k], t.detach().numpy(), atol=1e-6, rtol=0, err_msg=k)


def test_adam_state_is_float32_for_bfloat16_params():
    params = {"w": jnp.ones((3,), jnp.bfloat16)}
    state = optim.bert_adamw(1e-3).init(params)
    assert state[0].mu["w"].dtype == jnp.float32 and state[0].nu["w"].dtype == jnp.float32


# --- LAMB -----------------------------------------------------------------------------------------------


def assert_matches_apex(got, params, grads_seq, ref: "NumpyApexLamb"):
    """optax's parameters after the steps equal the apex reference's, run from the same start."""
    p = flat(params)
    for grads in grads_seq:
        p = ref.apply(p, flat(grads))
    got = flat(got)
    for name in p:
        np.testing.assert_allclose(got[name], p[name], atol=1e-6, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_lamb_matches_apex_kernel(use_nvlamb):
    rng = np.random.default_rng(3)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 5, scale=0.1)  # global norm < 1: apex does not clip
    schedule = optim.learning_rate_schedule(1e-2, 2, 10, "poly", 0.5)
    tx = optim.lamb(schedule, weight_decay=0.01, trust_ratio_on_all_params=use_nvlamb)
    got, _ = run_optax(tx, params, grads_seq)

    lr_fn = lambda s: bert_learning_rate(s, 1e-2, 2, 10, power=0.5)  # noqa: E731
    assert_matches_apex(got, params, grads_seq, NumpyApexLamb(flat(params), lr_fn, max_grad_norm=1e9,
                                                              use_nvlamb=use_nvlamb))
    # The zero kernel started at norm 0 (ratio 1 on the first step) and has moved since.
    assert np.abs(flat(got)["zero_dense/kernel"]).max() > 0


def test_lamb_from_config_matches_apex_with_clipping():
    config = base_config()
    config.optimizer.name = "lamb"
    config.optimizer.learning_rate = 6e-3
    config.optimizer.bias_correction = True  # FusedLAMB's default
    config.schedule.update(warmup_steps=2, decay="poly", power=0.5)
    tx, _ = optim.optimizer_from_config(config.optimizer, config.schedule, 10)
    rng = np.random.default_rng(4)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 5, scale=3.0)  # global norm ~ 20: clipped by FusedLAMB
    got, _ = run_optax(tx, params, grads_seq)

    lr_fn = lambda s: bert_learning_rate(s, 6e-3, 2, 10, power=0.5)  # noqa: E731
    assert_matches_apex(got, params, grads_seq, NumpyApexLamb(flat(params), lr_fn, max_grad_norm=1.0))


def test_lamb_on_all_params_equals_optax_lamb():
    rng = np.random.default_rng(5)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, 4)
    ours, _ = run_optax(optim.lamb(1e-2, trust_ratio_on_all_params=True), params, grads_seq)
    theirs, _ = run_optax(
        optax.lamb(1e-2, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=optim.weight_decay_mask), params, grads_seq
    )
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)


def test_lamb_trust_ratio_is_per_layer_under_scan():
    """scan_layers stacks the layers on one tensor; each layer must still get its own trust ratio."""
    unrolled = model_params(scan_layers=False)
    # Layers of different sizes, so that one norm over the stack would give visibly different ratios.
    layer_1 = unrolled["bert"]["encoder"]["layers_1"]
    unrolled["bert"]["encoder"]["layers_1"] = jax.tree_util.tree_map(lambda x: 5 * x, layer_1)
    cfg = small_model_config()

    def stacked(tree):
        tree = jax.tree_util.tree_map(lambda x: x, tree)
        tree["bert"]["encoder"] = bert_model.stack_layers(tree["bert"]["encoder"], cfg)
        return tree

    rng = np.random.default_rng(6)
    grads_seq = random_grads(rng, unrolled, 3, scale=0.01)
    tx = optim.lamb(1e-2)
    got_unrolled, _ = run_optax(tx, unrolled, grads_seq)
    got_scanned, _ = run_optax(tx, stacked(unrolled), [stacked(g) for g in grads_seq])
    got_scanned["bert"]["encoder"] = bert_model.unstack_layers(got_scanned["bert"]["encoder"], cfg)
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(got_unrolled)[0], jax.tree_util.tree_leaves(got_scanned)
    ):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6, err_msg=jax.tree_util.keystr(path))


# --- Clipping -------------------------------------------------------------------------------------------


def test_global_norm_clipping_in_the_chain():
    grads = {"a": jnp.array([6.0, 0.0]), "b": jnp.array([[0.0, 8.0]])}  # global norm 10
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    assert float(optax.tree.norm(clipped)) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(clipped["a"], [0.6, 0.0], rtol=1e-6)

    # Through optimizer_from_config: the first moment after one step is (1 - b1) * the clipped gradient.
    config = base_config()
    tx, _ = optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
    params = jax.tree_util.tree_map(jnp.ones_like, grads)
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree_utils.tree_get(state, "mu")
    np.testing.assert_allclose(mu["a"], [0.06, 0.0], rtol=1e-6)
    np.testing.assert_allclose(mu["b"], [[0.0, 0.08]], rtol=1e-6)


# --- Gradient accumulation ------------------------------------------------------------------------------


def regression_loss(params, batch, rng):
    del rng
    err = batch["x"] @ params["w"] + params["b"] - batch["y"]  # [B]
    return jnp.mean(err**2), {"sse": jnp.sum(err**2), "count": jnp.asarray(err.shape[0], jnp.float32)}


def test_accumulate_gradients_equals_full_batch():
    rng = np.random.default_rng(7)
    batch = {"x": jnp.asarray(rng.normal(size=(16, 3)), jnp.float32),
             "y": jnp.asarray(rng.normal(size=(16,)), jnp.float32)}
    params = {"w": jnp.asarray([0.5, -1.0, 2.0]), "b": jnp.asarray(0.3)}
    fn = jax.value_and_grad(regression_loss, has_aux=True)
    (loss, metrics), grads = fn(params, batch, None)
    accumulate = jax.jit(optim.accumulate_gradients, static_argnums=(0, 3))
    (loss4, metrics4), grads4 = accumulate(fn, params, batch, 4, jax.random.key(0))
    np.testing.assert_allclose(loss4, loss, rtol=1e-6)
    for k in metrics:
        np.testing.assert_allclose(metrics4[k], metrics[k], rtol=1e-6)
    for k in grads:
        np.testing.assert_allclose(grads4[k], grads[k], rtol=1e-5, atol=1e-7)
    # k == 1 is the plain call.
    (loss1, _), grads1 = optim.accumulate_gradients(fn, params, batch, 1, None)
    np.testing.assert_allclose(loss1, loss, rtol=1e-7)


def test_accumulate_gradients_errors():
    def fn(params, microbatch, rng):
        return (jnp.sum(params * microbatch["x"].mean()), {}), params

    with pytest.raises(ValueError, match="train.grad_accum_steps=4"):
        optim.accumulate_gradients(fn, jnp.ones(()), {"x": jnp.zeros((10, 2))}, 4, jax.random.key(0))
    with pytest.raises(ValueError, match="train.grad_accum_steps=0"):
        optim.accumulate_gradients(fn, jnp.ones(()), {"x": jnp.zeros((12,))}, 0, jax.random.key(0))


def test_accumulated_mlm_loss_matches_only_with_equal_prediction_counts():
    """BERT's MLM loss is a weighted mean: microbatch means average to it only for equal counts."""
    rng = np.random.default_rng(8)
    logits = jnp.asarray(rng.normal(size=(8, 5, 11)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 11, size=(8, 5)), jnp.int32)
    nsp_labels = jnp.zeros((8,), jnp.int32)

    def fn(params, mb, rng):
        def loss(p):
            return bert_model.pretraining_loss(mb["logits"] * p, jnp.zeros((mb["ids"].shape[0], 2)), mb["ids"],
                                          mb["weights"], nsp_labels[: mb["ids"].shape[0]])
        return jax.value_and_grad(loss, has_aux=True)(params)

    def compare(weights):
        batch = {"logits": logits, "ids": ids, "weights": jnp.asarray(weights, jnp.float32)}
        (full, full_metrics), full_grad = fn(jnp.float32(1.0), batch, None)
        (acc, acc_metrics), acc_grad = optim.accumulate_gradients(fn, jnp.float32(1.0), batch, 2, None)
        assert float(acc_metrics["mlm_count"]) == float(full_metrics["mlm_count"])
        return float(full), float(acc), float(full_grad), float(acc_grad)

    equal = np.ones((8, 5))
    equal[:, 3:] = 0  # 3 predictions per sequence: every microbatch has 12
    full, acc, g_full, g_acc = compare(equal)
    assert acc == pytest.approx(full, rel=1e-5) and g_acc == pytest.approx(g_full, rel=1e-4)
    unequal = equal.copy()
    unequal[0::2, 1:] = 0  # microbatch 0 (examples 0, 2, ...) has 4 predictions, microbatch 1 has 12
    full, acc, _, _ = compare(unequal)
    assert abs(acc - full) > 1e-3


# --- The config adapter ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizer_from_base_config(name):
    config = base_config()
    config.optimizer.name = name
    tx, schedule = optim.optimizer_from_config(config.optimizer, config.schedule, config.train.num_steps)
    assert float(schedule(config.schedule.warmup_steps // 2)) == pytest.approx(config.optimizer.learning_rate / 2)
    rng = np.random.default_rng(9)
    params = toy_params(rng)
    final, state = run_optax(tx, params, random_grads(rng, params, 3))
    assert int(state[1][0].count) == 3  # (clip, (adam, ...)): three updates applied
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(final))
    leaves = zip(jax.tree_util.tree_leaves(final), jax.tree_util.tree_leaves(to_jax(params)))
    moved = [float(jnp.abs(a - b).max()) for a, b in leaves]
    assert max(moved) > 0  # step 0 has learning rate 0 (warmup), the later ones do not


def test_optimizer_from_config_errors():
    config = base_config()
    config.optimizer.name = "sgd"
    with pytest.raises(ValueError, match=r"optimizer\.name='sgd'"):
        optim.optimizer_from_config(config.optimizer, config.schedule, 100_000)
    config = base_config()
    with pytest.raises(ValueError, match=r"schedule\.warmup_steps=10000.*train\.num_steps=5000"):
        optim.optimizer_from_config(config.optimizer, config.schedule, 5000)
    config.schedule.decay = "cosine"
    with pytest.raises(ValueError, match=r"schedule\.decay"):
        optim.optimizer_from_config(config.optimizer, config.schedule, 100_000)
    config = base_config()
    config.schedule.power = 0.5  # with decay='linear'
    with pytest.raises(ValueError, match=r"schedule\.power"):
        optim.optimizer_from_config(config.optimizer, config.schedule, 100_000)


def test_warmup_stable_decay_schedule():
    """ModernBERT's trapezoid: linear warmup, flat at the peak, 1 - sqrt to 0 over the last decay_steps."""
    schedule = optim.warmup_stable_decay_schedule(2.0, warmup_steps=10, total_steps=100, decay_steps=40)
    values = {step: float(schedule(step)) for step in (0, 5, 10, 59, 60, 70, 100, 120)}
    assert values[0] == 0.0 and values[5] == pytest.approx(1.0) and values[10] == values[59] == 2.0
    assert values[60] == 2.0 and values[70] == pytest.approx(2.0 * (1 - 0.5)) and values[100] == values[120] == 0.0
    with pytest.raises(ValueError, match="must fit in total_steps"):
        optim.warmup_stable_decay_schedule(1.0, warmup_steps=70, total_steps=100, decay_steps=40)


def test_decoupled_adamw_decays_by_lr_over_peak():
    """composer's DecoupledAdamW: the decay term is wd * (lr(t) / peak) * w, not wd * lr(t) * w."""
    import ml_collections

    o = ml_collections.ConfigDict(dict(name="decoupled_adamw", learning_rate=0.5, b1=0.9, b2=0.98, eps=1e-6,
                                       weight_decay=0.1, bias_correction=True, clip_norm=0.0))
    s = ml_collections.ConfigDict(dict(warmup_steps=0, decay="wsd", power=1.0, decay_steps=0))
    tx, _ = optim.optimizer_from_config(o, s, num_steps=10)
    params = {"dense": {"kernel": jnp.full((2,), 3.0)}, "layer_norm": {"scale": jnp.full((2,), 3.0)}}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.1 * 3.0, rtol=1e-6)  # lr(t) = peak here
    np.testing.assert_allclose(updates["layer_norm"]["scale"], 0.0)  # norms do not decay


# --- StableAdamW ----------------------------------------------------------------------------------------


def stable_adamw_config(name, weight_decay):
    import ml_collections

    o = ml_collections.ConfigDict(dict(name=name, learning_rate=0.02, b1=0.9, b2=0.98, eps=1e-6,
                                       weight_decay=weight_decay, bias_correction=True, clip_norm=0.0))
    s = ml_collections.ConfigDict(dict(warmup_steps=4, decay="wsd", power=1.0, decay_steps=6))
    return o, s


@pytest.mark.parametrize("name,weight_decay", [("stable_adamw", 0.0), ("stable_adamw", 0.5),
                                               ("decoupled_stable_adamw", 0.5)])
def test_stable_adamw_matches_optimi_step_for_step(name, weight_decay):
    """optimi.StableAdamW (what ModernBERT trains with) and optimizer_from_config's, on the same gradients
    for 20 steps under a warmup-stable-decay schedule, with the no-decay parameter group; some steps'
    gradients are 30x the others', so that the update clipping engages."""
    import torch
    from optimi import StableAdamW

    steps = 20
    o, s = stable_adamw_config(name, weight_decay)
    tx, schedule = optim.optimizer_from_config(o, s, steps)
    rng = np.random.default_rng(11)
    params = toy_params(rng)
    grads_seq = random_grads(rng, params, steps)
    for step in (6, 13):  # spikes on some tensors only
        grads_seq[step]["dense"]["kernel"] *= 30.0
        grads_seq[step]["embeddings"]["layer_norm"]["bias"] *= 30.0

    tensors = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in flat(params).items()}
    groups = [{"params": [t for k, t in tensors.items() if not excluded(k)], "weight_decay": weight_decay},
              {"params": [t for k, t in tensors.items() if excluded(k)], "weight_decay": 0.0}]
    with warnings.catch_warnings():  # optimi warns that 0.5 is a large fully decoupled decay: chosen to show
        warnings.simplefilter("ignore", UserWarning)
        reference = StableAdamW(groups, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps,
                                decouple_lr=name.startswith("decoupled"), max_lr=o.learning_rate, foreach=False,
                                triton=False)

    params_jax, state = to_jax(params), tx.init(to_jax(params))
    step_fn = jax.jit(lambda p, st, g: (lambda u, st: (optax.apply_updates(p, u), st))(*tx.update(g, st, p)))
    worst, clipped = 0.0, set()
    for step, grads in enumerate(grads_seq):
        for k, g in flat(grads).items():
            tensors[k].grad = torch.tensor(g, dtype=torch.float32)
        for group in reference.param_groups:
            group["lr"] = float(schedule(step))  # what optax reads at this step (0-based)
        reference.step()
        for k, t in tensors.items():  # the RMS optimi divided this step's lr by
            v = reference.state[t]["exp_avg_sq"]
            if float((t.grad**2 / v.clamp(min=o.eps**2)).mean().sqrt()) > 1.0 + 1e-3:
                clipped.add((step, k))
        params_jax, state = step_fn(params_jax, state, to_jax(grads))
        got = flat(params_jax)
        worst = max(worst, max(float(np.abs(got[k] - t.detach().numpy()).max()) for k, t in tensors.items()))
    print(f"{name} weight_decay={weight_decay}: max |bertjax - optimi| over {steps} steps = {worst:.2e}")
    assert worst < 1e-6, worst
    assert {(6, "dense/kernel"), (13, "embeddings/layer_norm/bias")} <= clipped, sorted(clipped)


def test_stable_adamw_rms_is_per_layer_under_scan():
    """The stacked layers' tensors get one RMS per layer: scanned and unrolled layouts take the same steps."""
    rng = np.random.default_rng(12)
    layers = rng.normal(0, 0.5, (2, 3, 4))
    unrolled = {"layers_0": {"kernel": layers[0]}, "layers_1": {"kernel": layers[1]}}
    scanned = {"layers": {"kernel": layers}}
    grads = [rng.normal(0, 1, (2, 3, 4)) for _ in range(3)]
    grads[2][1] *= 40.0  # only layer 1 spikes: its RMS alone exceeds 1
    tx = optim.stable_adamw(0.1, weight_decay=0.1)
    got_unrolled, _ = run_optax(tx, unrolled, [{"layers_0": {"kernel": g[0]}, "layers_1": {"kernel": g[1]}}
                                               for g in grads])
    got_scanned, _ = run_optax(tx, scanned, [{"layers": {"kernel": g}} for g in grads])
    for i in range(2):
        np.testing.assert_allclose(got_scanned["layers"]["kernel"][i], got_unrolled[f"layers_{i}"]["kernel"],
                                   atol=1e-6, rtol=0)


def test_stable_adamw_config_errors():
    o, s = stable_adamw_config("stable_adamw", 0.1)
    o.bias_correction = False
    with pytest.raises(ValueError, match=r"optimizer\.bias_correction=False .*set optimizer\.bias_correction=True"):
        optim.optimizer_from_config(o, s, 20)
    # As a run checks its config before building anything: one line naming the key and the choices.
    from bertjax.runs import config_checks

    config = runpy.run_path(str(REPO / "configs" / "modernbert_tiny.py"))["get_config"]()
    config.optimizer.name = "stableadamw"
    with pytest.raises(ValueError) as error:
        config_checks.check_pretraining(config)
    assert "\n" not in str(error.value)
    assert str(error.value).startswith("optimizer.name='stableadamw' is unknown: choose one of ")
    assert "'stable_adamw'" in str(error.value) and "'decoupled_stable_adamw'" in str(error.value)
