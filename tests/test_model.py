"""The model's options against each other, and the configs against Hugging Face's parameter counts.

Numerical parity with Hugging Face BertForPreTraining itself is in test_hf.py.
"""

import pathlib
import runpy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.models import bert, layers

from bertjax.models.config import BertConfig

REPO = pathlib.Path(__file__).resolve().parents[1]
SIZES = ["tiny", "mini", "small", "medium", "base", "large"]


def load_config(size):
    return runpy.run_path(str(REPO / "configs" / f"{size}.py"))["get_config"]()


def small_config(**overrides):
    fields = dict(
        vocab_size=97, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=128,
        max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
    )
    fields.update(overrides)
    return BertConfig(**fields)


def make_batch(rng, batch=3, seq=12, preds=4, vocab=97, lengths=(12, 7, 9)):
    input_ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32)
    input_mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    input_ids = input_ids * input_mask
    segment_ids = ((np.arange(seq)[None, :] >= np.array(lengths)[:, None] // 2) * input_mask).astype(np.int32)
    positions = np.stack([rng.choice(np.arange(1, n - 1), size=preds, replace=False) for n in lengths])
    return {
        "input_ids": jnp.asarray(input_ids),
        "segment_ids": jnp.asarray(segment_ids),
        "input_mask": jnp.asarray(input_mask),
        "masked_lm_positions": jnp.asarray(positions.astype(np.int32)),
    }


def init(cfg, batch, seed=0):
    # Jitted, as apply: op by op, initialising a whole model is slower than compiling it.
    variables = jax.jit(lambda b: bert.BertForPreTraining(cfg).init({"params": jax.random.key(seed)}, **b))(batch)
    return nn.unbox(variables["params"])


def apply(cfg, params, batch, deterministic=True, rngs=None):
    # Jitted: op-by-op execution of a whole model is many times slower than compiling it.
    run = jax.jit(
        lambda p, b, r: bert.BertForPreTraining(cfg).apply({"params": p}, **b, deterministic=deterministic, rngs=r)
    )
    return run(params, batch, rngs)


def grad(cfg, params, batch):
    return jax.jit(jax.grad(lambda p: loss_fn(cfg, p, batch)))(params)


def loss_fn(cfg, params, batch):
    out = apply(cfg, params, batch)
    ids = batch["input_ids"][jnp.arange(3)[:, None], batch["masked_lm_positions"]]
    loss, _ = bert.pretraining_loss(
        out["mlm_logits"], out["nsp_logits"], ids, jnp.ones(ids.shape), jnp.array([0, 1, 0])
    )
    return loss


def with_scanned_encoder(params, cfg):
    params = jax.tree_util.tree_map(lambda x: x, params)  # copy the dict structure
    params["bert"]["encoder"] = bert.stack_layers(params["bert"]["encoder"], cfg)
    return params


def assert_trees_close(a, b, atol, rtol=0.0):
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    assert ta == tb
    for (path, x), (_, y) in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol, err_msg=str(path))


@pytest.mark.parametrize("size", SIZES)
def test_config_builds_model_with_hf_parameter_count(size):
    """Each config's model has exactly as many parameters as HF BertForPreTraining of that shape."""
    import torch
    import transformers
    config = load_config(size)
    cfg = BertConfig.from_dict(config.model)
    batch = bert.dummy_batch(2, config.data.max_seq_length, config.data.max_predictions_per_seq)
    shapes = jax.eval_shape(lambda: nn.unbox(bert.BertForPreTraining(cfg).init(jax.random.key(0), **batch)))
    ours = bert.count_params(shapes["params"])
    hf_config = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
    )
    with torch.device("meta"):
        hf_model = transformers.BertForPreTraining(hf_config)
    # parameters() yields tied tensors once, as the decoder shares the word embeddings here too.
    theirs = sum(p.numel() for p in hf_model.parameters())
    assert ours == theirs
    if size == "base":
        assert 109e6 < ours < 111e6
    if size == "large":
        assert 334e6 < ours < 342e6
    assert cfg.num_heads * 64 == cfg.hidden_size and cfg.intermediate_size == 4 * cfg.hidden_size


def test_unknown_model_key_is_an_error():
    with pytest.raises(ValueError, match="unknown model config key.*hiden_size"):
        BertConfig.from_dict({"hiden_size": 3})


def test_cudnn_with_attention_dropout_is_refused():
    with pytest.raises(ValueError, match="attention_dropout_rate=0.0"):
        BertConfig(attention_impl="cudnn", attention_dropout_rate=0.1)


@pytest.mark.slow
def test_scan_equals_unrolled_outputs_and_gradients():
    cfg = small_config()
    batch = make_batch(np.random.default_rng(0))
    params = init(cfg, batch)
    scan_cfg = small_config(scan_layers=True)
    scan_params = with_scanned_encoder(params, scan_cfg)
    # The scanned model initialises the same tree shape that stack_layers builds.
    scan_init = init(scan_cfg, batch)
    assert jax.tree_util.tree_structure(scan_init) == jax.tree_util.tree_structure(scan_params)
    assert_trees_close(apply(cfg, params, batch), apply(scan_cfg, scan_params, batch), atol=1e-5)

    grads = grad(cfg, params, batch)
    scan_grads = grad(scan_cfg, scan_params, batch)
    scan_grads["bert"]["encoder"] = bert.unstack_layers(scan_grads["bert"]["encoder"], scan_cfg)
    assert_trees_close(grads, scan_grads, atol=1e-6, rtol=1e-4)


# Each policy once, two of them under scan (where the remat wraps the scanned body).
@pytest.mark.slow
@pytest.mark.parametrize("policy,scan", [("full", True), ("dots", False), ("dots_no_batch", True)])
def test_remat_changes_nothing_numerically(policy, scan):
    base = small_config(scan_layers=scan)
    batch = make_batch(np.random.default_rng(1))
    params = init(base, batch)
    remat = small_config(scan_layers=scan, remat_policy=policy)
    assert_trees_close(apply(base, params, batch), apply(remat, params, batch), atol=1e-6)
    grads = grad(base, params, batch)
    remat_grads = grad(remat, params, batch)
    assert_trees_close(grads, remat_grads, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_padding_does_not_change_real_positions(pre_ln):
    cfg = small_config(pre_layer_norm=pre_ln)
    batch = make_batch(np.random.default_rng(2), seq=12)
    params = init(cfg, batch)
    padded = dict(batch)
    extra = 9
    for key in ("input_ids", "segment_ids", "input_mask"):
        # Padding that is not zero in the ids: the mask alone must keep it out of every real position.
        fill = 7 if key == "input_ids" else 0
        padded[key] = jnp.pad(batch[key], ((0, 0), (0, extra)), constant_values=fill)
    out = apply(cfg, params, batch)
    out_padded = apply(cfg, params, padded)
    mask = np.asarray(batch["input_mask"], bool)
    np.testing.assert_allclose(
        np.asarray(out_padded["sequence_output"])[:, :12][mask], np.asarray(out["sequence_output"])[mask], atol=1e-5
    )
    for key in ("pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(np.asarray(out_padded[key]), np.asarray(out[key]), atol=1e-5, err_msg=key)


@pytest.mark.slow
def test_dropout_only_in_training():
    cfg = small_config(hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
    batch = make_batch(np.random.default_rng(3))
    params = init(cfg, batch)
    eval_a = apply(cfg, params, batch, deterministic=True)
    eval_b = apply(cfg, params, batch, deterministic=True)
    assert_trees_close(eval_a, eval_b, atol=0)
    train_a = apply(cfg, params, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})
    train_b = apply(cfg, params, batch, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(train_a["sequence_output"], eval_a["sequence_output"], atol=1e-3)
    assert not np.allclose(train_a["sequence_output"], train_b["sequence_output"], atol=1e-3)


def test_attention_with_dropout_path_matches_dot_product_attention():
    """The explicit softmax used when attention dropout is active computes what dot_product_attention does."""
    batch = make_batch(np.random.default_rng(4))
    # A dropout rate so small that no element is dropped, to reach the explicit path in training mode.
    explicit = small_config(attention_dropout_rate=1e-12)
    params = init(explicit, batch)
    fused = apply(small_config(), params, batch, deterministic=True)
    manual = apply(explicit, params, batch, deterministic=False, rngs={"dropout": jax.random.key(0)})
    assert_trees_close(fused, manual, atol=1e-5)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_parameters():
    batch = make_batch(np.random.default_rng(5))
    cfg32 = small_config()
    cfg16 = small_config(dtype="bfloat16")
    params = init(cfg16, batch)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype("float32")}
    out16 = apply(cfg16, params, batch)
    out32 = apply(cfg32, params, batch)
    assert out16["sequence_output"].dtype == jnp.bfloat16
    assert out16["mlm_logits"].dtype == jnp.float32  # accumulated in float32 for the softmax
    np.testing.assert_allclose(
        np.asarray(out16["mlm_logits"]), np.asarray(out32["mlm_logits"]), atol=0.1, rtol=0.05
    )
    grads = grad(cfg16, params, batch)
    assert {x.dtype for x in jax.tree_util.tree_leaves(grads)} == {jnp.dtype("float32")}


def test_pre_layer_norm_option():
    batch = make_batch(np.random.default_rng(6))
    cfg = small_config(pre_layer_norm=True)
    params = init(cfg, batch)
    assert "final_layer_norm" in params["bert"]["encoder"]
    out = apply(cfg, params, batch)
    # The final LayerNorm (scale 1, bias 0 at init) normalises every position of the pre-LN stack.
    seq = np.asarray(out["sequence_output"])
    np.testing.assert_allclose(seq.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(seq.std(-1), 1, atol=1e-3)
    post = init(small_config(), batch)
    assert "final_layer_norm" not in post["bert"]["encoder"]


def test_hidden_states_are_embeddings_then_every_layer():
    for scan in (False, True):
        cfg = small_config(scan_layers=scan)
        batch = make_batch(np.random.default_rng(7))
        params = init(cfg, batch)["bert"]
        out = jax.jit(
            lambda p, b, cfg=cfg: bert.BertModel(cfg).apply(
                {"params": p}, b["input_ids"], b["segment_ids"], b["input_mask"], output_hidden_states=True
            )
        )(params, batch)
        assert len(out["hidden_states"]) == cfg.num_layers + 1
        np.testing.assert_array_equal(out["hidden_states"][-1], out["sequence_output"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", [dict(), dict(pre_layer_norm=True, remat_policy="full"), dict(scan_layers=True)])
def test_heads_only_gives_the_full_models_heads_loss_and_gradients(variant):
    """heads_only runs the last block only at [CLS] and the masked positions: nothing the heads read changes."""
    cfg = small_config(**variant)
    batch = make_batch(np.random.default_rng(11))
    params = init(cfg, batch)
    labels = batch["input_ids"][jnp.arange(3)[:, None], batch["masked_lm_positions"]]

    def run(p, heads_only):
        out = bert.BertForPreTraining(cfg).apply({"params": p}, **batch, heads_only=heads_only)
        loss, _ = bert.pretraining_loss(out["mlm_logits"], out["nsp_logits"], labels, jnp.ones(labels.shape),
                                         jnp.array([0, 1, 0]))
        return loss, out

    full = jax.jit(lambda p: jax.value_and_grad(lambda q: run(q, False), has_aux=True)(p))
    sparse = jax.jit(lambda p: jax.value_and_grad(lambda q: run(q, True), has_aux=True)(p))
    (loss_full, out_full), grads_full = full(params)
    (loss_sparse, out_sparse), grads_sparse = sparse(params)
    np.testing.assert_allclose(float(loss_sparse), float(loss_full), rtol=1e-6)
    for key in ("mlm_logits", "nsp_logits", "pooled_output"):
        np.testing.assert_allclose(np.asarray(out_sparse[key]), np.asarray(out_full[key]), atol=2e-5, err_msg=key)
    # sequence_output holds just the masked rows of the full one.
    rows = np.asarray(out_full["sequence_output"])[np.arange(3)[:, None], np.asarray(batch["masked_lm_positions"])]
    np.testing.assert_allclose(np.asarray(out_sparse["sequence_output"]), rows, atol=2e-5)
    assert_trees_close(grads_sparse, grads_full, atol=1e-6, rtol=1e-4)


def test_heads_only_rows_exclude_hidden_states():
    cfg = small_config()
    batch = make_batch(np.random.default_rng(12))
    params = init(cfg, batch)["bert"]
    with pytest.raises(ValueError, match="exclude each other"):
        bert.BertModel(cfg).apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                                   output_hidden_states=True, output_rows=batch["masked_lm_positions"])


@pytest.mark.parametrize("shape", [(64, 128, 96), (4001, 33)])  # even last axis (16-bit pairs), odd (fallback)
def test_dropout_rate_scale_and_independence(shape):
    rate = 0.1
    x = jnp.ones(shape, jnp.float32)
    drop = layers.Dropout(rate)
    y = np.asarray(drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(0)}))
    n = y.size
    kept = y != 0
    # Binomial(n, 0.9): the kept share is within 5 standard deviations of 0.9.
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(y[kept], 1 / (1 - rate), rtol=1e-6)  # inverted dropout keeps the mean
    # The two 16-bit halves of a word are independent draws: the first and second half of the last
    # axis agree on keep/drop as often as independent coins would (0.82), not always.
    if shape[-1] % 2 == 0:
        half = shape[-1] // 2
        agree = (kept[..., :half] == kept[..., half:]).mean()
        p_agree = (1 - rate) ** 2 + rate**2
        assert abs(agree - p_agree) < 5 * np.sqrt(p_agree * (1 - p_agree) / (n / 2))
    other = np.asarray(drop.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)}))
    assert (kept != (other != 0)).any()  # another key, another mask
    np.testing.assert_array_equal(np.asarray(drop.apply({}, x, deterministic=True)), np.asarray(x))


def test_mlm_loss_gradient_is_softmax_minus_one_hot():
    rng = np.random.default_rng(9)
    logits = jnp.asarray(rng.normal(size=(2, 3, 11)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 11, size=(2, 3)))
    weights = jnp.asarray(np.array([[1, 1, 0], [1, 0, 1]], np.float32))
    nsp, labels = jnp.zeros((2, 2)), jnp.array([0, 1])
    g = jax.grad(lambda x: bert.pretraining_loss(x, nsp, ids, weights, labels)[0])(logits)
    expected = (jax.nn.softmax(logits, -1) - jax.nn.one_hot(ids, 11)) * weights[..., None] / (4 + 1e-5)
    np.testing.assert_allclose(np.asarray(g), np.asarray(expected), atol=1e-7)


def test_pretraining_loss_against_numpy():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32)
    nsp = rng.normal(size=(2, 2)).astype(np.float32)
    ids = rng.integers(0, 11, size=(2, 3))
    weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    labels = np.array([0, 1])

    def nll(x, y):
        x = x - x.max()
        return np.log(np.exp(x).sum()) - x[y]

    mlm = sum(weights[b, p] * nll(logits[b, p], ids[b, p]) for b in range(2) for p in range(3)) / (3 + 1e-5)
    nsp_loss = np.mean([nll(nsp[b], labels[b]) for b in range(2)])
    loss, metrics = bert.pretraining_loss(logits, nsp, ids, weights, labels)
    np.testing.assert_allclose(float(loss), mlm + nsp_loss, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm, rtol=1e-6)
    assert float(metrics["mlm_count"]) == 3
    expected_correct = sum(weights[b, p] * (logits[b, p].argmax() == ids[b, p]) for b in range(2) for p in range(3))
    assert float(metrics["mlm_correct"]) == expected_correct


@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_has_logical_axis_names(scan):
    cfg = small_config(scan_layers=scan)
    batch = make_batch(np.random.default_rng(9))
    boxed = jax.eval_shape(lambda: bert.BertForPreTraining(cfg).init(jax.random.key(0), **batch))["params"]
    leaves = jax.tree_util.tree_leaves_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    for path, leaf in leaves:
        assert isinstance(leaf, nn.LogicallyPartitioned), f"{jax.tree_util.keystr(path)} has no axis names"
        assert len(leaf.names) == leaf.value.ndim, jax.tree_util.keystr(path)
        if scan and "encoder" in jax.tree_util.keystr(path) and "layers" in jax.tree_util.keystr(path):
            assert leaf.names[0] == "layers"


@pytest.mark.mesh
@pytest.mark.slow
def test_sharded_model_equals_one_device():
    """The config's rules table lays the model out over a (data, fsdp, tensor) = (2, 2, 2) mesh."""
    assert jax.device_count() == 8, "the mesh session has 8 virtual CPU devices"
    rules = [tuple(r) for r in load_config("tiny").logical_axis_rules]
    cfg = small_config(scan_layers=True, vocab_size=96)
    batch = make_batch(np.random.default_rng(10), batch=4, lengths=(12, 7, 9, 6), vocab=96)
    module = bert.BertForPreTraining(cfg)
    reference = module.apply({"params": init(cfg, batch)}, **batch)

    # Auto axes: the shardings come from the constraints the model places (Explicit axes would turn them
    # into assertions).
    auto = (jax.sharding.AxisType.Auto,) * 3
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), devices=jax.devices(), axis_types=auto)
    abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), **batch))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        variables = jax.jit(lambda: module.init(jax.random.key(0), **batch), out_shardings=shardings)()
        params = nn.unbox(variables["params"])
        word = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
        assert word.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
        query = params["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"]
        assert query.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
        assert query.addressable_shards[0].data.shape == (cfg.num_layers, 32, 2, 16)
        data_sharding = nn.logical_to_mesh_sharding(jax.sharding.PartitionSpec("batch"), mesh, rules)
        sharded_batch = {k: jax.device_put(v, data_sharding) for k, v in batch.items()}
        out = jax.jit(lambda p, b: module.apply({"params": p}, **b))(params, sharded_batch)
    assert_trees_close(reference, out, atol=1e-5)
