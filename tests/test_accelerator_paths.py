"""The model's accelerator paths, checked on the CPU: embeddings without colliding scatters, padding as
sequence lengths (the form cuDNN flash attention takes), the platform defaults, named remat policies,
batches prefetched to the devices, and the benchmark's kernel breakdown."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.bench import step_profile, step_speed
from bertjax.models import attention, bert, layers
from bertjax.models.config import resolve_platform, BertConfig
from bertjax.training import sharding

VOCAB, HIDDEN, MAX_POS = 97, 64, 40


def tiny_config(**overrides):
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=4, intermediate_size=128,
                  max_position_embeddings=MAX_POS, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
    fields.update(overrides)
    return BertConfig(**fields)


def make_batch(seed=0, batch=4, seq=16, preds=3, lengths=(16, 9, 12, 5)):
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(5, VOCAB, size=(batch, seq)).astype(np.int32) * mask
    segments = ((np.arange(seq)[None, :] >= np.array(lengths)[:, None] // 2) * mask).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), size=preds, replace=False)) for n in lengths])
    return dict(input_ids=ids, segment_ids=segments, input_mask=mask,
                masked_lm_positions=positions.astype(np.int32),
                masked_lm_ids=rng.integers(5, VOCAB, size=(batch, preds)).astype(np.int32),
                masked_lm_weights=np.ones((batch, preds), np.float32),
                next_sentence_labels=rng.integers(0, 2, size=(batch,)).astype(np.int32))


def train_loss(cfg):
    net = bert.BertForPreTraining(cfg)

    def loss(params, batch, rng):
        out = net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                        batch["masked_lm_positions"], deterministic=False, rngs={"dropout": rng}, heads_only=True)
        value, _ = bert.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                          batch["masked_lm_weights"], batch["next_sentence_labels"])
        return value

    return net, loss


def scatter_result_shapes(hlo_text: str) -> list[tuple[int, ...]]:
    """Result shapes of every scatter in a StableHLO module's text."""
    # '%r = "stablehlo.scatter"(operands) <{attributes}> ({ update region }) : (types) -> tensor<AxBxf32>'
    found = re.findall(r'"stablehlo\.scatter".*?\}\)\s*:\s*\([^)]*\)\s*->\s*tensor<([0-9x]+)x[a-z]+[0-9]*>',
                       hlo_text, flags=re.S)
    assert len(found) == hlo_text.count('"stablehlo.scatter"'), "a scatter's result type was not read"
    return [tuple(int(d) for d in shape.split("x")) for shape in found]


def lowered_grad_text(cfg) -> str:
    net, loss = train_loss(cfg)
    batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
    params = nn.unbox(jax.eval_shape(lambda: net.init(jax.random.key(0), **bert.dummy_batch(1, 16, 3)))["params"])
    return jax.jit(jax.grad(loss)).lower(params, batch, jax.random.key(1)).as_text()


def test_scatter_detection_finds_the_gather_gradient_of_a_table():
    """The control for the tests below: a row lookup by index shows up as a scatter into its table."""
    table = jnp.zeros((MAX_POS, HIDDEN))
    text = jax.jit(jax.grad(lambda t: jnp.sum(jnp.take(t, jnp.arange(16)[None, :].repeat(4, 0), axis=0) ** 2))) \
        .lower(table).as_text()
    assert (MAX_POS, HIDDEN) in scatter_result_shapes(text)


@pytest.mark.parametrize("word_embedding", ["gather", "one_hot"])
def test_train_step_has_no_scatter_into_position_or_segment_tables(word_embedding):
    shapes = scatter_result_shapes(lowered_grad_text(tiny_config(word_embedding=word_embedding)))
    assert (MAX_POS, HIDDEN) not in shapes
    assert (2, HIDDEN) not in shapes
    if word_embedding == "one_hot":
        assert (VOCAB, HIDDEN) not in shapes  # the word table's gradient is a matmul too
    else:
        assert (VOCAB, HIDDEN) in shapes  # the gather's gradient: the one scatter left


def test_embedding_forms_give_the_same_outputs_and_gradients():
    """Sliced positions, selected segments and the one-hot word lookup equal nn.Embed gathers."""
    batch = {k: jnp.asarray(v) for k, v in make_batch(3).items()}
    cfg = tiny_config(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    emb = layers.Embeddings(cfg)
    params = nn.unbox(emb.init(jax.random.key(0), batch["input_ids"], batch["segment_ids"], True))["params"]

    def reference(p):  # what nn.Embed's lookups compute
        x = p["word_embeddings"]["embedding"][batch["input_ids"]]
        x = x + p["position_embeddings"]["embedding"][jnp.arange(16)][None]
        x = x + p["token_type_embeddings"]["embedding"][batch["segment_ids"]]
        return nn.LayerNorm(epsilon=cfg.layer_norm_eps, use_fast_variance=False).apply(
            {"params": p["layer_norm"]}, x)

    def ours(p, word_embedding):
        return layers.Embeddings(tiny_config(hidden_dropout_rate=0.0, word_embedding=word_embedding)).apply(
            {"params": p}, batch["input_ids"], batch["segment_ids"], True)

    weights = jax.random.normal(jax.random.key(5), (4, 16, HIDDEN))
    ref_out, ref_grad = jax.value_and_grad(lambda p: jnp.sum(reference(p) * weights))(params)
    for form in ("gather", "one_hot"):
        out, grads = jax.jit(jax.value_and_grad(lambda p, form=form: jnp.sum(ours(p, form) * weights)))(params)
        np.testing.assert_allclose(float(out), float(ref_out), rtol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grad)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("queries", [16, 5])
def test_padding_as_lengths_equals_the_mask_outputs_and_gradients(queries):
    """The sequence-length form of padding (cuDNN's) against the boolean mask, through XLA."""
    rng = np.random.default_rng(0)
    lengths = np.array([16, 9, 1, 12], np.int32)
    q = jnp.asarray(rng.normal(size=(4, queries, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(4, 16, 4, 8)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(np.arange(16)[None, :] < lengths[:, None])[:, None, None, :]
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def run(form):
        def f(q, k, v):
            out = attention.fused_attention(q, k, v, mask=mask, implementation="xla",
                                        kv_lengths=jnp.asarray(lengths) if form == "lengths" else None)
            return jnp.sum(out * weights), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, with_lengths), grads_lengths = run("lengths")
    (_, with_mask), grads_mask = run("mask")
    np.testing.assert_allclose(np.asarray(with_lengths), np.asarray(with_mask), atol=1e-6)
    for a, b in zip(grads_lengths, grads_mask):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    # Padded keys matter to neither: changing them changes nothing.
    k2 = k.at[1, 9:].set(100.0)
    moved = attention.fused_attention(q, k2, v, mask=mask, kv_lengths=jnp.asarray(lengths), implementation="xla")
    np.testing.assert_allclose(np.asarray(moved), np.asarray(with_lengths), atol=1e-6)


def cudnn_stand_in(monkeypatch) -> list:
    """jax.nn.dot_product_attention's XLA form standing in for cuDNN, refusing an odd number of query rows
    as JAX's cuDNN call does when differentiated; returns the query row counts it is called with."""
    real, calls = attention.dot_product_attention, []

    def stand_in(q, k, v, *, implementation, **kwargs):
        if implementation == "cudnn":
            assert q.shape[1] % 2 == 0, f"cuDNN would refuse {q.shape[1]} query rows"
        calls.append(q.shape[1])
        return real(q, k, v, implementation="xla", **kwargs)

    monkeypatch.setattr(attention, "dot_product_attention", stand_in)
    return calls


def test_cudnn_output_rows_are_even_and_change_nothing(monkeypatch):
    """The last layer attends from its output rows only ([CLS] and the masked positions, 5 here): under
    cuDNN an odd count gets one query row more, which leaves the loss and every gradient as XLA's."""
    batch = make_batch(preds=4, lengths=(16, 9, 12, 6))
    fields = dict(attention_dropout_rate=0.0, hidden_dropout_rate=0.0)
    net, loss = train_loss(tiny_config(**fields))
    params = net.init(jax.random.key(0), batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      batch["masked_lm_positions"])["params"]
    expected, expected_grads = jax.jit(jax.value_and_grad(loss))(params, batch, jax.random.key(1))
    calls = cudnn_stand_in(monkeypatch)
    _, cudnn_loss = train_loss(tiny_config(attention_impl="cudnn", **fields))
    value, grads = jax.jit(jax.value_and_grad(cudnn_loss))(params, batch, jax.random.key(1))
    assert sorted(set(calls)) == [6, 16], calls  # the full rows, then the 5 output rows and one more
    np.testing.assert_allclose(float(value), float(expected), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected_grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_cudnn_odd_query_rows_with_a_mask_per_query(monkeypatch):
    """Packed rows give each query its own mask: the extra row repeats the last one's, and the outputs and
    gradients of the real rows are the mask form's through XLA."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, 5, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, 16, 4, 8)), jnp.float32) for _ in range(2))
    segments = np.repeat(np.array([[1, 2, 2, 3]]), 4, axis=1)  # [1, 16]: three packed sequences
    rows = np.array([0, 3, 6, 9, 15])
    mask = jnp.asarray(segments[:, rows, None] == segments[:, None, :])[None].repeat(2, 0)  # [2, 1, 5, 16]
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def total(implementation):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(weights * attention.fused_attention(
            q, k, v, mask=mask, kv_lengths=None, implementation=implementation)), argnums=(0, 1, 2)))(q, k, v)

    expected, expected_grads = total("xla")
    calls = cudnn_stand_in(monkeypatch)
    value, grads = total("cudnn")
    assert calls == [6]
    np.testing.assert_allclose(float(value), float(expected), rtol=1e-6)
    for a, b in zip(grads, expected_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_platform_defaults():
    fields = dict(dtype="auto", attention_impl="auto", word_embedding="auto", attention_dropout_rate=0.1)
    cpu = resolve_platform(fields, "cpu")
    assert (cpu["dtype"], cpu["attention_impl"], cpu["word_embedding"], cpu["attention_dropout_rate"]) == \
        ("float32", "xla", "gather", 0.1)
    gpu = resolve_platform(fields, "gpu")
    assert (gpu["dtype"], gpu["attention_impl"], gpu["word_embedding"], gpu["attention_dropout_rate"]) == \
        ("bfloat16", "cudnn", "gather", 0.0)
    tpu = resolve_platform(fields, "tpu")
    assert (tpu["dtype"], tpu["attention_impl"], tpu["word_embedding"], tpu["attention_dropout_rate"]) == \
        ("bfloat16", "xla", "one_hot", 0.1)
    # Float32 compute on a GPU: cuDNN's flash attention needs 16 bits, so auto keeps XLA and its dropout.
    gpu32 = resolve_platform(dict(fields, dtype="float32"), "gpu")
    assert (gpu32["attention_impl"], gpu32["attention_dropout_rate"]) == ("xla", 0.1)
    # An explicit choice is kept as it is.
    assert resolve_platform(dict(fields, attention_impl="xla"), "gpu")["attention_dropout_rate"] == 0.1
    with pytest.raises(ValueError, match="'auto'"):
        BertConfig(dtype="auto")


@pytest.mark.parametrize("size", ["base", "large"])
def test_size_configs_choose_per_platform(size):
    config = step_speed.load_config(size)
    cpu = BertConfig.from_dict(config.model, platform="cpu")
    gpu = BertConfig.from_dict(config.model, platform="gpu")
    tpu = BertConfig.from_dict(config.model, platform="tpu")
    assert (cpu.dtype, cpu.attention_impl) == ("float32", "xla")
    assert (gpu.dtype, gpu.attention_impl, gpu.word_embedding) == ("bfloat16", "cudnn", "gather")
    assert (tpu.dtype, tpu.attention_impl, tpu.word_embedding) == ("bfloat16", "xla", "one_hot")


def step_temp_bytes(policy: str) -> int:
    cfg = tiny_config(num_layers=4, intermediate_size=512, max_position_embeddings=64, remat_policy=policy,
                      scan_layers=True, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    net, loss = train_loss(cfg)
    batch = {k: jnp.asarray(v) for k, v in make_batch(batch=32, seq=32, lengths=(32,) * 32).items()}
    params = nn.unbox(net.init(jax.random.key(0), **bert.dummy_batch(1, 32, 3)))["params"]
    compiled = jax.jit(jax.grad(loss)).lower(params, batch, jax.random.key(1)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_named_remat_policies_keep_what_their_names_say():
    """Under scan, the memory of the step's backward pass follows what each policy saves: the block
    outputs alone < the attention tensors (the F-wide activation recomputed) < every named tensor < all."""
    block, attention, named, everything = (
        step_temp_bytes(p) for p in ("save_block_out", "save_attention", "save_named", "none"))
    assert block < attention < named < everything, (block, attention, named, everything)


def test_prefetch_keeps_order_and_raises_stream_errors():
    mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
    data_sharding = sharding.batch_sharding(mesh, sharding.logical_rules([("batch", ("data", "fsdp"))]))
    host = [{"x": np.full((8, 2), i, np.int32)} for i in range(5)]
    with sharding.prefetch_to_devices(iter(host), data_sharding, size=2) as batches:
        got = list(batches)
    assert [int(b["x"][0, 0]) for b in got] == [0, 1, 2, 3, 4]
    assert all(b["x"].sharding == data_sharding for b in got)

    def broken():
        yield {"x": np.zeros((8, 2), np.int32)}
        raise ValueError("no files match data.input_pattern")

    with sharding.prefetch_to_devices(broken(), data_sharding, size=1) as batches:
        first = next(batches)
        assert first["x"].sharding == data_sharding
        with pytest.raises(ValueError, match="no files match"):
            next(batches)


def test_kernel_breakdown_of_a_gpu_trace():
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "tid": 7, "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "dur": 3000},
        {"ph": "X", "pid": 1, "tid": 7, "name": "nvjet_hsh_128x256", "dur": 1000},
        {"ph": "X", "pid": 1, "tid": 7, "name": "cudnn_generated_fort_native_sdpa_sm90", "dur": 500},
        {"ph": "X", "pid": 1, "tid": 7, "name": "loop_multiply_fusion_3", "dur": 2000},
        {"ph": "X", "pid": 1, "tid": 7, "name": "input_reduce_fusion_1", "dur": 700},
        {"ph": "X", "pid": 1, "tid": 7, "name": "scatter_add_fusion", "dur": 400},
        {"ph": "X", "pid": 1, "tid": 7, "name": "MemcpyD2D", "dur": 100},
        {"ph": "X", "pid": 1, "tid": 7, "name": "ncclDevKernel_AllReduce_Sum_bf16", "dur": 50},
        {"ph": "X", "pid": 1, "tid": 9, "name": "fusion.3", "dur": 99999},  # a coarser line: not counted
        {"ph": "X", "pid": 2, "tid": 1, "name": "gemm_on_host", "dur": 99999},  # the host: not counted
    ]}
    seconds = step_profile.device_kernel_seconds(trace)
    expected = {"matmul": 4e-3, "attention": 0.5e-3, "element-wise": 2e-3, "reduction": 0.7e-3,
                "scatter/gather": 0.4e-3, "copy": 0.1e-3, "collective": 0.05e-3}
    assert seconds.keys() == expected.keys()
    for k, v in expected.items():
        assert seconds[k] == pytest.approx(v), k


def test_gpu_benchmark_runners_take_turns_hf_first():
    """On a GPU the benchmark's runners run one at a time, HF's first, each releasing its cached memory
    before the next starts; each figure and peak stays with its own runner. On the CPU they alternate in
    blocks."""
    events = []

    class Runner:
        def __init__(self, name):
            self.name, self.count = name, 0

        def step(self):
            events.append(("step", self.name))
            self.count += 1
            return {"bertjax": 0.5, "HF eager": 1.0, "HF compiled": 0.25}[self.name]

        def loss(self):
            return 1.0

        def peak_bytes(self):
            return len(self.name)

        def reset_peak(self):
            events.append(("reset", self.name))

        def release(self):
            events.append(("release", self.name))

    runners = [Runner("bertjax"), Runner("HF eager"), Runner("HF compiled")]
    timings, peaks = step_speed.measure_runners(runners, warmup=1, steps=2, one_at_a_time=True)
    assert [t["seconds"] for t in timings] == [1.0, 2.0, 0.5] and peaks == [7, 8, 11]
    turns = [("reset", "HF eager"), *[("step", "HF eager")] * 3, ("release", "HF eager"),
             ("reset", "HF compiled"), *[("step", "HF compiled")] * 3, ("release", "HF compiled"),
             ("reset", "bertjax"), *[("step", "bertjax")] * 3, ("release", "bertjax")]
    assert events == turns
    events.clear()
    timings, _ = step_speed.measure_runners(runners, warmup=1, steps=3, one_at_a_time=False)
    # On the CPU: blocks of 2 and 1 steps, the second round in reverse order; a block that follows another
    # runner's starts with one untimed step (b, e, c: bertjax, HF eager, HF compiled).
    b, e, c = (("step", r.name) for r in runners)
    assert events == [b, e, c, b, b, b, e, e, e, c, c, c, c, e, e, b, b]
    assert [t["seconds"] for t in timings] == [1.5, 3.0, 0.75]


# ----------------------------------------------------------------------------------------------------
# The second round's levers: each computes the default's network, checked here against it
# ----------------------------------------------------------------------------------------------------


def packed_batch(seq=32, preds=6, slots=3, seed=0):
    from bertjax.data import synthetic

    return {k: jnp.asarray(v) for k, v in synthetic.synthetic_batch(
        seed, batch_size=3, max_seq_length=seq, max_predictions_per_seq=preds, vocab_size=VOCAB, packed=True,
        max_sequences_per_row=slots).items()}


def loss_and_grads(cfg, params, batch, deterministic=False):
    """The pretraining loss and its gradients, heads_only (the last layer attends from its output rows)."""
    net = bert.BertForPreTraining(cfg)
    packed = {key: batch[key] for key in ("sequence_ids", "position_ids", "sentence_positions") if key in batch}

    def loss(p):
        out = net.apply({"params": p}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                        batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": jax.random.key(1)},
                        heads_only=True, **packed)
        return bert.pretraining_loss(out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"],
                                     batch["masked_lm_weights"], batch["next_sentence_labels"],
                                     sentence_weights=batch.get("sentence_weights"))[0]

    return jax.jit(jax.value_and_grad(loss))(params)


def assert_same(got, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=rtol)
    assert jax.tree_util.tree_structure(got[1]) == jax.tree_util.tree_structure(expected[1])
    for a, b in zip(jax.tree_util.tree_leaves(got[1]), jax.tree_util.tree_leaves(expected[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.mark.parametrize("family", [dict(), dict(use_bias=False, norm_placement="pre", position_embedding="rotary")])
def test_fused_qkv_is_the_three_projections(family):
    """model.fused_qkv: one [H, 3, N, D] matmul (k and v by one where the last layer's queries are its output
    rows) gives the three projections' loss and gradients, dropout included, from the same params by name."""
    batch = make_batch()
    cfg = tiny_config(**family)
    params = bert.BertForPreTraining(cfg).init(jax.random.key(0), *(batch[k] for k in (
        "input_ids", "segment_ids", "input_mask", "masked_lm_positions")))["params"]
    fused = bert.BertForPreTraining(tiny_config(fused_qkv=True, **family)).init(
        jax.random.key(0), *(batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")))
    assert jax.tree_util.tree_structure(fused["params"]) == jax.tree_util.tree_structure(params)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    assert_same(loss_and_grads(tiny_config(fused_qkv=True, **family), params, batch),
                loss_and_grads(cfg, params, batch))


def offsets_stand_in(monkeypatch) -> list:
    """XLA standing in for cuDNN's packed call: the mask is rebuilt from the lengths and starts alone (a token
    belongs to slot m when starts[m] <= i < starts[m] + lengths[m]), so the test checks that they describe the
    rows' sequences. Returns the query shapes it was called with."""
    calls = []

    def stand_in(q, k, v, lengths, starts):
        calls.append(q.shape)
        index = jnp.arange(q.shape[1])[None, None, :]  # [1, 1, S]
        inside = (index >= starts[:, :-1, None]) & (index < starts[:, :-1, None] + lengths[:, :, None]) & (
            lengths[:, :, None] > 0)  # [B, K, S]
        mask = jnp.einsum("bks,bkt->bst", inside.astype(jnp.int32), inside.astype(jnp.int32)) > 0  # [B, S, S]
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")

    monkeypatch.setattr(attention, "cudnn_packed_attention", stand_in)
    return calls


@pytest.mark.parametrize("scan", [False, True])
def test_cudnn_packed_offsets_are_the_block_diagonal_mask(monkeypatch, scan):
    """Packed rows under cuDNN: the global layers attend by sequence offsets (cuDNN skips the tiles that pair
    two sequences), the local ones by the banded mask (a lax.cond in a scanned alternating stack); the loss
    and gradients equal XLA's block-diagonal mask. The fused call itself runs only on a GPU."""
    batch = packed_batch()
    fields = dict(attention_dropout_rate=0.0, hidden_dropout_rate=0.0, norm_placement="pre", use_bias=False,
                  position_embedding="rotary", local_attention_window=8, global_attention_every=2,
                  num_layers=3, scan_layers=scan)
    cfg = tiny_config(**fields)
    inputs = [batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")]
    packed = dict(sequence_ids=batch["sequence_ids"], position_ids=batch["position_ids"],
                  sentence_positions=batch["sentence_positions"])
    params = bert.BertForPreTraining(cfg).init(jax.random.key(0), *inputs, **packed)["params"]
    expected = loss_and_grads(cfg, params, batch)
    calls = offsets_stand_in(monkeypatch)
    cudnn_stand_in(monkeypatch)
    got = loss_and_grads(tiny_config(attention_impl="cudnn", **fields), params, batch)
    assert calls and all(shape[1] == 32 for shape in calls), calls  # every row's tokens, the global layers'
    assert_same(got, expected)


def test_packed_offsets():
    segments = jnp.asarray([[1, 1, 1, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    lengths, starts = attention.packed_offsets(segments, 3)
    np.testing.assert_array_equal(lengths, [[3, 2, -1], [8, -1, -1]])
    np.testing.assert_array_equal(starts, [[0, 3, -1, -1], [0, -1, -1, -1]])


def test_auto_attention_turns_blockwise_by_row_length():
    """attention_impl="auto" on a CPU without attention dropout: XLA's dense form below
    BLOCKWISE_FROM["cpu"] tokens, blockwise from there (the console line says which); with dropout (BERT's
    0.1) XLA at every length; nothing changes on a GPU. The blockwise rows give XLA's loss."""
    from bertjax.models.config import BLOCKWISE_FROM, describe_attention

    fields = dict(attention_impl="auto", attention_dropout_rate=0.0)
    cpu = BertConfig(**resolve_platform(dict(fields, dtype="float32"), "cpu"))
    assert (cpu.attention_impl, cpu.blockwise_from) == ("xla", BLOCKWISE_FROM["cpu"])
    assert describe_attention(cpu, 8192).startswith("blockwise attention at rows of 8192")
    assert describe_attention(cpu, 256).startswith("xla attention at rows of 256")
    assert resolve_platform(dict(fields, attention_dropout_rate=0.1), "cpu").get("blockwise_from", 0) == 0
    assert resolve_platform(dict(fields, dtype="bfloat16"), "gpu").get("blockwise_from", 0) == 0
    with pytest.raises(ValueError, match="blockwise_from"):
        tiny_config(blockwise_from=16)  # attention dropout 0.1
    # Rows of 32 tokens with blockwise_from=32 (tiles of 8) give XLA's loss and gradients.
    batch = packed_batch()
    quiet = dict(attention_dropout_rate=0.0, hidden_dropout_rate=0.0, attention_block_size=8)
    cfg = tiny_config(**quiet)
    inputs = [batch[k] for k in ("input_ids", "segment_ids", "input_mask", "masked_lm_positions")]
    params = bert.BertForPreTraining(cfg).init(jax.random.key(0), *inputs, sequence_ids=batch["sequence_ids"],
                                                position_ids=batch["position_ids"],
                                                sentence_positions=batch["sentence_positions"])["params"]
    assert_same(loss_and_grads(tiny_config(blockwise_from=32, **quiet), params, batch),
                loss_and_grads(cfg, params, batch))
