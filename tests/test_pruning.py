"""bertjax.compression.pruning and python -m bertjax.prune: the head mask against transformers (whose BERT
in version 5 has no head_mask argument: the same multiplier is put on the columns of each head in the
attention output projection), head importance against torch autograd through transformers, pruned models
against the unpruned one with those heads masked, Hugging Face export parity of a pruned model, magnitude
pruning's sparsity and its mask through recovery steps, and the program end to end."""

import contextlib
import dataclasses
import functools
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from bertjax.compression import pruning
from bertjax.interop import hf
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.models import heads
from bertjax.training.checkpoint_meta import CheckpointMeta

ATOL = 1e-5
SHAPE = dict(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=60,
             max_position_embeddings=24, num_labels=3)
LAYERS, NUM_HEADS, HEAD_SIZE = 3, 4, 8


@pytest.fixture(scope="module")
def reference():
    """A transformers BertForSequenceClassification with every weight noise, the same weights as bertjax
    classification params, and two batches."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(**SHAPE, attn_implementation="eager")).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if "LayerNorm.weight" in name else 0.2 * noise)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    cfg = hf.config_from_hf(model.config.to_dict(), hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    params, _ = hf.hf_to_head_params(state, cfg, "classification")
    rng = np.random.default_rng(0)
    batches = []
    for lengths in ([12, 7, 4, 10], [5, 12, 9, 3]):
        mask = (np.arange(12)[None] < np.array(lengths)[:, None]).astype(np.int32)
        batches.append({"input_ids": rng.integers(1, 60, (4, 12)).astype(np.int32) * mask,
                        "segment_ids": (np.arange(12)[None] >= 3).astype(np.int32) * mask, "input_mask": mask,
                        "label": rng.integers(0, 3, 4).astype(np.int32),
                        "example_weight": np.ones(4, np.float32)})
    return dict(model=model, cfg=cfg, params=jax.device_get(params), batches=batches)


def both(batches):
    """The batches as one (8 rows): one compiled shape for the logits comparisons."""
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def torch_inputs(batch):
    return dict(input_ids=torch.as_tensor(batch["input_ids"], dtype=torch.long),
                token_type_ids=torch.as_tensor(batch["segment_ids"], dtype=torch.long),
                attention_mask=torch.as_tensor(batch["input_mask"], dtype=torch.long))


def masked_weights(model, head_mask):
    """transformers' params with each head's columns of its attention output projection times head_mask."""
    weights = {}
    for layer in range(LAYERS):
        name = f"bert.encoder.layer.{layer}.attention.output.dense.weight"
        scale = head_mask[layer].repeat_interleave(HEAD_SIZE)  # [H]: head-major, as the context is laid out
        weights[name] = dict(model.named_parameters())[name] * scale[None, :]
    return weights


@functools.lru_cache(maxsize=None)
def _logits_fn(cfg, masked: bool):
    net = heads.network("classification", cfg, 3)

    def logits(params, batch, head_mask):
        inputs = [batch[k] for k in ("input_ids", "segment_ids", "input_mask")]
        with pruning.head_mask_in(head_mask) if masked else contextlib.nullcontext():
            return net.apply({"params": params}, *inputs, deterministic=True)

    return jax.jit(logits)


def logits_of(cfg, params, batch, head_mask=None):
    """The classifier's logits [B, 3], jitted once per config (compiling dominates these tests)."""
    return np.asarray(_logits_fn(cfg, head_mask is not None)(params, batch, head_mask))


def classification_loss(params, batch, *, cfg):
    logits = heads.network("classification", cfg, 3).apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"], deterministic=True)
    return heads.classification_loss(logits, batch["label"], batch["example_weight"])[0]


def test_head_mask_matches_transformers(reference):
    cfg, params, batch, model = reference["cfg"], reference["params"], reference["batches"][0], reference["model"]
    model_inputs = [jnp.asarray(batch[k]) for k in ("input_ids", "segment_ids", "input_mask")]
    encode = jax.jit(lambda p, m: bert_model.BertModel(cfg).apply({"params": p}, *model_inputs, head_mask=m))
    plain, ones = encode(params["bert"], None), encode(params["bert"], jnp.ones((LAYERS, NUM_HEADS)))
    np.testing.assert_array_equal(np.asarray(plain["sequence_output"]), np.asarray(ones["sequence_output"]))

    head_mask = np.array([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 0.25], [1.0, 1.0, 0.0, 0.0]], np.float32)
    ours = encode(params["bert"], jnp.asarray(head_mask))
    with torch.no_grad():
        weights = {k[len("bert."):]: v for k, v in masked_weights(model, torch.as_tensor(head_mask)).items()}
        theirs = torch.func.functional_call(model.bert, weights, kwargs=torch_inputs(batch))
    real = batch["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(ours["sequence_output"])[real], theirs.last_hidden_state.numpy()[real],
                               atol=ATOL)
    np.testing.assert_allclose(np.asarray(ours["pooled_output"]), theirs.pooler_output.numpy(), atol=ATOL)
    assert np.abs(np.asarray(ours["pooled_output"] - plain["pooled_output"])).max() > 1e-2  # the mask matters


def test_head_importance_matches_torch_autograd(reference):
    cfg, params, model = reference["cfg"], reference["params"], reference["model"]
    expected = np.zeros((LAYERS, NUM_HEADS))
    for batch in reference["batches"]:
        head_mask = torch.ones(LAYERS, NUM_HEADS, requires_grad=True)
        out = torch.func.functional_call(model, masked_weights(model, head_mask), kwargs=torch_inputs(batch))
        loss = torch.nn.functional.cross_entropy(out.logits, torch.as_tensor(batch["label"], dtype=torch.long))
        loss.backward()
        expected += np.abs(head_mask.grad.numpy()) / len(reference["batches"])
    loss_fn = lambda p, b: classification_loss(p, b, cfg=cfg)  # noqa: E731
    raw = pruning.head_importance(loss_fn, params, reference["batches"], cfg, normalize=False)
    np.testing.assert_allclose(raw, expected, rtol=1e-4, atol=1e-7)
    normalized = pruning.head_importance(loss_fn, params, reference["batches"], cfg)
    np.testing.assert_allclose(normalized, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-4)
    reference["importance"] = normalized


def test_heads_to_keep_takes_the_globally_most_important_with_one_per_layer(reference):
    cfg = reference["cfg"]
    importance = np.array([[0.9, 0.8, 0.1, 0.7], [0.05, 0.02, 0.01, 0.03], [0.6, 0.95, 0.5, 0.4]])
    keep = pruning.heads_to_keep(importance, cfg, 6)
    # each layer's best (layer 1's 0.05, beaten by every other head), then the next best overall: 0.8, 0.7, 0.6
    assert keep == [[0, 1, 3], [0], [0, 1]]
    with pytest.raises(ValueError, match="prune.heads=2"):
        pruning.heads_to_keep(importance, cfg, 2)


def test_pruned_model_equals_masked_model_and_shrinks(reference):
    cfg, params = reference["cfg"], reference["params"]
    keep = [[0, 3], [1], [0, 1, 2]]
    pruned_cfg, pruned = pruning.prune_heads(params, cfg, keep)
    assert pruned_cfg.layer_heads == (2, 1, 3) and pruned_cfg.head_dim == HEAD_SIZE
    assert pruned["bert"]["encoder"]["layers_1"]["attention"]["query"]["kernel"].shape == (32, 1, HEAD_SIZE)
    assert pruned["bert"]["encoder"]["layers_1"]["attention"]["output"]["kernel"].shape == (1, HEAD_SIZE, 32)
    head_mask = np.zeros((LAYERS, NUM_HEADS), np.float32)
    for layer, kept in enumerate(keep):
        head_mask[layer, kept] = 1.0
    batch = both(reference["batches"])
    masked = logits_of(cfg, params, batch, jnp.asarray(head_mask))
    np.testing.assert_allclose(logits_of(pruned_cfg, pruned, batch), masked, atol=ATOL)
    per_head = 3 * (32 * HEAD_SIZE + HEAD_SIZE) + HEAD_SIZE * 32  # q/k/v kernels and biases, output rows
    assert bert_model.count_params(params) - bert_model.count_params(pruned) == 6 * per_head


def test_scanned_layers_prune_with_equal_counts(reference):
    cfg = BertConfig(**{**reference["cfg"].__dict__, "scan_layers": True})
    params = reference["params"]
    scanned = {**params, "bert": {**params["bert"], "encoder": bert_model.stack_layers(params["bert"]["encoder"], cfg)}}
    keep = [[1, 2], [0, 3], [2, 3]]
    pruned_cfg, pruned = pruning.prune_heads(scanned, cfg, keep)
    assert pruned_cfg.scan_layers and pruned["bert"]["encoder"]["layers"]["attention"]["key"]["kernel"].shape == (
        LAYERS, 32, 2, HEAD_SIZE)
    head_mask = np.zeros((LAYERS, NUM_HEADS), np.float32)
    for layer, kept in enumerate(keep):
        head_mask[layer, kept] = 1.0
    batch = reference["batches"][0]
    np.testing.assert_allclose(logits_of(pruned_cfg, pruned, batch),
                               logits_of(cfg, scanned, batch, jnp.asarray(head_mask)), atol=ATOL)
    # unequal counts cannot be scanned: pruning unrolls them; a config asking for both is one clear error
    unequal_cfg, _ = pruning.prune_heads(scanned, cfg, [[1], [0, 3], [2, 3]])
    assert not unequal_cfg.scan_layers
    with pytest.raises(ValueError, match="scan_layers=True stacks layers of one shape"):
        BertConfig(**{**unequal_cfg.__dict__, "scan_layers": True})


def test_pruned_hf_export_matches_transformers(reference, tmp_path):
    cfg, params = reference["cfg"], reference["params"]
    pruned_cfg, pruned = pruning.prune_heads(params, cfg, [[0, 3], [1], [0, 1, 2]])
    hf.save_hf_head(tmp_path, pruned_cfg, pruned, "classification")
    exported = transformers.BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert exported.config.num_attention_heads == NUM_HEADS  # full shapes, the removed heads zero
    query = exported.bert.encoder.layer[1].attention.self.query.weight.detach().numpy()  # [out = N*D, H]
    assert np.all(query[HEAD_SIZE:] == 0) and np.any(query[:HEAD_SIZE] != 0)
    batch = both(reference["batches"])
    with torch.no_grad():
        theirs = exported(**torch_inputs(batch)).logits.numpy()
    np.testing.assert_allclose(logits_of(pruned_cfg, pruned, batch), theirs, atol=ATOL)


@pytest.mark.parametrize("family", ("roberta", "albert", "modernbert"))
def test_a_pruned_family_model_equals_its_masked_self_and_exports_to_its_class(family, tmp_path):
    import test_family_heads as families

    cfg = families.bertjax_config(family)  # 2 layers of 4 heads; ALBERT's two run one shared group
    params = families.random_head(cfg, "classification")
    keep = [[0, 3], [2]][:cfg.num_groups]
    pruned_cfg, pruned = pruning.prune_heads(params, cfg, keep)
    assert pruned_cfg.layer_heads == tuple(len(k) for k in keep)
    head_mask = np.zeros((cfg.num_layers, cfg.num_heads), np.float32)  # ALBERT: each layer of the group alike
    for layer in range(cfg.num_layers):
        head_mask[layer, keep[layer * cfg.num_groups // cfg.num_layers]] = 1.0
    segments = cfg.type_vocab_size >= 2
    batch = families.make_inputs("classification", cfg.vocab_size, segments)
    ours = logits_of(pruned_cfg, pruned, batch)
    np.testing.assert_allclose(ours, logits_of(cfg, params, batch, jnp.asarray(head_mask)), atol=ATOL)
    hf.save_hf_head(tmp_path, pruned_cfg, pruned, "classification")
    exported = families.task_class(family, "classification").from_pretrained(tmp_path, attn_implementation="eager")
    assert exported.config.num_attention_heads == cfg.num_heads  # full shapes, the removed heads zero
    np.testing.assert_allclose(ours, families.hf_logits(exported.eval(), "classification", batch, segments),
                               atol=ATOL)


def test_albert_heads_go_per_shared_group_by_their_summed_importance():
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=48,
                                num_hidden_groups=2, embedding_size=16)
    importance = np.array([[0.9, 0.1, 0.0, 0.2], [0.0, 0.1, 0.5, 0.2],  # group 0's layers: sums .9 .2 .5 .4
                           [0.1, 0.1, 0.1, 0.9], [0.3, 0.1, 0.0, 0.0]])  # group 1's: .4 .2 .1 .9
    assert pruning.total_heads(cfg) == 8
    assert pruning.heads_to_keep(importance, cfg, 4) == [[0, 2], [0, 3]]
    with pytest.raises(ValueError, match="prune.heads=1"):
        pruning.heads_to_keep(importance, cfg, 1)
    pruned = dataclasses.replace(cfg, layer_heads=(2, 3), head_size=8)
    assert [pruned.heads_of(layer) for layer in range(4)] == [2, 2, 3, 3]


def test_magnitude_pruning_sparsity_and_mask_through_recovery(reference):
    params = reference["params"]
    pruned, achieved = pruning.magnitude_prune(params, 0.5)
    assert abs(achieved - 0.5) < 1e-3
    kernels = [(np.asarray(a), np.asarray(b)) for (p, a), b in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(pruned)) if pruning.is_prunable(p)]
    assert len(kernels) == LAYERS * 6  # q, k, v, output; the feed-forward's two
    removed = np.concatenate([np.abs(a[b == 0]) for a, b in kernels])
    kept = np.concatenate([np.abs(a[b != 0]) for a, b in kernels])
    assert removed.max() <= kept.min()  # one global threshold
    untouched = pruned["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(untouched, params["bert"]["embeddings"]["word_embeddings"]["embedding"])

    # Recovery steps toward noise targets: every weight is pulled away from where it is, the pruned ones too,
    # so only the mask can hold them at zero (the optimizer and mask are what is tested; the program's
    # fine-tuning runs this same chain).
    targets = jax.tree_util.tree_map(lambda x: jnp.asarray(np.random.default_rng(x.size).normal(size=x.shape)),
                                     pruned)
    tx = optax.chain(optax.adamw(1e-2, weight_decay=0.01), pruning.keep_pruned_zeros())

    @jax.jit
    def step(p, state):
        grads = jax.grad(lambda q: sum(jnp.sum((a - t) ** 2) for a, t in zip(
            jax.tree_util.tree_leaves(q), jax.tree_util.tree_leaves(targets))))(p)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    recovered, state = pruned, tx.init(pruned)
    for _ in range(3):
        recovered, state = step(recovered, state)
    assert pruning.prunable_sparsity(recovered) == pytest.approx(achieved, abs=1e-9)
    changed = jax.tree_util.tree_map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), pruned, recovered)
    assert all(jax.tree_util.tree_leaves(changed))  # every parameter learned, the pruned kernels' survivors too


# --------------------------------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A tiny 'fine-tuned' keyword classifier workdir (a random model: the program's plumbing is what is
    tested here; docs/performance.md measures what pruning keeps of a trained one) and the task's files."""
    from test_finetune import keyword_sentences, write_jsonl

    from bertjax.data import demo
    from bertjax.text import vocab_learning as vocabularies
    from bertjax.training import checkpoint

    root = tmp_path_factory.mktemp("prune")
    workdir = root / "finetuned"
    workdir.mkdir()
    sentences = [s for doc in demo.demo_documents(60) for s in doc]
    vocabularies.learn_wordpiece_vocab(iter(sentences), 300, True, str(workdir / "vocab.txt"))
    vocab_size = len((workdir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                                max_position_embeddings=32, attention_dropout_rate=0.0, hidden_dropout_rate=0.0)
    net = heads.network("classification", cfg, 2)
    params = nn.unbox(net.init(jax.random.key(1), **heads.dummy_inputs("classification", 1, 8))["params"])
    rows = [{"text": s, "label": label} for s, label in keyword_sentences()]
    files = dict(train=write_jsonl(root / "train.jsonl", rows[:64]),
                 validation=write_jsonl(root / "dev.jsonl", rows[64:96]))
    meta = {"step": 1, "model": cfg.__dict__,
            "tokenizer": {"kind": "wordpiece", "path": "vocab.txt", "lower_case": True},
            "task": {"name": "classification", "kind": "classification", "labels": ["no", "yes"], "num_choices": None,
                     "max_seq_length": 32, "squad_version": None, "feature_based": None, "squad_settings": None}}
    checkpoint.save_params(str(workdir), checkpoint.BEST_DIR, 1, jax.device_get(params), CheckpointMeta.from_json(meta))
    return dict(root=root, workdir=str(workdir), files=files)


@pytest.mark.slow
def test_prune_program_writes_a_workdir_that_loads_and_exports(finetuned, tmp_path):
    from bertjax.runs import exporting
    from bertjax.runs import prune_and_recover
    from configs.finetune import common as finetune_configs

    import bertjax

    config = finetune_configs.finetune_config("classification")
    config.train.init_from = finetuned["workdir"]
    config.data.update(max_seq_length=32, labels=("no", "yes"), **finetuned["files"])
    config.train.update(batch_size=16)
    config.logging.update(eval_batch_size=16)
    config.checkpoint.async_save = False
    # No recovery epochs: that is bertjax.finetune's run (tests/test_finetune.py), here with
    # keep_pruned_zeros in its optimizer (tested above), and the slowest part by far.
    config.prune.update(heads=3, importance_batches=2, sparsity=0.3, recovery_epochs=0.0)
    workdir = str(tmp_path / "pruned")
    record = prune_and_recover.prune(config, workdir)
    assert sum(len(k) for k in record["kept_heads"]) == 3 and record["params_after"] < record["params_before"]
    assert abs(record["sparsity"] - 0.3) < 1e-3
    written = json.loads((tmp_path / "pruned" / "pruning.json").read_text())
    assert written["kept_heads"] == record["kept_heads"] and written["dev_pruned"] == record["dev_pruned"]

    model = bertjax.load(workdir)
    assert sum(model.config.layer_heads) == 3 and not model.config.scan_layers
    assert pruning.prunable_sparsity(model.params) == pytest.approx(record["sparsity"], abs=1e-9)

    out = exporting.export(workdir, str(tmp_path / "hf"), "hf")
    exported = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    texts = ["What does the function return?", "The module is imported once."]
    ours = np.array([[p["scores"][label] for label in ("no", "yes")] for p in model.predict(texts)])
    encoded = transformers.AutoTokenizer.from_pretrained(out)(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = torch.softmax(exported(**encoded).logits, -1).numpy()
    np.testing.assert_allclose(ours, theirs, atol=ATOL)

    config.data.max_seq_length = 64  # beyond the fine-tuned model's 32 positions: one line, before any pruning
    with pytest.raises(ValueError, match=re.escape("data.max_seq_length=64 is longer than the 32 positions")):
        prune_and_recover.prune(config, str(tmp_path / "too-long"))
    assert not (tmp_path / "too-long" / "pruning.json").exists()
