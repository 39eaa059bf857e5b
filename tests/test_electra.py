"""ELECTRA (bertjax/models/electra.py, bertjax/interop/hf_electra.py) against transformers: the
discriminator's logits equal ElectraForPreTraining's and the generator's ElectraForMaskedLM's within 1e-5,
exported from bertjax and imported from transformers; the combined loss equals generator MLM + 50 x
discriminator BCE computed with those classes on the same masks and the step's own replacements; an
8-device mesh gives the one-device losses; a resumed run equals the uninterrupted one; a generator
wider than the discriminator is one line, exit 2."""

import shutil

import flax.linen as nn
import jax
from flax import traverse_util
import numpy as np
import pytest
import torch
import transformers
from conftest import copy_of, run_program, tiny_config, train_losses

from bertjax.data import synthetic
from bertjax import init_from
from bertjax.interop import hf, hf_electra
from bertjax.models import electra
from bertjax.models.config import BertConfig
from bertjax.runs import phases, pretraining, start
from bertjax.training import checkpoint, pretraining_step, sharding

ATOL = 1e-5
SEQ, MASK_ID = 12, 4
# E = 16 below both widths: the discriminator (32) and the generator (8) each project the shared tables.
DISC = BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                  max_position_embeddings=24, embedding_size=16, pooler="gelu", hidden_dropout_rate=0.0,
                  attention_dropout_rate=0.0)
GEN = electra.generator_config(DISC, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16)
HF_SHARED = dict(vocab_size=97, embedding_size=16, max_position_embeddings=24, pad_token_id=0,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
HF_DISC = transformers.ElectraConfig(**HF_SHARED, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48)
HF_GEN = transformers.ElectraConfig(**HF_SHARED, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=16)


def random_params(seed: int = 0) -> dict:
    """ElectraForPreTraining params, every leaf noise (norm scales around 1)."""
    net = electra.ElectraForPreTraining(DISC, GEN)
    shapes = jax.eval_shape(net.init, jax.random.key(seed), **electra.dummy_batch(1, SEQ, 3))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(shapes["params"]))
    rng = np.random.default_rng(seed)
    noisy = [np.asarray(1.0 + 0.1 * rng.standard_normal(x.shape) if jax.tree_util.keystr(path).endswith("['scale']")
                        else 0.05 * rng.standard_normal(x.shape), np.float32) for path, x in leaves]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def inputs(seed: int = 0) -> dict:
    """Right-padded rows of lengths 12, 7 and 4, two segments, three masked positions each (fewer real
    ones in the short row: weight 0 pads the rest)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([SEQ, 7, 4])
    input_mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    original = np.where(input_mask == 1, rng.integers(5, 97, size=(3, SEQ)), 0).astype(np.int32)
    segment_ids = ((np.arange(SEQ)[None] >= 3) * input_mask).astype(np.int32)
    positions = np.array([[1, 5, 9], [2, 3, 6], [1, 2, 0]], np.int32)
    weights = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], np.float32)
    masked_ids = np.take_along_axis(original, positions, 1) * (weights > 0)
    input_ids = original.copy()
    for b, p in zip(*np.nonzero(weights)):
        input_ids[b, positions[b, p]] = MASK_ID
    return dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask, masked_lm_positions=positions,
                masked_lm_ids=masked_ids.astype(np.int32), masked_lm_weights=weights, original=original)


def bertjax_logits(params, method: str, batch) -> np.ndarray:
    net = electra.ElectraForPreTraining(DISC, GEN)
    return np.asarray(net.apply({"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                                method=getattr(electra.ElectraForPreTraining, method)))


def hf_logits(model, batch, input_ids=None) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(batch["input_ids"] if input_ids is None else input_ids).long(),
                     token_type_ids=torch.as_tensor(batch["segment_ids"]).long(),
                     attention_mask=torch.as_tensor(batch["input_mask"]).long()).logits.numpy()


def assert_real_positions_equal(ours, theirs, batch):
    real = batch["input_mask"].astype(bool)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours[real], theirs[real], rtol=0, atol=ATOL)


def test_the_pair_exports_to_electra_classes_with_equal_logits(tmp_path):
    params = random_params()
    disc_dir, gen_dir = hf_electra.save_pair(tmp_path, DISC, GEN, params)
    batch = inputs()
    for directory, cls, method in ((disc_dir, transformers.ElectraForPreTraining, "discriminator_logits"),
                                   (gen_dir, transformers.ElectraForMaskedLM, "generator_logits")):
        model, info = cls.from_pretrained(directory, output_loading_info=True, attn_implementation="eager")
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        assert_real_positions_equal(bertjax_logits(params, method, batch), hf_logits(model.eval(), batch), batch)


def randomized(model, seed: int):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if name.endswith("weight") and p.ndim == 1 else 0.05 * noise)
    return model.eval()


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """A random ElectraForPreTraining and ElectraForMaskedLM sharing their embeddings, saved as a pair."""
    torch.manual_seed(0)
    disc = randomized(transformers.ElectraForPreTraining(HF_DISC), 1)
    gen = randomized(transformers.ElectraForMaskedLM(HF_GEN), 2)
    with torch.no_grad():
        gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
        gen.generator_lm_head.weight = gen.electra.embeddings.word_embeddings.weight  # tied, as ELECTRA's
    root = tmp_path_factory.mktemp("electra-pair")
    disc.save_pretrained(root / "discriminator")
    gen.save_pretrained(root / "generator")
    return root, disc, gen


def test_a_transformers_pair_imports_with_equal_logits_and_exports_bit_for_bit(hf_pair):
    root, disc, gen = hf_pair
    disc_state, gen_state, disc_config, gen_config = hf_electra.read_pair(root)
    cfg = hf.config_from_hf(disc_config, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    assert cfg == DISC
    generator = electra.generator_config(cfg, **{k.removeprefix("generator_"): v
                                                 for k, v in hf_electra.generator_fields(gen_config).items()})
    params, missing = hf_electra.pair_from_hf(disc_state, gen_state, cfg, generator, random_params(seed=3))
    # ElectraForPreTraining has no pooler: bertjax's (the classification head's dense) starts fresh; the
    # generator's own pooler is never used.
    assert missing == ["bert/pooler/bias", "bert/pooler/kernel", "generator/pooler/bias", "generator/pooler/kernel"]
    batch = inputs(seed=1)
    assert_real_positions_equal(bertjax_logits(params, "discriminator_logits", batch), hf_logits(disc, batch), batch)
    assert_real_positions_equal(bertjax_logits(params, "generator_logits", batch), hf_logits(gen, batch), batch)
    for state, model in zip(hf_electra.pair_to_hf(params, cfg, generator), (disc, gen)):
        reference = {k: v.numpy() for k, v in model.state_dict().items()
                     if not k.endswith("_ids") and k != "generator_lm_head.weight"}
        assert sorted(state) == sorted(reference)
        for name, x in state.items():
            np.testing.assert_array_equal(x, reference[name], err_msg=name)


def test_the_loss_is_generator_mlm_plus_50_discriminator_bce_as_transformers_computes_them(hf_pair):
    root, disc, gen = hf_pair
    disc_state, gen_state, _, _ = hf_electra.read_pair(root)
    params, _ = hf_electra.pair_from_hf(disc_state, gen_state, DISC, GEN, random_params())
    net = electra.ElectraForPreTraining(DISC, GEN)
    batch = inputs(seed=2)
    original = batch.pop("original")
    key = jax.random.key(7)
    loss, sums = pretraining_step.loss_fn(params, batch, key, net=net, objective="none", discriminator_weight=50.0)
    # The replacements the step drew (the same rngs as loss_fn gives the model).
    out = pretraining_step.forward(net, params, batch, False, {"dropout": key, "sample": jax.random.fold_in(key, 1)})
    corrupted = np.asarray(out["corrupted_ids"])
    predicted = np.zeros_like(corrupted, bool)
    for b, p in zip(*np.nonzero(batch["masked_lm_weights"])):
        predicted[b, batch["masked_lm_positions"][b, p]] = True
    np.testing.assert_array_equal(corrupted[~predicted], batch["input_ids"][~predicted])
    labels = ((corrupted != original) & (batch["input_mask"] > 0)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out["disc_labels"]), labels)
    # transformers: the generator's masked-LM loss on the masked input, the discriminator's BCE on the
    # corrupted input over the real tokens (attention_mask).
    mlm_labels = np.where(predicted, original, -100)
    with torch.no_grad():
        common = dict(token_type_ids=torch.as_tensor(batch["segment_ids"]).long(),
                      attention_mask=torch.as_tensor(batch["input_mask"]).long())
        gen_loss = gen(input_ids=torch.as_tensor(batch["input_ids"]).long(), labels=torch.as_tensor(mlm_labels).long(),
                       **common).loss.item()
        disc_loss = disc(input_ids=torch.as_tensor(corrupted.copy()).long(), labels=torch.as_tensor(labels),
                         **common).loss.item()
    np.testing.assert_allclose(float(loss), gen_loss + 50.0 * disc_loss, rtol=1e-5)
    np.testing.assert_allclose(float(sums["mlm_loss"]), gen_loss, rtol=1e-5)
    np.testing.assert_allclose(float(sums["disc_loss"]), disc_loss, rtol=1e-5)
    assert float(sums["disc_count"]) == batch["input_mask"].sum()
    assert float(sums["replaced"]) == labels.sum()


def small_config(**electra_section):
    config = tiny_config({}, "configs/electra_tiny.py")
    config.model.update(num_layers=1, hidden_size=32, num_heads=4, intermediate_size=64, vocab_size=96,
                        max_position_embeddings=32, embedding_size=16)
    config.electra.update(generator_hidden_size=8, generator_num_layers=1, generator_num_heads=2,
                          generator_intermediate_size=16, **electra_section)
    config.data.update(source="synthetic", max_seq_length=16, max_predictions_per_seq=3)
    config.train.update(batch_size=8, num_steps=4)
    config.schedule.warmup_steps = 1
    return config


def run_steps(mesh_shape, devices=None, num_steps: int = 2):
    config = small_config()
    mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)), devices)
    rules = sharding.logical_rules(config.logical_axis_rules)
    init_key, dropout_key = jax.random.split(jax.random.key(0))
    setup = pretraining_step.setup(config, mesh, rules, init_key)
    data_sharding = sharding.batch_sharding(mesh, rules)
    step_fn, _ = setup.compile_steps(data_sharding, 1)
    state, losses = setup.init(init_key), []
    with jax.set_mesh(mesh):
        for step in range(num_steps):
            host = synthetic.synthetic_batch(step, batch_size=8, max_seq_length=16, max_predictions_per_seq=3,
                                             vocab_size=96)
            state, sums = step_fn(state, sharding.global_batch(host, data_sharding), dropout_key)
            losses.append([float(sums["loss_sum"]), float(sums["replaced"])])
    return np.array(losses), state


@pytest.mark.mesh
@pytest.mark.slow
def test_a_mesh_of_eight_devices_gives_the_one_device_losses():
    assert jax.device_count() == 8
    ref, ref_state = run_steps((1, 1, 1), devices=jax.devices()[:1])
    losses, state = run_steps((2, 2, 2))
    np.testing.assert_array_equal(losses[:, 1], ref[:, 1])  # the same replacements drawn on every layout
    np.testing.assert_allclose(losses[:, 0], ref[:, 0], rtol=2e-5)
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    kernel = state.params["generator"]["encoder"]["layers_0"]["mlp"]["intermediate"]["kernel"]  # [G, F]: (embed, mlp)
    assert kernel.addressable_shards[0].data.shape == (8 // 2, 16 // 2)


@pytest.mark.slow
def test_a_resumed_run_equals_the_uninterrupted_one_and_readers_get_the_discriminator(tmp_path, capsys):
    config = small_config()
    config.logging.update(log_every=1, eval_every=100)
    config.checkpoint.update(every_steps=2, async_save=False)
    whole = tmp_path / "whole"
    pretraining.pretrain(config, str(whole))
    resumed = copy_of(whole, tmp_path / "resumed")
    shutil.rmtree(resumed / "checkpoints" / "4")
    pretraining.pretrain(config, str(resumed))
    assert "resumed from step 2" in capsys.readouterr().out
    assert train_losses(resumed) == train_losses(whole)
    a, b = (init_from.load(init_from.resolve(str(whole), tokenizer=False)),
            init_from.load(init_from.resolve(str(resumed), tokenizer=False)))
    assert set(a.params) == {"bert"}  # the generator left out, said in one line
    assert "its discriminator is read, the generator left out" in capsys.readouterr().out
    jax.tree_util.tree_map(np.testing.assert_array_equal, a.params, b.params)

    # Continued pretraining from the run exported as a pair, and from its discriminator alone.
    trained = jax.device_get(checkpoint.restore_params(str(whole))[0])
    layout = start.make_layout(config.mesh, config.logical_axis_rules)
    setup = pretraining_step.setup(config, layout.mesh, layout.rules, jax.random.key(5))
    fresh = jax.device_get(setup.init(jax.random.key(5)).params)
    hf_electra.save_pair(tmp_path / "pair", setup.bert_config, setup.generator_config, trained)
    flat = lambda tree: traverse_util.flatten_dict(jax.device_get(tree), sep="/")  # noqa: E731
    for path, generator_from in ((tmp_path / "pair", trained), (tmp_path / "pair" / "discriminator", fresh)):
        parent = phases.read_parent(str(path), config, "train.init_from")
        params = flat(phases.electra_initial_params(str(path), parent, setup, setup.init(jax.random.key(5)).params))
        for name, x in params.items():  # the poolers: no ElectraForPreTraining tensor, fresh
            source = fresh if "pooler" in name else generator_from if name.startswith("generator") else trained
            np.testing.assert_array_equal(x, flat(source)[name], err_msg=name)
    assert "is a discriminator alone: the generator starts fresh" in capsys.readouterr().out


def test_a_generator_wider_than_the_discriminator_is_one_line_and_exit_2(tmp_path):
    result = run_program("bertjax.train", "--config=configs/electra_tiny.py", f"--workdir={tmp_path}",
                         "--config.electra.generator_hidden_size=256", "--dry_run")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "electra.generator_hidden_size=256 is wider than" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
