"""Rerankers (the rerank task kind): each loss and its gradient against sentence-transformers' CrossEncoder
losses on the same scores (KL against torch's kl_div), 20 training steps against a CrossEncoder trained by
torch's AdamW from the same weights, and the fine-tuning program on queries and candidates (dev nDCG@10 as
pytrec_eval computes it, the best checkpoint, bertjax.load's scores equal to the CrossEncoder export's)."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from sentence_transformers.cross_encoder import CrossEncoder
from sentence_transformers.cross_encoder import losses as ce_losses

from bertjax.models import rerank_losses

# Four queries, their candidate counts 5, 3, 4 and 5 (slots C = 5): an empty slot must not count.
COUNTS = (5, 3, 4, 5)
C = max(COUNTS)


class ScoreTable(CrossEncoder):
    """Stands in for a CrossEncoder in sentence-transformers' losses: the score of pair (query i, candidate j)
    is a learnable table's entry, so the losses read exactly the scores given and give their gradient."""

    num_labels = 1
    device = torch.device("cpu")

    def __init__(self, scores: np.ndarray):
        torch.nn.Module.__init__(self)  # none of CrossEncoder's own: no transformer behind the scores
        self.table = torch.nn.Parameter(torch.tensor(scores, dtype=torch.float64))

    def preprocess(self, pairs, prompt=None, task=None):
        return {"at": torch.tensor([[int(q), int(d)] for q, d in pairs])}

    def forward(self, tokens):
        return {"scores": self.table[tokens["at"][:, 0], tokens["at"][:, 1]].float()}


def grouped(seed: int, grades: bool = True):
    """Scores, targets and weights [B, C] of COUNTS candidates per query; targets whole grades 0-3 or floats."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(len(COUNTS), C)).astype(np.float32) * 2
    targets = (rng.integers(0, 4, size=scores.shape) if grades else rng.random(scores.shape)).astype(np.float32)
    weights = (np.arange(C)[None, :] < np.array(COUNTS)[:, None]).astype(np.float32)
    return scores, targets, weights


def ours(name: str, scores, targets, weights, **settings):
    """bertjax's loss and its gradient with respect to the scores (empty slots' gradient is zero)."""
    fn = functools.partial(rerank_losses.rerank_loss, name=name, **settings)
    (loss, _), grad = jax.value_and_grad(lambda s: fn(s, jnp.asarray(targets), jnp.asarray(weights)),
                                         has_aux=True)(jnp.asarray(scores))
    return float(loss), np.asarray(grad)


def theirs(loss_of_model, scores, targets, weights, listwise: bool = True):
    """A sentence-transformers CrossEncoder loss on the same scores: its value and gradient [B, C]."""
    model = ScoreTable(scores)
    loss_fn = loss_of_model(model)
    queries = [str(i) for i in range(len(COUNTS))]
    if listwise:
        docs = [[str(j) for j in range(n)] for n in COUNTS]
        labels = [torch.tensor(targets[i, :n]) for i, n in enumerate(COUNTS)]
        loss = loss_fn([queries, docs], labels)
    else:  # one (query, candidate) pair per row
        pairs = [(str(i), str(j)) for i, n in enumerate(COUNTS) for j in range(n)]
        labels = torch.tensor([targets[i, j] for i, n in enumerate(COUNTS) for j in range(n)])
        loss = loss_fn([[q for q, _ in pairs], [d for _, d in pairs]], labels)
    loss.backward()
    return float(loss.detach()), model.table.grad.numpy() * weights


@pytest.mark.parametrize("name, reference, listwise, grades", [
    ("bce", ce_losses.BinaryCrossEntropyLoss, False, False),
    ("listnet", ce_losses.ListNetLoss, True, False),
    ("lambdaloss", ce_losses.LambdaLoss, True, True),
    ("ranknet", ce_losses.RankNetLoss, True, True),
])
def test_losses_and_gradients_as_sentence_transformers(name, reference, listwise, grades):
    for seed in range(3):
        scores, targets, weights = grouped(seed, grades)
        if name == "bce":
            targets = (targets > 0.5).astype(np.float32)
        expected, expected_grad = theirs(reference, scores, targets, weights, listwise)
        got, grad = ours(name, scores, targets, weights)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_lambdaloss_settings_as_sentence_transformers():
    """The top-k cut, sigma and mu reach the loss as LambdaLoss(k=..., sigma=..., NDCGLoss2PPScheme(mu=...))."""
    scores, targets, weights = grouped(7)
    reference = functools.partial(ce_losses.LambdaLoss, k=2, sigma=0.5,
                                  weighting_scheme=ce_losses.NDCGLoss2PPScheme(mu=3.0))
    expected, expected_grad = theirs(reference, scores, targets, weights)
    got, grad = ours("lambdaloss", scores, targets, weights, k=2, sigma=0.5, mu=3.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_margin_mse_as_sentence_transformers():
    """MarginMSELoss on (query, positive, negative 1..n) with the teacher's n + 1 scores per row."""
    rng = np.random.default_rng(3)
    scores, teacher = rng.normal(size=(2, 4, C)).astype(np.float32)
    model = ScoreTable(scores)
    queries = [str(i) for i in range(4)]
    columns = [queries] + [[str(j)] * 4 for j in range(C)]
    loss = ce_losses.MarginMSELoss(model)(columns, torch.tensor(teacher))
    loss.backward()
    got, grad = ours("margin_mse", scores, teacher, np.ones_like(scores))
    np.testing.assert_allclose(got, float(loss.detach()), rtol=1e-6)
    np.testing.assert_allclose(grad, model.table.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_kl_distillation_as_torch_kl_div():
    """KL(teacher || student) of each query's real candidates at temperature T, the mean over queries."""
    scores, teacher, weights = grouped(5, grades=False)
    temperature = 2.0
    expected = np.mean([float(torch.nn.functional.kl_div(
        torch.log_softmax(torch.tensor(scores[i, :n]) / temperature, -1),
        torch.log_softmax(torch.tensor(teacher[i, :n]) / temperature, -1), log_target=True, reduction="sum"))
        for i, n in enumerate(COUNTS)])
    got, grad = ours("kl", scores, teacher, weights, temperature=temperature)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert np.all(grad[weights == 0] == 0) and np.abs(grad).sum() > 0


def test_a_padding_query_adds_nothing():
    """A whole padding query (weights 0, as a final partial batch has) leaves every loss as it was."""
    scores, targets, weights = grouped(2)
    for name in rerank_losses.LOSSES:
        alone, _ = ours(name, scores, targets, weights)
        padded, _ = ours(name, np.concatenate([scores, scores[:1] * 3]), np.concatenate([targets, targets[:1]]),
                         np.concatenate([weights, np.zeros_like(weights[:1])]))
        np.testing.assert_allclose(padded, alone, rtol=1e-6, err_msg=name)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------------------------------
# 20 steps against a sentence-transformers CrossEncoder trained by torch.optim.AdamW
# --------------------------------------------------------------------------------------------------

ADAMW = dict(lr=5e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
WORDS = [f"w{i}" for i in range(59)]


@pytest.fixture(scope="module")
def cross_encoder_directory(tmp_path_factory):
    """A small random transformers BertForSequenceClassification with one output (a CrossEncoder's form), its
    WordPiece vocabulary the words w0 ... w58, dropout off."""
    import transformers

    root = tmp_path_factory.mktemp("cross_encoder")
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=1,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(root)
    transformers.BertTokenizer(str(root / "vocab.txt")).save_pretrained(root)
    return root


def word_lists(seed: int, steps: int = 20, queries: int = 4, candidates: int = 3):
    """Per step: queries, each its candidates and graded labels, texts of the vocabulary's words."""
    rng = np.random.default_rng(seed)
    text = lambda n: " ".join(rng.choice(WORDS, n))  # noqa: E731
    return [[(text(4), [text(int(rng.integers(5, 12))) for _ in range(candidates)],
              [float(x) for x in rng.integers(0, 3, candidates)]) for _ in range(queries)] for _ in range(steps)]


def reference_curve(directory, steps, loss_name: str) -> list[float]:
    """sentence-transformers' loss on its CrossEncoder, a plain AdamW loop (decay off for LayerNorm and biases)."""
    model = CrossEncoder(str(directory), device="cpu")
    model.model.train()
    loss_fn = {"bce": ce_losses.BinaryCrossEntropyLoss, "lambdaloss": ce_losses.LambdaLoss}[loss_name](model)
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not ("LayerNorm" in n or "bias" in n)]},
              {"params": [p for n, p in named if "LayerNorm" in n or "bias" in n], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, **ADAMW)
    out = []
    for step in steps:
        if loss_name == "bce":
            pairs = [(q, d, min(y, 1.0)) for q, docs, ys in step for d, y in zip(docs, ys)]
            loss = loss_fn([[q for q, _, _ in pairs], [d for _, d, _ in pairs]], torch.tensor([y for *_, y in pairs]))
        else:
            loss = loss_fn([[q for q, _, _ in step], [docs for _, docs, _ in step]],
                           [torch.tensor(ys) for *_, ys in step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(float(loss.detach()))
    return out


def bertjax_curve(directory, steps, loss_name: str) -> list[float]:
    """The same through bertjax: the directory read by the Hugging Face importer as a rerank head, the kind's
    features, the fine-tuning loss and bertjax's AdamW with bias correction, a constant rate, no clipping."""
    from bertjax.interop import hf
    from bertjax.models import heads
    from bertjax.tasks import registry, steps as task_steps
    from bertjax.tasks.kinds import rerank
    from bertjax.text import tokenizers
    from bertjax.training import optim, sharding
    from bertjax.training import state as train_state
    from configs.finetune import common as finetune_configs

    cfg, params, missing = hf.load_hf_head(directory, "rerank", model_config_overrides=dict(
        hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
    assert not missing
    net = heads.network("rerank", cfg)
    tokenizer = tokenizers.load_tokenizer("wordpiece", str(directory / "vocab.txt"), lower_case=True)
    task = registry.get_task("rerank", rerank_loss=loss_name)
    settings = rerank.Settings(loss_name, 3, None, 1.0, 10.0, 1.0)
    tx = optim.bert_adamw(ADAMW["lr"], *ADAMW["betas"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"],
                          bias_correction=True)
    rules_table = finetune_configs.finetune_config("rerank").logical_axis_rules
    mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    rules = sharding.logical_rules(rules_table)
    data_sharding = sharding.batch_sharding(mesh, rules)
    init_key, dropout_key = train_state.root_keys(0)
    setup = train_state.Setup.create(net, heads.dummy_inputs("rerank", 1, 32, 3), tx, None, mesh, rules, init_key,
                                     prepare_params=lambda p: jax.tree_util.tree_map(
                                         lambda box, value: box.replace_boxed(jnp.asarray(value))
                                         if hasattr(box, "replace_boxed") else jnp.asarray(value),
                                         p, params, is_leaf=lambda x: hasattr(x, "replace_boxed")))
    loss = functools.partial(task_steps.task_loss, net=net, loss=task_steps.head_loss(task, settings))
    step_fn = setup.compile_train_step(loss, data_sharding, 1)
    state, out = setup.init(init_key), []
    with jax.set_mesh(mesh):
        for step in steps:
            examples = [rerank.RerankExample(i, q, docs, [str(j) for j in range(3)],
                                             [min(y, 1.0) for y in ys] if loss_name == "bce" else ys)
                        for i, (q, docs, ys) in enumerate(step)]
            features = rerank.featurize(task, examples, tokenizer, 32, settings)
            batch = {k: features[k] for k in ("input_ids", "segment_ids", "input_mask", "label", "example_weight",
                                              "label_weight")}
            state, sums = step_fn(state, sharding.global_batch(batch, data_sharding), dropout_key)
            out.append(float(sums["loss_sum"]))
    return out


def test_training_follows_sentence_transformers(cross_encoder_directory, loss_name="lambdaloss"):
    """20 steps from the same weights on the same queries, LambdaLoss (its sorted pairs, the hardest to follow;
    the other losses' values and gradients are held above): every step's loss within 1e-4 (relative)."""
    steps = word_lists(seed=5)
    expected = reference_curve(cross_encoder_directory, steps, loss_name)
    got = bertjax_curve(cross_encoder_directory, steps, loss_name)
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert np.std(expected) > 0.01  # the comparison is of a changing model


# --------------------------------------------------------------------------------------------------
# The fine-tuning program
# --------------------------------------------------------------------------------------------------


def candidate_rows(pairs, count: int, seed: int, negatives: int = 3, words: int = 8) -> list[dict]:
    """Each of `count` queries with its positive and `negatives` other pairs' positives, shuffled, labels 1 / 0;
    texts cut to their first `words` words so that a pair fits the model's rows uncut (sentence-transformers
    and BERT's original code cut the longer text first, but break a tie differently)."""
    rng = np.random.default_rng(seed)
    cut = lambda text: " ".join(text.split()[:words])  # noqa: E731
    rows = []
    for i, pair in enumerate(pairs[:count]):
        others = [j for j in rng.permutation(len(pairs))[: negatives + 1] if j != i][:negatives]
        candidates = [(cut(pair["positive"]), 1)] + [(cut(pairs[j]["positive"]), 0) for j in others]
        order = rng.permutation(len(candidates))
        rows.append({"query": cut(pair["query"]), "passages": [candidates[o][0] for o in order],
                     "labels": [candidates[o][1] for o in order], "passage_ids": [f"p{o}" for o in order]})
    return rows


@pytest.fixture(scope="module")
def rerank_files(tmp_path_factory):
    from bertjax.tasks import demo_tasks

    root = tmp_path_factory.mktemp("rerank_data")
    splits = demo_tasks.retrieval_examples(0)
    return {"train": write_jsonl(root / "train.jsonl", candidate_rows(splits["train"], 48, 0)),
            "validation": write_jsonl(root / "dev.jsonl", candidate_rows(splits["dev"], 16, 1))}


def rerank_run_config(pretrained, files, **rerank):
    from configs.finetune import common as finetune_configs

    config = finetune_configs.rerank_config()
    config.train.init_from = pretrained["workdir"]
    config.data.update(max_seq_length=64, train=files["train"], validation=files["validation"])
    config.train.update(batch_size=16, epochs=2.0)
    config.optimizer.learning_rate = 1e-3
    config.rerank.update({"candidates": 4, **rerank})
    config.logging.update(log_every=1, eval_batch_size=8)
    return config


def test_the_program_trains_a_reranker_scored_as_pytrec_eval_and_exported_as_a_cross_encoder(
        pretrained, rerank_files, tmp_path):
    import pytrec_eval

    import bertjax
    from bertjax.runs import exporting, finetuning

    config = rerank_run_config(pretrained, rerank_files, loss="listnet")
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in lines if r.get("split") == "validation"]
    assert [r["step"] for r in dev] == [3, 6] and summary["main_metric"] == "ndcg_at_10"
    assert summary["best"]["value"] == max(r["ndcg_at_10"] for r in dev)

    # The best checkpoint's dev figures are trec_eval's on its own scores of the dev candidates.
    model = bertjax.load(str(tmp_path / "run"))
    rows = [json.loads(line) for line in open(rerank_files["validation"])]
    scores = [o["score"] for o in model.predict([r["query"] for r in rows for _ in r["passages"]],
                                                [p for r in rows for p in r["passages"]])]
    run, qrels, at = {}, {}, 0
    for i, r in enumerate(rows):
        run[str(i)] = {pid: scores[at + j] for j, pid in enumerate(r["passage_ids"])}
        qrels[str(i)] = {pid: int(y) for pid, y in zip(r["passage_ids"], r["labels"])}
        at += len(r["passages"])
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank"}).evaluate(run)
    best = summary["best"]["metrics"]["validation"]
    np.testing.assert_allclose(best["ndcg_at_10"], np.mean([q["ndcg_cut_10"] for q in trec.values()]), rtol=1e-6)
    np.testing.assert_allclose(best["mrr_at_10"], np.mean([q["recip_rank"] for q in trec.values()]), rtol=1e-6)

    # Exported as a CrossEncoder: sentence-transformers' scores of the pairs are bertjax's.
    exported = exporting.export(str(tmp_path / "run"), str(tmp_path / "ce"), "sentence-transformers")
    cross = CrossEncoder(exported, device="cpu")
    theirs = cross.predict([(r["query"], p) for r in rows for p in r["passages"]])
    np.testing.assert_allclose(theirs, scores, atol=1e-5)


def test_a_packed_step_has_the_loss_and_gradient_of_its_queries_unpacked(cross_encoder_directory, name="listnet"):
    """The pairs of a step's queries (3, 1 and 2 candidates of C = 3 slots) packed into rows give the unpacked
    batch's loss and every gradient."""
    from bertjax.interop import hf
    from bertjax.models import heads
    from bertjax.tasks import batches, registry, rerank_batches, steps as task_steps
    from bertjax.tasks.kinds import rerank
    from bertjax.text import tokenizers

    cfg, params, _ = hf.load_hf_head(cross_encoder_directory, "rerank", model_config_overrides=dict(
        hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
    net = heads.network("rerank", cfg)
    tokenizer = tokenizers.load_tokenizer("wordpiece", str(cross_encoder_directory / "vocab.txt"), lower_case=True)
    task = registry.get_task("rerank", rerank_loss=name)
    settings = rerank.Settings(name, 3, None, 1.0, 10.0, 1.0)
    step = word_lists(seed=2, steps=1, queries=6)[0]
    examples = [rerank.RerankExample(i, q, docs[:1 + i % 3], ["a", "b", "c"][:1 + i % 3], ys[:1 + i % 3])
                for i, (q, docs, ys) in enumerate(step)]
    features = rerank.featurize(task, examples, tokenizer, 32, settings)
    loss = functools.partial(task_steps.task_loss, net=net, loss=task_steps.head_loss(task, settings))
    grad = jax.jit(jax.value_and_grad(lambda p, b: loss(p, b, jax.random.key(0))[0]))

    chosen = batches.train_batch_indices(6, 4, 0, 1)  # the 4 queries of step 1
    unpacked = {k: features[k][chosen] for k in ("input_ids", "segment_ids", "input_mask", "label",
                                                 "label_weight", "example_weight")}
    packed = rerank_batches.packed_step(features, rerank_batches.pair_lengths(features), 4, 0, 1, num_rows=4,
                                        max_sequences=3)
    assert packed["input_ids"].shape == (4, 32) and packed["pair_slots"].shape == (4, 3)
    want, want_grads = grad(params, unpacked)
    got, got_grads = grad(params, packed)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bad_rerank_input_is_one_line_and_writes_nothing(pretrained, rerank_files, tmp_path):
    import re

    from bertjax.runs import finetuning
    from bertjax.tasks import registry
    from bertjax.tasks.kinds import rerank

    cases = [  # (rows, loss, split, the line)
        ([{"query": "q", "passages": ["a", "b"], "labels": [1, 0]}, {"query": "r", "passages": ["c"]}], "bce", "train",
         "bad.jsonl:2: missing field 'labels': a list of numbers, one per passage"),
        ([{"query": "q", "passages": ["a", "b"], "labels": [1]}], "listnet", "train",
         "bad.jsonl:1: field 'labels' must be a list of 2 numbers"),
        ([{"query": "q", "passage": "a", "label": 1}, {"query": "q", "passage": "b"}], "bce", "train",
         "bad.jsonl:2: missing field 'label'"),
        ([{"query": "q", "passages": ["a"], "labels": [0.5]}], "bce", "validation",
         "a dev set's labels are whole-number grades"),
        ([], "bce", "train", "bad.jsonl: empty file"),
    ]
    for rows, loss, split, fragment in cases:
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            rerank.read(registry.get_task("rerank", rerank_loss=loss), split, write_jsonl(tmp_path / "bad.jsonl", rows))
        assert "\n" not in str(error.value)
    too_many = rerank.read(registry.get_task("rerank"), "train", write_jsonl(tmp_path / "six.jsonl", [
        {"query": "q", "passages": list("abcdef"), "labels": [1, 0, 0, 0, 0, 0]}]))
    with pytest.raises(ValueError, match="6 candidates, more than rerank.candidates=4: raise rerank.candidates to 6"):
        rerank.featurize(None, too_many, None, 16, rerank.Settings("bce", 4, None, 1.0, 10.0, 1.0))

    # Through the program: one line, and no workdir.
    unscored = write_jsonl(tmp_path / "unscored.jsonl", [{"query": "q", "passages": ["a", "b"], "labels": [1, 0]}])
    settings = [({"train": unscored}, {"loss": "margin_mse"},
                 "unscored.jsonl:1: missing field 'scores' (rerank.loss=margin_mse trains on a teacher's scores)"),
                ({}, {"loss": "softmax"}, "rerank.loss='softmax': choose one of bce, listnet, lambdaloss"),
                ({}, {"candidates": 0}, "rerank.candidates=0: the most candidates a query has")]
    for data, settings_changed, fragment in settings:
        with pytest.raises(ValueError, match=re.escape(fragment)) as error:
            config = rerank_run_config(pretrained, {**rerank_files, **data}, **settings_changed)
            finetuning.finetune(config, str(tmp_path / "bad"))
        assert "\n" not in str(error.value) and not (tmp_path / "bad").exists()
