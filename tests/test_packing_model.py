"""Packed rows in the model: each sequence of a row computes what it computes alone.

The reference is the unpacked forward of the same sequences, one per row (bertjax.data.packing's
unpack_batch turns a packed batch back into them): hidden states, masked-LM logits and next-sentence
logits within 1e-5 in float32, and the gradient of the packed batch's loss equal to the gradient of
the same examples' loss unpacked, for BERT and every family (scanned too).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_program  # tests/ is on sys.path under pytest

from bertjax.data import packing, synthetic
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig

ATOL = 1e-5
SEQ, PREDICTIONS, SEQUENCES, VOCAB = 32, 8, 4, 64

BASE = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=40, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
FAMILIES = {
    "bert": {},
    "roberta": dict(position_offset=1, type_vocab_size=1, layer_norm_eps=1e-5),
    "albert": dict(num_layers=4, embedding_size=16, num_hidden_groups=2, activation="gelu_tanh"),
    # A window narrower than the sequences, so that the local layers differ from the global ones.
    "modernbert": dict(num_layers=3, position_embedding="rotary", activation="geglu", norm_placement="pre",
                       use_bias=False, type_vocab_size=0, local_attention_window=4, global_attention_every=2,
                       rotary_theta=100.0, global_rotary_theta=1000.0, pooler="gelu_norm", layer_norm_eps=1e-5),
    # Trigram inputs: a sequence's neighbours past its ends are what a row of its own gives (zeros, [PAD]).
    "mobilebert": dict(block="mobilebert", embedding_size=16, trigram_input=True, intra_bottleneck_size=16,
                       key_query_shared_bottleneck=True, num_feedforward_networks=2, norm="no_norm",
                       activation="relu", pooler="first"),
}
# Scanned: ModernBERT (layer 0 unrolled, local/global selected per step); ALBERT's scanned groups run the
# same blocks as unrolled (tests/test_families.py), so its unrolled case covers its packing.
CASES = [(family, False) for family in FAMILIES] + [("modernbert", True)]


def _config(family: str, scan: bool) -> BertConfig:
    return BertConfig(**{**BASE, **FAMILIES[family], "scan_layers": scan})


def _batches(cfg: BertConfig, seed: int = 0):
    """A packed batch (2 rows) and the same sequences unpacked, one per row."""
    packed = synthetic.synthetic_batch(seed, batch_size=2, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                                       vocab_size=VOCAB, packed=True, max_sequences_per_row=SEQUENCES, mask_rate=0.2)
    if cfg.type_vocab_size < 2:  # one segment row (RoBERTa) or none (ModernBERT)
        packed["segment_ids"] = np.zeros_like(packed["segment_ids"])
    examples = packing.unpack_batch(packed, pad_id=0)
    unpacked = {key: np.stack([ex[key] for ex in examples]) for key in examples[0]}
    assert len(examples) > 2 and int(packed["sentence_weights"].sum()) == len(examples)  # rows really share
    return packed, unpacked


def _packed_inputs(batch: dict) -> dict:
    return dict(sequence_ids=batch["sequence_ids"], position_ids=batch["position_ids"],
                sentence_positions=batch["sentence_positions"])


def _params(cfg):
    net = bert_model.BertForPreTraining(cfg)
    return net, net.init(jax.random.PRNGKey(0), **bert_model.dummy_batch(1, SEQ, PREDICTIONS))["params"]


def _forward(net, params, batch, heads_only: bool, packed: bool):
    extra = _packed_inputs(batch) if packed else {}
    return net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                     batch["masked_lm_positions"], deterministic=True, heads_only=heads_only, **extra)


@pytest.mark.parametrize("family, scan", CASES)
def test_each_packed_sequence_computes_what_it_computes_alone(family, scan):
    cfg = _config(family, scan)
    net, params = _params(cfg)
    packed, unpacked = _batches(cfg)
    full = jax.jit(lambda p, b: _forward(net, p, b, False, True))(params, packed)
    alone = jax.jit(lambda p, b: _forward(net, p, b, False, False))(params, unpacked)

    # Hidden states: sequence k of a row at its span, against the example alone at 0 .. n-1.
    n_seen = 0
    for row in range(len(packed["input_ids"])):
        for slot in np.flatnonzero(packed["sentence_weights"][row]):
            start = int(packed["sentence_positions"][row, slot])
            n = int(np.sum(packed["sequence_ids"][row] == slot + 1))
            np.testing.assert_allclose(np.asarray(full["sequence_output"][row, start:start + n]),
                                       np.asarray(alone["sequence_output"][n_seen, :n]), rtol=0, atol=ATOL)
            np.testing.assert_allclose(np.asarray(full["nsp_logits"][row, slot]),
                                       np.asarray(alone["nsp_logits"][n_seen]), rtol=0, atol=ATOL)
            n_seen += 1
    assert n_seen == len(unpacked["input_ids"])

    # Masked-LM logits at the real predictions, in order, from the full and the heads-only paths.
    rows_only = jax.jit(lambda p, b: _forward(net, p, b, True, True))(params, packed)
    want = np.asarray(alone["mlm_logits"])[unpacked["masked_lm_weights"] > 0]
    for out in (full, rows_only):
        got = np.asarray(out["mlm_logits"])[packed["masked_lm_weights"] > 0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.asarray(rows_only["nsp_logits"]), np.asarray(full["nsp_logits"]), rtol=0, atol=ATOL)


def _loss(net, params, batch, packed: bool):
    out = _forward(net, params, batch, True, packed)
    loss, metrics = bert_model.pretraining_loss(
        out["mlm_logits"], out["nsp_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"],
        batch["next_sentence_labels"], "nsp", batch["sentence_weights"] if packed else None)
    return loss, metrics


@pytest.mark.parametrize("family, scan", [("bert", False), ("modernbert", True)])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_sequences_unpacked(family, scan):
    """Masked LM: the mean over the batch's predictions; NSP: the mean over its sequences. Both are the
    unpacked batch's figures, so the gradients agree too (and the metric sums: counts of sequences)."""
    cfg = _config(family, scan)
    net, params = _params(cfg)
    packed, unpacked = _batches(cfg, seed=5)
    grad = lambda is_packed: jax.jit(jax.value_and_grad(  # noqa: E731
        lambda p, b: _loss(net, p, b, is_packed), has_aux=True))
    (loss_p, metrics_p), grads_p = grad(True)(params, packed)
    (loss_u, metrics_u), grads_u = grad(False)(params, unpacked)
    np.testing.assert_allclose(float(loss_p), float(loss_u), rtol=1e-6)
    for key in ("mlm_count", "nsp_count", "mlm_correct", "nsp_correct"):
        assert float(metrics_p[key]) == float(metrics_u[key]), key
    flat_p = dict(jax.tree_util.tree_flatten_with_path(grads_p)[0])
    for path, g in jax.tree_util.tree_flatten_with_path(grads_u)[0]:
        np.testing.assert_allclose(np.asarray(flat_p[path]), np.asarray(g), rtol=0, atol=ATOL,
                                   err_msg=jax.tree_util.keystr(path))


def test_sequences_of_a_row_do_not_see_each_other():
    """Changing one sequence of a row changes nothing in the others (no cross-contamination)."""
    cfg = _config("bert", False)
    net, params = _params(cfg)
    packed, _ = _batches(cfg)
    changed = {k: v.copy() for k, v in packed.items()}
    row = int(np.argmax(packed["sentence_weights"].sum(1) > 1))  # a row of several sequences
    first = packed["sequence_ids"][row] == 1
    changed["input_ids"][row, first] = (packed["input_ids"][row, first] + 7) % VOCAB
    a = _forward(net, params, packed, False, True)["sequence_output"]
    b = _forward(net, params, changed, False, True)["sequence_output"]
    others = (packed["sequence_ids"][row] > 1)
    assert others.any()
    np.testing.assert_allclose(np.asarray(a[row][others]), np.asarray(b[row][others]), rtol=0, atol=1e-6)
    assert not np.allclose(np.asarray(a[row][first]), np.asarray(b[row][first]))


def test_packed_inputs_come_together():
    cfg = _config("bert", False)
    net, params = _params(cfg)
    packed, _ = _batches(cfg)
    with pytest.raises(ValueError, match="sequence_ids and cls_positions"):
        net.apply({"params": params}, packed["input_ids"], packed["segment_ids"], packed["input_mask"],
                  packed["masked_lm_positions"], sequence_ids=packed["sequence_ids"])


def test_learned_positions_restart_in_each_sequence():
    """The position rows of a packed sequence are those of 0 .. n-1 (offset by position_offset): moving
    a sequence along the row leaves its embeddings as they were."""
    cfg = dataclasses.replace(_config("roberta", False))
    net, params = _params(cfg)
    packed, unpacked = _batches(cfg)
    embed = bert_model.BertModel(cfg)
    out_p = embed.apply({"params": params["bert"]}, packed["input_ids"], packed["segment_ids"], packed["input_mask"],
                        sequence_ids=packed["sequence_ids"], position_ids=packed["position_ids"],
                        cls_positions=packed["sentence_positions"], output_hidden_states=True)
    out_u = embed.apply({"params": params["bert"]}, unpacked["input_ids"], unpacked["segment_ids"],
                        unpacked["input_mask"], output_hidden_states=True)
    row = int(np.argmax(packed["sentence_weights"].sum(1) > 1))  # a row of several sequences
    slot = 1  # its second sequence starts after the first
    start = int(packed["sentence_positions"][row, slot])
    n = int(np.sum(packed["sequence_ids"][row] == slot + 1))
    example = int(packed["sentence_weights"][:row].sum()) + slot  # the same sequence unpacked
    assert start > 0
    np.testing.assert_allclose(np.asarray(out_p["hidden_states"][0][row, start:start + n]),
                               np.asarray(out_u["hidden_states"][0][example, :n]), rtol=0, atol=1e-6)
    assert jnp.asarray(out_p["pooled_output"]).shape == (2, SEQUENCES, cfg.hidden_size)


@pytest.mark.mesh
def test_the_packed_train_step_on_a_mesh_gives_the_losses_of_one_device():
    """The training step (pretraining_step.loss_fn through Setup) on packed synthetic batches: data and fsdp
    parallel over 4 devices give the one-device losses. (Gradient accumulation averages its
    microbatches' means, packed or not: rows of unequal prediction counts weigh alike.)"""
    from test_train import small_config
    from bertjax.training import pretraining_step, sharding

    config = small_config()
    config.data.update(packing=True, max_sequences_per_row=SEQUENCES)

    def losses(mesh_shape, steps=3):
        mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)), jax.devices()[:int(np.prod(mesh_shape))])
        rules = sharding.logical_rules(config.logical_axis_rules)
        init_key, dropout_key = jax.random.split(jax.random.key(0))
        setup = pretraining_step.setup(config, mesh, rules, init_key)
        data_sharding = sharding.batch_sharding(mesh, rules)
        step_fn, _ = setup.compile_steps(data_sharding, 1)
        state, out = setup.init(init_key), []
        with jax.set_mesh(mesh):
            for step in range(steps):
                host = synthetic.synthetic_batch(step, batch_size=config.train.batch_size, max_seq_length=32,
                                                 max_predictions_per_seq=5, vocab_size=config.model.vocab_size,
                                                 packed=True, max_sequences_per_row=SEQUENCES)
                assert set(host) == set(pretraining_step.batch_keys(True))
                state, sums = step_fn(state, sharding.global_batch(host, data_sharding), dropout_key)
                out.append((float(sums["loss_sum"]), float(sums["nsp_count"])))
        return np.array(out)

    one = losses((1, 1, 1))
    assert np.all(one[:, 1] > config.train.batch_size)  # more sequences than rows: the rows are packed
    np.testing.assert_allclose(losses((2, 2, 1)), one, rtol=2e-5)


def test_padded_synthetic_rows_are_the_unpacked_rows_packing_is_timed_against():
    """synthetic padded=True: one example per row, right-padded, its predictions inside it, as many as
    packing counts for that length; packed=True holds the same length mix with little padding."""
    batch = synthetic.synthetic_batch(0, batch_size=64, max_seq_length=128, max_predictions_per_seq=20,
                                      vocab_size=VOCAB, padded=True)
    lengths = batch["input_mask"].sum(1)
    assert np.all(batch["input_mask"] == (np.arange(128)[None] < lengths[:, None]))  # right-padded
    assert 0.6 < lengths.mean() / 128 < 0.9  # the demo corpus's share of real positions at 128 (76%)
    counts = batch["masked_lm_weights"].sum(1)
    np.testing.assert_array_equal(counts, packing.num_predictions(lengths, 0.15, 20))
    inside = (batch["masked_lm_positions"] < lengths[:, None]) & (batch["masked_lm_positions"] > 0)
    assert np.all(inside[batch["masked_lm_weights"] > 0])
    packed = synthetic.synthetic_batch(0, batch_size=16, max_seq_length=128, max_predictions_per_seq=20,
                                       vocab_size=VOCAB, packed=True)
    assert packed["input_mask"].mean() > 0.95


@pytest.mark.slow
def test_the_benchmark_times_packed_rows_against_padded_ones():
    # One device, as a user runs it, with the tests' quick compiles (conftest's environment).
    result = run_program("bertjax.benchmark", "--packing", "--sizes=tiny", "--seq_len=64", "--batch_size=4",
                         "--steps=1", "--warmup=1", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[4]: line.split() for line in result.stdout.splitlines() if line.startswith("tiny 4 x 64")}
    assert set(rows) == {"padded", "packed"}, result.stdout
    assert float(rows["padded"][5].rstrip("%")) < float(rows["packed"][5].rstrip("%"))  # real share rises
    assert float(rows["packed"][-1].rstrip("x")) > 0  # the ratio is printed
