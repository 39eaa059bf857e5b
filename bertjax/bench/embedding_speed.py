"""The embedding benchmark: bertjax's sentence embeddings and contrastive training step beside
sentence-transformers on one model and the same texts; what `python -m bertjax.benchmark --embeddings` runs.

The model: a BERT of MiniLM-L6's shape (H 384, 6 layers, 12 heads, FFN 1536, BERT's vocabulary size;
--model.KEY=VALUE changes it), random weights, mean pooling and L2 normalisation as all-MiniLM-L6-v2
embeds, written as a bertjax checkpoint and exported with --format=sentence-transformers; both sides
then load that one directory (bertjax.load and SentenceTransformer), so they run the same weights. Its
WordPiece vocabulary is learned from the benchmark's own texts.

Embedding: texts of mixed lengths cut from the demo corpus (a few words to past the max length), each
side's whole embed call timed (tokenizing included) with the same batch size and max length, after a
first untimed call (bertjax compiles its shapes there; its time is printed apart), the two sides
alternated pass by pass, the median pass counted. Printed: texts/s, real tokens/s (each text's tokens,
[CLS] and [SEP] included, up to the max length), their ratio and the largest difference of the two
embeddings.

Contrastive training: a fixed set of (query, positive) batches from the demo corpus, tokenized as the
contrastive fine-tuning program tokenizes them (queries to data.max_query_length, passages to
data.max_seq_length of configs/finetune/contrastive.py); bertjax's step is the program's (the contrastive
kind's network, MultipleNegativesRankingLoss over in-batch negatives, the config's AdamW and clipping),
sentence-transformers' the same loss module trained by torch.optim.AdamW with the same settings; their
steps timed in alternating blocks (bertjax/bench/timing.py). Printed: real tokens/s of each and their ratio.
"""

import dataclasses
import itertools
import os
import shutil
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np

import configs.base
import configs.finetune.contrastive
from bertjax.bench import hf_peer, st_peer
from bertjax.bench.timing import load_average, measure, print_table
from bertjax.data import demo
from bertjax.interop import hf
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig, resolve_platform
from bertjax.runs import exporting, finetuning, start
from bertjax.tasks import batches as task_batches
from bertjax.tasks import contrastive_batches, contrastive_steps, registry
from bertjax.tasks.kinds import contrastive as contrastive_kind
from bertjax.training import checkpoint, sharding
from bertjax.training import state as train_state
from bertjax.training.checkpoint_meta import CheckpointMeta, EmbeddingRecord

# sentence-transformers/all-MiniLM-L6-v2's encoder (nreimers/MiniLM-L6-H384-uncased), as bertjax's model section.
MINILM_L6 = dict(num_layers=6, hidden_size=384, num_heads=12, intermediate_size=1536, vocab_size=30522,
                 max_position_embeddings=512)
SEED = 0


# ---------------------------------------------------------------------------------------------------
# Texts and the model
# ---------------------------------------------------------------------------------------------------


def _sentences() -> list[list[str]]:
    return [document for document in demo.demo_documents() if document]


def demo_texts(num_texts: int, max_words: int, seed: int = SEED) -> list[str]:
    """Texts of 2 to max_words words (log-uniform: many short, some long), each a run of consecutive
    sentences of one demo document cut at that many words."""
    documents = _sentences()
    rng = np.random.default_rng(seed)
    texts = []
    for target in np.exp(rng.uniform(np.log(2), np.log(max_words), size=num_texts)).astype(int):
        document = documents[rng.integers(len(documents))]
        first = int(rng.integers(len(document)))
        words = " ".join(document[first:]).split()
        while len(words) < target:  # a short document: the next one continues it
            words += " ".join(documents[rng.integers(len(documents))]).split()
        texts.append(" ".join(words[:target]))
    return texts


def demo_pairs(num_pairs: int, seed: int = SEED + 1) -> list[tuple[str, str]]:
    """(query, positive): a sentence of a demo document, and the sentences after it (up to 6)."""
    documents = [d for d in _sentences() if len(d) >= 3]
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(num_pairs):
        document = documents[rng.integers(len(documents))]
        first = int(rng.integers(len(document) - 1))
        pairs.append((document[first], " ".join(document[first + 1:first + 7])))
    return pairs


def model_config(overrides: dict) -> BertConfig:
    """MiniLM-L6's shape in bertjax's base model section, with --model.KEY=VALUE on top."""
    model = configs.base.get_config().model
    model.update(MINILM_L6)
    model.update_from_flattened_dict(overrides)
    return BertConfig.from_dict(model.to_dict())


def write_models(root: str, cfg: BertConfig, texts: list[str], max_length: int) -> tuple[str, str]:
    """A bertjax checkpoint of `cfg` (random weights, an embedding record of mean pooling, normalised, at
    most max_length tokens) with a vocabulary learned from `texts`, and its sentence-transformers export:
    (workdir, sentence-transformers directory)."""
    from bertjax.text import vocab_learning  # TensorFlow: imported on this path only

    workdir = os.path.join(root, "run")
    os.makedirs(workdir)
    vocab_learning.learn_wordpiece_vocab(texts, cfg.vocab_size, lower_case=True,
                                         out_path=os.path.join(workdir, "vocab.txt"))
    net = bert_model.BertForPreTraining(cfg)
    batch = bert_model.dummy_batch(1, 8, 1)
    params = nn.unbox(jax.jit(lambda key: net.init(key, **batch, deterministic=True))(jax.random.key(SEED))["params"])
    record = EmbeddingRecord(modes=("mean",), normalize=True, max_seq_length=max_length)
    meta = CheckpointMeta.from_json({"step": 1, "model": dataclasses.asdict(cfg),
                                     "tokenizer": {"kind": "wordpiece", "path": "vocab.txt", "lower_case": True}})
    saver = checkpoint.Checkpointer(workdir, every_steps=1, keep=1, async_save=False)
    saver.save(1, jax.device_get(params), {"count": np.zeros((), np.int32)}, meta.replace(embedding=record),
               force=True)
    saver.wait()
    saver.close()
    exported = exporting.export(workdir, os.path.join(root, "sentence-transformers"), "sentence-transformers")
    return workdir, exported


# ---------------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------------


def alternate(calls: dict, passes: int) -> dict:
    """Seconds of each call, `passes` times, the order reversed every other pass so that a change in the
    machine's load falls on both alike."""
    seconds = {name: [] for name in calls}
    names = list(calls)
    for p in range(passes):
        for name in names if p % 2 == 0 else names[::-1]:
            began = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - began)
    return seconds


def run_embedding(bert, peer, texts: list[str], batch_size: int, passes: int) -> list[dict]:
    """bertjax's embed (and the peer's encode, where given) of `texts`: one row per side."""
    ids = bert.tokenizer.encode(texts)
    limit = bert.embedding.max_seq_length
    real_tokens = int(sum(min(len(row) + 2, limit) for row in ids))
    sides = {"bertjax": lambda: bert.embed(texts, batch_size=batch_size)}
    if peer is not None:
        sides[peer.name] = lambda: peer.embed(texts, batch_size=batch_size)
    first, out = {}, {}
    for name, call in sides.items():
        began = time.perf_counter()
        out[name] = call()
        first[name] = time.perf_counter() - began
    seconds = alternate(sides, passes)
    rows = []
    for name in sides:
        median = float(np.median(seconds[name]))
        rows.append(dict(side=name, texts_per_s=len(texts) / median, tokens_per_s=real_tokens / median,
                         seconds=median, first=first[name], embeddings=out[name]))
    if peer is not None:
        rows[1]["ratio"] = rows[0]["texts_per_s"] / rows[1]["texts_per_s"]
        rows[0]["max_abs_diff"] = float(np.abs(out["bertjax"] - out[peer.name]).max())
    return rows


# ---------------------------------------------------------------------------------------------------
# Contrastive training
# ---------------------------------------------------------------------------------------------------


def contrastive_config(batch_size: int):
    """configs/finetune/contrastive.py at the benchmark's batch size."""
    config = configs.finetune.contrastive.get_config()
    config.train.batch_size = batch_size
    return config


class BertjaxContrastiveStep:
    """The contrastive fine-tuning program's network, state and step (finetuning.task_setup and
    contrastive_train_step) on one device, from the sentence-transformers directory's weights, fed `batches`
    (packed, as the program trains with data.packing, or not)."""

    def __init__(self, config, directory: str, tokenizer, batches: list[dict], name: str = "bertjax"):
        task = registry.get_task(registry.CONTRASTIVE)
        settings = contrastive_kind.settings_from_config(config)
        cfg, params, _ = hf.load_hf_checkpoint(directory, resolve_platform(config.model.to_dict()))
        start_from = finetuning.TaskStart(cfg, {"bert": params["bert"]}, tokenizer, None, whole_head=False)
        layout = start.make_layout(dict.fromkeys(sharding.MESH_AXES, 1), config.logical_axis_rules,
                                   config.train.batch_size, devices=jax.devices()[:1])
        self.name, self.mesh = name, layout.mesh
        init_key, self.dropout_key = train_state.root_keys(config.train.seed, config.train.dropout_rng)
        setup = finetuning.task_setup(config, task, start_from, None, None, 1000, layout, init_key,
                                      settings.network())
        self.state = setup.init(init_key)
        self.step_fn = finetuning.contrastive_train_step(config, setup, settings, layout.data_sharding, num_steps=1)
        # A packed batch holds just what goes to the devices (contrastive_batches.batch_keys).
        keys = tuple(batches[0]) if "input_ids" in batches[0] else contrastive_steps.batch_keys(batches[0])
        self.batches = [sharding.global_batch({k: b[k] for k in keys}, layout.data_sharding) for b in batches]
        self.count, self.sums = 0, None

    def step(self) -> float:
        batch = self.batches[self.count % len(self.batches)]
        began = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.state, self.sums = self.step_fn(self.state, batch, self.dropout_key)
        jax.block_until_ready((self.state, self.sums))
        self.count += 1
        return time.perf_counter() - began

    def loss(self) -> float:
        return float(self.sums["loss_sum"])


def pair_batches(config, tokenizer, num_batches: int) -> tuple[list[dict], list[dict]]:
    """num_batches steps of train.batch_size pairs, drawn and featurized as the contrastive fine-tuning
    program draws and featurizes them: (each step's pairs as unpacked features, the same pairs' texts packed
    into rows as data.packing packs them)."""
    size, seed = config.train.batch_size, config.train.seed
    settings = contrastive_kind.settings_from_config(config)
    pairs = [contrastive_kind.Pair(i, q, p) for i, (q, p) in enumerate(demo_pairs(size * num_batches))]
    features = contrastive_kind.featurize(registry.get_task(registry.CONTRASTIVE), pairs, tokenizer,
                                          settings.max_seq_length, settings)
    unpacked = [{k: v[task_batches.train_batch_indices(len(pairs), size, seed, step)] for k, v in features.items()}
                for step in range(num_batches)]
    k = config.data.max_sequences_per_row
    rows = contrastive_batches.packed_rows_needed(features, size, seed, num_batches, max_sequences=k)
    packed = list(itertools.islice(contrastive_batches.packed_train_batches(
        features, size, seed, num_rows=rows, max_sequences=k), num_batches))
    return unpacked, packed


def run_contrastive(directory: str, tokenizer, batch_size: int, steps: int, warmup: int,
                    device: str | None) -> list[dict]:
    """bertjax's contrastive step on packed rows (as the program trains) and on unpacked ones, and (device
    not None) sentence-transformers' on the same pairs."""
    config = contrastive_config(batch_size)
    unpacked, packed = pair_batches(config, tokenizer, min(warmup + steps, 4))
    runners = [BertjaxContrastiveStep(config, directory, tokenizer, packed),
               BertjaxContrastiveStep(config, directory, tokenizer, unpacked, name="bertjax unpacked")]
    if device is not None:
        o = config.optimizer
        runners.append(st_peer.STContrastiveStep(
            directory, unpacked, scale=float(config.contrastive.scale), learning_rate=float(o.learning_rate),
            b1=float(o.b1), b2=float(o.b2), eps=float(o.eps), weight_decay=float(o.weight_decay),
            clip_norm=float(o.clip_norm), device=device))
    timings = measure(runners, warmup, steps)
    real = float(np.mean([b["query_mask"].sum() + b["passage_mask"].sum() for b in unpacked]))
    computed = [computed_tokens(packed), computed_tokens(unpacked), computed_tokens(unpacked, to_longest=True)]
    rows = [dict(side=r.name, tokens_per_s=real / t["median"], ms=1e3 * t["median"], first=t["first_step"],
                 loss=t["loss"], computed=c) for r, t, c in zip(runners, timings, computed)]
    if device is not None:
        for row in rows:
            row["ratio"] = row["tokens_per_s"] / rows[-1]["tokens_per_s"]
    return rows


def computed_tokens(batches: list[dict], to_longest: bool = False) -> float:
    """The positions a step computes, on average: its packed rows; unpacked, each column at its full width
    (bertjax's features) or, to_longest, cut to its longest text (as sentence-transformers' collator pads)."""
    if "input_ids" in batches[0]:
        return float(np.mean([b["input_ids"].size for b in batches]))
    masks = [[b[f"{role}_mask"] for role in ("query", "passage")] for b in batches]
    return float(np.mean([sum(len(m) * (m.sum(-1).max() if to_longest else m.shape[-1]) for m in step)
                          for step in masks]))


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------


def benchmark(*, overrides: dict, num_texts: int, max_length: int, batch_size: int, passes: int, steps: int,
              warmup: int, no_torch: bool) -> dict:
    """Builds the model and texts, times both sides, prints the two tables; returns their rows."""
    from bertjax import inference  # TensorFlow (the tokenizer): imported on this path only

    if num_texts < 1 or passes < 1:
        raise ValueError(f"--texts={num_texts} and --embed_passes={passes} must be at least 1")
    cfg = model_config(overrides)
    if not 3 <= max_length <= cfg.max_position_embeddings:
        raise ValueError(f"--max_length={max_length} must lie in [3, model.max_position_embeddings="
                         f"{cfg.max_position_embeddings}]")
    peer_device = None
    if not no_torch:
        if not st_peer.available():
            raise ValueError("sentence-transformers is not installed: install it (with torch) to time the peer, "
                             "or pass --no_torch to time bertjax alone")
        peer_device = "cuda" if jax.default_backend() == "gpu" and hf_peer.torch_cuda_available() else "cpu"
    # Words to about max_length tokens and past it, so that the longest are cut, as a real corpus's are.
    texts = demo_texts(num_texts, max_words=max(4, max_length))
    root = tempfile.mkdtemp(prefix="bertjax-embedding-benchmark-")
    try:
        _, directory = write_models(root, cfg, texts, max_length)
        bert = inference.load(directory)
        peer = None if peer_device is None else st_peer.STEmbedder(directory, peer_device)
        print(f"embedding: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, FFN "
              f"{cfg.intermediate_size}, {bert.num_params():,} parameters, vocabulary "
              f"{bert.tokenizer.vocab_size} of {cfg.vocab_size} rows; {num_texts} texts, batch {batch_size}, "
              f"max length {max_length}; bertjax on {jax.devices()[0].device_kind}"
              + (f", sentence-transformers on {peer_device} ({peer.versions})" if peer else "")
              + f"; load {load_average()}", flush=True)
        embed_rows = run_embedding(bert, peer, texts, batch_size, passes)
        table = [[r["side"], f"{r['texts_per_s']:,.1f}", f"{r['tokens_per_s']:,.0f}", f"{r['seconds']:.2f}",
                  f"{r['first']:.2f}", f"{r['ratio']:.2f}x" if "ratio" in r else "-"] for r in embed_rows]
        print_table(["embed", "texts/s", "real tok/s", "s/pass", "first call s", "bertjax / this"], table)
        if peer is not None:
            print(f"max |bertjax - sentence-transformers| over the {num_texts} embeddings: "
                  f"{embed_rows[0]['max_abs_diff']:.2e}; median of {passes} passes each, alternated", flush=True)
        config = contrastive_config(batch_size)
        print(f"contrastive: MNRL, scale {config.contrastive.scale:g}, {batch_size} pairs a step (in-batch "
              f"negatives), queries to {config.data.max_query_length} tokens, passages to "
              f"{config.data.max_seq_length}; bertjax's texts packed into rows of {config.data.max_seq_length} as "
              f"the program packs them (data.packing), and unpacked; {warmup} warmup + {steps} timed steps in "
              "alternating blocks", flush=True)
        step_rows = run_contrastive(directory, bert.tokenizer, batch_size, steps, warmup, peer_device)
        table = [[r["side"], f"{r['tokens_per_s']:,.0f}", f"{r['ms']:,.1f}", f"{r['computed']:,.0f}",
                  f"{r['first']:.2f}", f"{r['loss']:.3f}", f"{r['ratio']:.2f}x" if "ratio" in r else "-"]
                 for r in step_rows]
        print_table(["contrastive step", "real tok/s", "ms/step", "positions", "first step s", "loss",
                     "this / sentence-transformers"], table)
        print(f"jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load average "
              f"{load_average()}", flush=True)
        return {"embed": embed_rows, "contrastive": step_rows}
    finally:
        shutil.rmtree(root, ignore_errors=True)
