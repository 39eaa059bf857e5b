"""`bertjax.load(path)`: a trained BERT in a notebook, in one line.

    bert = bertjax.load("path/to/bert-base-uncased")   # a Hugging Face BERT directory
    out = bert.encode(["The cat sat.", "A longer second sentence."])
    out["sequence_output"]  # [B, S, H] numpy, one row per text, right-padded

`load` reads every kind of saved model (a bertjax workdir or checkpoint, a params export, a Hugging Face
directory of any family) through the one init-from (bertjax/init_from.py), as training,
fine-tuning and export do.
`load(path, quantize="int8")` runs every dense layer with int8 weights (quantize="int4-g128": int4 with a
scale per 128 inputs; bertjax/compression/quantize.py).
`embed(texts)` gives sentence embeddings as the model's own settings say (a sentence-transformers
directory's pooling, Dense, Normalize and prompts), else the mean of its token states; a SPLADE model's
vectors over the vocabulary (bertjax/models/sparse.py), as a dense numpy array [N, V].
`embed_tokens(texts, task=...)` gives a ColBERT model's token vectors and their masks
(bertjax/models/multivector.py), as sentence-transformers' MultiVectorEncoder does.
A BiLSTM student of task distillation (bertjax/models/bilstm.py) loads as a LoadedBiLSTM: `predict` and
`task_logits` as a fine-tuned BERT's, no encoder.

Shape legend (as in bertjax/models/bert.py): B batch, S sequence length, H hidden size, L layers.
"""

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from etils import epath
from flax import traverse_util

from bertjax import embeddings, init_from
from bertjax.compression import quantize as quantization  # `quantize` is load's argument
from bertjax.models import bert as bert_model
from bertjax.models import bilstm, heads, multivector, pooling, sparse
from bertjax.models.config import BertConfig
from bertjax.tasks import kinds, multivector_texts
from bertjax.text import files, tf_cpu
from bertjax.training import checkpoint, saved_models
from bertjax.training.checkpoint_meta import EmbeddingRecord, TaskRecord


def _make_tokenizer(files: init_from.TokenizerFiles):
    """The project's tokenizer (WordPiece, SentencePiece or byte-level BPE), with TensorFlow kept off the
    accelerators.

    The tokenizer runs TF ops eagerly; left alone, TF would claim every visible GPU's memory on its
    first op, which the JAX model next to it in the same notebook needs.
    """
    tf_cpu.import_tensorflow()  # here, not at the top: bertjax.load's module is imported without TensorFlow
    return files.load()


@dataclasses.dataclass
class LoadedBert:
    """A BERT model ready for inference: config, BertForPreTraining params and tokenizer."""

    config: BertConfig
    params: dict  # plain BertForPreTraining params ("bert", "mlm_head", "nsp_head")
    tokenizer: Any  # a bertjax.text.tokenizers.Tokenizer (WordPiece, SentencePiece, BPE)
    source: str = ""  # where it was loaded from, for repr and error messages
    missing: list[str] = dataclasses.field(default_factory=list)  # params the checkpoint lacked
    # A fine-tuned checkpoint's task (name, kind, labels, num_choices, max_seq_length, ...); params are then
    # the task head's ({"bert", "classifier"}).
    task: TaskRecord | None = None
    vocab_path: str | None = None  # the tokenizer's file (vocab.txt, the SentencePiece .model, BPE's tokenizer.json)
    # None (float params), or the quantisation mode (bertjax/compression/quantize.py): params then hold
    # each dense kernel as {"qvalue" int8, "scale" float32} (int4: {"qpacked" uint8, "scale"}) and each
    # embedding table as {"qrows" int8, "row_scale" float32}, and every network runs through `network`.
    quantize: str | None = None
    # How it makes sentence embeddings (pooling, Dense, Normalize, prompts; bertjax/models/pooling.py), or
    # None; params then hold the Dense layer as "dense" where it has one.
    embedding: EmbeddingRecord | None = None
    _forward: Callable = dataclasses.field(init=False, repr=False)
    # The encoder's params copied to each of several devices, per (devices, with the Dense layer) (embed's
    # data parallel).
    _replicas: dict = dataclasses.field(init=False, repr=False, default_factory=dict)

    def __repr__(self) -> str:
        c = self.config
        return (f"LoadedBert({self.source or 'in memory'}: {c.num_layers} layers, hidden {c.hidden_size}, "
                f"{c.num_heads} heads, vocabulary {c.vocab_size}, {self.num_params():,} parameters, {c.dtype}"
                + (f", {self.quantize}" if self.quantize else "")
                + (f", fine-tuned for {self.task.name}" if self.task else "") + ")")

    def __post_init__(self):
        # On the default device once, rather than copied from the host at every call.
        self.params = jax.device_put(self.params)
        module = self.network(bert_model.BertModel(self.config))

        def forward(bert_params, input_ids, segment_ids, input_mask):
            return module.apply(
                {"params": bert_params}, input_ids, segment_ids, input_mask,
                deterministic=True, output_hidden_states=True,
            )

        # Compiled once per padded length S; a notebook typically sees few distinct lengths.
        self._forward = jax.jit(forward)
        pretraining = self.network(bert_model.BertForPreTraining(self.config))
        self._mlm = jax.jit(lambda params, ids, segments, mask, positions: pretraining.apply(
            {"params": params}, ids, segments, mask, positions, deterministic=True)["mlm_logits"])
        if self.task is not None:
            kind = self.task.kind
            num_labels = kinds.get(kind).num_labels(self.task.labels)
            net = self.network(heads.network(kind, self.config, num_labels,
                                             feature_based=self.task.feature_based))
            self._task_logits = jax.jit(lambda params, ids, segments, mask: net.apply(
                {"params": params}, ids, segments, mask, deterministic=True))

    def network(self, module):
        """A flax module of this model's family, as it runs with these params: itself for float params,
        with int8 kernels for a quantised model (its `apply` takes these params as they are)."""
        return quantization.network(module, self.quantize)

    def num_params(self) -> int:
        """The network's parameter count (a quantised kernel counts its int8 values, not its scales)."""
        return quantization.parameter_count(self.params)

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict[str, np.ndarray]:
        """[CLS] text [SEP] per text (the tokenizer's template), truncated to max_length (default the
        positions the model has) and right-padded to the longest in the batch -> input_ids, segment_ids,
        input_mask, each [B, S]."""
        if isinstance(texts, str):
            texts = [texts]
        if not texts:
            raise ValueError("encode needs at least one text")
        tok = self.tokenizer
        most = self.config.max_position_embeddings - self.config.position_offset  # RoBERTa's start after padding_idx
        limit = most if max_length is None else max_length
        added = tok.template.added()
        if not added <= limit <= most:
            raise ValueError(f"max_length={limit} must be between {added} (room for the special tokens) and the "
                             f"model's {most} positions")
        rows = [tok.template.single(ids[: limit - added]) for ids in tok.encode(list(texts))]
        seq_len = max(len(row) for row in rows)
        input_ids = np.full((len(rows), seq_len), tok.pad_id, np.int32)  # [B, S]
        input_mask = np.zeros((len(rows), seq_len), np.int32)  # [B, S], 1 at real tokens
        for b, row in enumerate(rows):
            input_ids[b, : len(row)] = row
            input_mask[b, : len(row)] = 1
        # One segment: BERT's segment 0 is the first (here the only) sentence.
        return {"input_ids": input_ids, "segment_ids": np.zeros_like(input_ids), "input_mask": input_mask}

    def encode(self, texts: list[str], max_length: int | None = None) -> dict:
        """Encoder outputs for a batch of texts, as float32 numpy arrays.

        Returns sequence_output [B, S, H], pooled_output [B, H], hidden_states (L+1 arrays [B, S, H],
        the embedding output first), and the input_ids and input_mask [B, S] that were fed in.
        Positions where input_mask is 0 are padding: their outputs carry no meaning.
        """
        batch = self.tokenize(texts, max_length)
        out = self._forward(self.params["bert"], batch["input_ids"], batch["segment_ids"], batch["input_mask"])
        out = jax.device_get(out)
        as_np = lambda x: np.asarray(x, np.float32)  # noqa: E731  (bfloat16 compute -> float32 for numpy users)
        return {
            "sequence_output": as_np(out["sequence_output"]),
            "pooled_output": as_np(out["pooled_output"]),
            "hidden_states": [as_np(h) for h in out["hidden_states"]],
            "input_ids": batch["input_ids"],
            "input_mask": batch["input_mask"],
        }

    def embed(self, texts: list[str], prompt_name: str | None = None, prompt: str | None = None,
              batch_size: int = 32, normalize: bool | None = None, pooling=None, task: str | None = None,
              devices: list | None = None) -> np.ndarray:
        """Sentence embeddings float32 [N, D], in the order of `texts`, as the model's embedding record
        says (sentence-transformers' encode computes the same from the directory it was loaded from): its
        pooling, Dense layer, normalisation and prompts. A model without one (a pretrained or fine-tuned
        workdir, a plain Hugging Face directory) embeds with mean pooling and no normalisation.

        batch_size: rows per batch at most (on CPUs fewer where rows are wide: embeddings.TOKENS_PER_BATCH).
        prompt_name: one of the model's prompts (default: its default_prompt_name, if any); prompt: the
        text itself ("" for none), over prompt_name. pooling: modes of bertjax/models/pooling.py (one, or
        several concatenated) in place of the model's; normalize: L2-normalise (True) or not (False).
        task="query": the texts are queries, as sentence-transformers' encode_query embeds them (the "query"
        prompt where none is given, cut to the query length the model was trained with; a SPLADE model with a
        static query side embeds them through its table, from their tokens alone). A SPLADE model gives its
        vectors over the vocabulary [N, V], dense (4 V bytes a text), scored by dot product. devices: those
        each batch's rows are split over (default: every local device; on a CPU, XLA_FLAGS=
        --xla_force_host_platform_device_count=<cores> set before Python starts makes one device a core)."""
        texts = _texts_to_embed(texts, batch_size, "embed")
        limit = self.config.max_position_embeddings - self.config.position_offset
        settings = embeddings.resolve(self.embedding, limit, prompt_name=prompt_name, prompt=prompt,
                                     pooling_modes=pooling, normalize=normalize, task=task,
                                     model=embeddings.representation(self.embedding))
        tok = self.tokenizer
        body = settings.max_length - tok.template.added()
        encoded = tok.encode([settings.prompt + t for t in texts])
        if settings.representation == embeddings.STATIC:  # a query's tokens alone, as SparseStaticEmbedding's
            rows = [ids[:settings.max_length] for ids in encoded]
        else:
            rows = [tok.template.single(ids[:body]) for ids in encoded]
        skipped = 0
        if settings.prompt and not settings.include_prompt:  # [CLS] and the prompt's tokens are not pooled
            skipped = len(tok.template.prefix) + len(tok.encode([settings.prompt])[0])
        forward = self._embedder(settings, jax.local_devices() if devices is None else list(devices))
        return embeddings.embed_rows(forward, rows, np.full(len(rows), skipped, np.int32), batch_size,
                                    settings.max_length, tok.pad_id,
                                    embeddings.TOKENS_PER_BATCH.get(jax.default_backend()))

    def embed_tokens(self, texts: list[str], task: str | None = None, batch_size: int = 32,
                     devices: list | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A ColBERT model's token vectors, as sentence-transformers' MultiVectorEncoder computes them
        (task="query": encode_query; "document" or None: encode_document): (vectors float32 [N, L, D], zero
        where the mask is False; mask bool [N, L], the tokens MaxSim scores), in the order of `texts`.
        L is the model's query length for queries (its [MASK] expansion scored) and its document length for
        documents (a document's skiplist tokens and padding not scored), the same at every call, so that
        calls concatenate. Score them with bertjax.models.multivector.maxsim, search a store of them with
        bertjax.tasks.multivector_search. batch_size and devices: as embed's."""
        texts = _texts_to_embed(texts, batch_size, "embed_tokens")
        limit = self.config.max_position_embeddings - self.config.position_offset
        text_settings, kind, settings = embeddings.multivector_settings(self.embedding, limit, task)
        if self.quantize:
            raise ValueError(f"embed_tokens runs ColBERT with float weights: load {self.source or 'the model'} "
                             "without quantize")
        rows = multivector_texts.featurize(self.tokenizer, list(texts), kind, text_settings)
        forward = self._embedder(settings, jax.local_devices() if devices is None else list(devices))
        vectors = embeddings.embed_token_rows(forward, rows, batch_size,
                                              embeddings.TOKENS_PER_BATCH.get(jax.default_backend()))
        return vectors, rows["score_mask"] > 0

    def _embedder(self, settings: embeddings.Settings, devices: list) -> Callable[[dict], jax.Array]:
        """batch -> embeddings (on the devices), with this model's params. Over several devices each
        batch's rows are split between them (data parallel; the params copied to each once and kept), the
        rows padded to a multiple of their number with copies of the last, whose outputs are dropped."""
        if not devices:
            raise ValueError("embed: devices=[] names no device to embed on")
        dense = settings.dense
        if settings.representation == embeddings.DENSE:
            apply = _embedding_network(self.config, settings.modes, settings.normalize, self.quantize, None if dense
                                       is None else (dense["features"], dense["bias"], dense["activation"]))
            names = ("bert", "dense") if dense else ("bert",)
        elif settings.representation == embeddings.COLBERT:  # token vectors [R, L, D]
            apply = _colbert_network(self.config, int(self.params[multivector.PROJECTION]["kernel"].shape[-1]))
            names = ("bert", multivector.PROJECTION)
        else:  # SPLADE: vectors [R, V] over the vocabulary, held dense
            static = settings.representation == embeddings.STATIC
            apply = _splade_network(self.config, self.quantize, static)
            names = ("static_query",) if static else ("bert", "mlm_head")
        encoder = lambda p: {name: p[name] for name in names}  # noqa: E731
        if len(devices) == 1:  # the params as they are now, where they are (a copy only to another device)
            params = jax.device_put(encoder(self.params), devices[0])
            return lambda batch: apply(params, jax.device_put(batch, devices[0]))
        mesh = jax.sharding.Mesh(np.array(devices), ("rows",))
        key = (tuple(devices), names)
        if key not in self._replicas:
            self._replicas[key] = jax.device_put(encoder(self.params),
                                                 jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
        params = self._replicas[key]
        rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))

        def forward(batch):
            count = len(batch["input_ids"])
            extra = -count % len(devices)
            if extra:
                batch = {k: np.concatenate([v, np.repeat(v[-1:], extra, axis=0)]) for k, v in batch.items()}
            out = apply(params, jax.device_put(batch, rows))
            return out[:count] if extra else out

        return forward

    def features(self, texts: list[str], layers=(-1, -2, -3, -4), combine: str = "concat",
                 max_length: int | None = None) -> dict:
        """The paper's feature-based approach: per-token features from the chosen encoder layers
        (negative counts from the last; 0 is the embedding output), combined by "concat"
        ([B, S, H * len(layers)], the paper's best: the last four concatenated), "sum" or "mean"
        ([B, S, H]); with the input_mask [B, S] that marks real tokens."""
        if combine not in ("concat", "sum", "mean"):
            raise ValueError(f"combine={combine!r}: choose concat, sum or mean")
        out = self.encode(texts, max_length)
        hidden = out["hidden_states"]
        try:
            chosen = [hidden[layer] for layer in layers]
        except IndexError:
            raise ValueError(f"layers={tuple(layers)}: the model has hidden states 0..{len(hidden) - 1} "
                             f"(0 the embeddings), or -1..-{len(hidden)} from the last") from None
        if combine == "concat":
            features = np.concatenate(chosen, axis=-1)
        else:
            features = np.sum(chosen, axis=0) / (len(chosen) if combine == "mean" else 1)
        return {"features": features, "input_mask": out["input_mask"], "input_ids": out["input_ids"]}

    def fill_mask(self, texts, top_k: int = 5):
        """The masked-LM head's guesses for each mask token ("[MASK]", RoBERTa's "<mask>") written in the
        text, best first, as Hugging Face's fill-mask pipeline gives them: {"score", "token", "token_str",
        "sequence"}. One text with one mask -> a list of top_k guesses; otherwise one such list per mask
        (per text)."""
        if "mlm_head" not in self.params:
            raise ValueError(f"{self.source or 'this model'} has no masked-LM head (a task checkpoint, or a "
                             f"directory without one): fill_mask needs a pretraining checkpoint")
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        tok = self.tokenizer
        rows, positions = [], []
        for text in texts:
            body, where = tok.encode_with_masks(text)
            if not where:
                raise ValueError(f"fill_mask: no {tok.mask_token} in {text!r}")
            ids = tok.template.single(body)
            where = [len(tok.template.prefix) + w for w in where]
            if len(ids) > self.config.max_position_embeddings - self.config.position_offset:
                raise ValueError(f"fill_mask: {len(ids)} tokens, more than the model's "
                                 f"{self.config.max_position_embeddings - self.config.position_offset}")
            rows.append(ids)
            positions.append(where)
        seq_len, num_masks = max(map(len, rows)), max(map(len, positions))
        input_ids = np.full((len(rows), seq_len), tok.pad_id, np.int32)  # [B, S]
        input_mask = np.zeros_like(input_ids)
        masked = np.zeros((len(rows), num_masks), np.int32)  # [B, P]
        for b, (row, where) in enumerate(zip(rows, positions)):
            input_ids[b, :len(row)], input_mask[b, :len(row)] = row, 1
            masked[b, :len(where)] = where
        logits = self._mlm(self.params, input_ids, np.zeros_like(input_ids), input_mask, masked)  # [B, P, V]
        # An embedding table larger than the vocabulary (model.vocab_size rounded up) has rows that are no
        # token: they are never a guess.
        logits = np.asarray(logits, np.float32)[..., :tok.vocab_size]
        probs = np.asarray(jax.nn.softmax(logits, axis=-1))
        results = []
        for b, where in enumerate(positions):
            per_mask = []
            for p, position in enumerate(where):
                best = np.argsort(-probs[b, p], kind="stable")[:top_k]
                guesses = []
                for token in best:
                    filled = list(rows[b])
                    filled[position] = int(token)
                    guesses.append({"score": float(probs[b, p, token]), "token": int(token),
                                    "token_str": tok.convert_ids_to_tokens([int(token)])[0],
                                    "sequence": tok.decode(filled[len(tok.template.prefix):-len(tok.template.suffix)])})
                per_mask.append(guesses)
            results.append(per_mask)
        if single and len(results[0]) == 1:
            return results[0][0]
        return results[0] if single else results

    def predict(self, texts=None, text_pairs=None, choices=None, *, questions=None, contexts=None) -> list[dict]:
        """A fine-tuned checkpoint's predictions, one dict per input.

        classification   texts (and text_pairs) -> {"label", "score", "scores" {label: probability}}
        regression       texts (and text_pairs) -> {"score"}
        multiple choice  texts are the contexts, choices one list per context -> {"label" (the choice's
                         index), "scores" [per choice]}
        span QA          questions=[...], contexts=[...] -> {"answer", "start", "end" (its characters in
                         the context), "score" (its probability among the n-best)}; "" where a v2.0
                         model finds no answer (at the threshold tuned on its dev set)
        tagging          texts: sentences, each a list of words or a string split at whitespace ->
                         {"tags" [(word, tag)], "entities" [{"type", "start", "end", "text"}]}, entity
                         words [start, end)
        """
        if self.task is None:
            raise ValueError(f"{self.source or 'this model'} is not a fine-tuned task checkpoint: predict needs "
                             f"one written by python -m bertjax.finetune")
        return kinds.get(self.task.kind).predict(self, texts, text_pairs, choices, questions=questions,
                                                    contexts=contexts)

    def task_logits(self, features: dict, batch_size: int = 32) -> np.ndarray:
        """The task head's logits (float32) for every row of fixed-shape features, in batches: what a
        kind's predict (bertjax/tasks/kinds/) reads."""
        out = []
        for start in range(0, len(features["input_ids"]), batch_size):
            part = {k: features[k][start:start + batch_size] for k in ("input_ids", "segment_ids", "input_mask")}
            out.append(np.asarray(self._task_logits(self.params, part["input_ids"], part["segment_ids"],
                                                     part["input_mask"]), np.float32))
        return np.concatenate(out)


@dataclasses.dataclass
class LoadedBiLSTM(LoadedBert):
    """A BiLSTM student of task distillation (bertjax/models/bilstm.py): the teacher's tokenizer and the task's
    record, its own network and params. `predict` and `task_logits` as a fine-tuned BERT's; it has no encoder, so
    encode, embed, embed_tokens, features and fill_mask say so. config: the teacher's BertConfig, whose
    vocabulary and positions the student's rows share."""

    student: bilstm.BiLSTMConfig | None = None

    def __post_init__(self):
        self.params = jax.device_put(self.params)
        net = bilstm.BiLSTMClassifier(self.student)
        self._task_logits = jax.jit(lambda params, ids, segments, mask: net.apply(
            {"params": params}, ids, segments, mask, deterministic=True))

    def __repr__(self) -> str:
        s = self.student
        return (f"LoadedBiLSTM({self.source}: a BiLSTM student, embeddings {s.embedding_size}, {s.hidden_size} units "
                f"each way{', sentence pairs' if s.pairs else ''}, MLP {s.mlp_size}, vocabulary {s.vocab_size}, "
                f"{self.num_params():,} parameters, fine-tuned for {self.task.name})")

    def _no_encoder(self, what: str):
        raise ValueError(f"{what}: {self.source} is a BiLSTM student (task distillation) with no encoder; it has "
                         "predict and task_logits")

    def encode(self, *args, **kwargs):
        self._no_encoder("encode")

    def embed(self, *args, **kwargs):
        self._no_encoder("embed")

    def embed_tokens(self, *args, **kwargs):
        self._no_encoder("embed_tokens")

    def features(self, *args, **kwargs):
        self._no_encoder("features")

    def fill_mask(self, *args, **kwargs):
        self._no_encoder("fill_mask")


def _load_bilstm(start: init_from.Start, student: bilstm.BiLSTMConfig, mode: str | None) -> LoadedBiLSTM:
    """A BiLSTM student's workdir, checkpoint or params export, its params as stored (no encoder layout)."""
    if mode is not None:
        raise ValueError(f"bertjax.load: {start.path} is a BiLSTM student (task distillation), which is not "
                         "quantised: load it without quantize")
    if start.kind == init_from.BERTJAX:
        params, _ = checkpoint.restore_params(start.checkpoint)
        params = jax.tree_util.tree_map(np.asarray, jax.device_get(params))
    else:
        with (epath.Path(start.path) / saved_models.PARAMS_FILE).open("rb") as f:
            params = traverse_util.unflatten_dict(dict(np.load(f)), sep="/")
    return LoadedBiLSTM(start.config, params, _make_tokenizer(start.tokenizer), source=start.checkpoint or start.path,
                        task=start.task, vocab_path=start.tokenizer.vocab_path, student=student)


def _texts_to_embed(texts, batch_size: int, what: str) -> list[str]:
    """embed's and embed_tokens' texts as a list (one string: a list of it), or one line for no text or no batch."""
    texts = [texts] if isinstance(texts, str) else texts
    if not texts:
        raise ValueError(f"{what} needs at least one text")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: {what} needs at least 1")
    return texts


@functools.cache
def _embedding_network(config: BertConfig, modes: tuple, normalize: bool, quantize: str | None, dense: tuple | None):
    """The jitted SentenceEmbedder (params, batch) -> embeddings, one per network: models of the same
    config (loaded twice, or exported and loaded back) share what it compiles for each shape."""
    features, bias, activation = dense or (None, True, "tanh")
    net = quantization.network(pooling.SentenceEmbedder(config, modes=modes, dense_features=features, dense_bias=bias,
                                                        dense_activation=activation, normalize=normalize), quantize)
    return jax.jit(lambda params, batch: net.apply({"params": params}, **batch, deterministic=True))


@functools.cache
def _splade_network(config: BertConfig, quantize: str | None, static: bool):
    """The jitted SpladeEncoder (params, batch) -> vectors over the vocabulary: SPLADE's, or (static) the
    static query table's."""
    net = quantization.network(sparse.SpladeEncoder(config, static_queries=static), quantize)
    return jax.jit(lambda params, batch: net.apply({"params": params}, **batch, deterministic=True, static=static))


@functools.cache
def _colbert_network(config: BertConfig, dim: int):
    """The jitted ColbertEncoder (params, batch) -> token vectors [R, L, D], zero where score_mask is 0."""
    net = multivector.ColbertEncoder(config, dim=dim)
    return jax.jit(lambda params, batch: net.apply({"params": params}, **batch, deterministic=True)[0])


def _quantized(config: BertConfig, params: dict, task, embedding: EmbeddingRecord | None, mode: str):
    """quantize_model's int8 params, and a sentence embedder's Dense layer (params["dense"]) as int8 too."""
    dense = params.get("dense")
    config, stored = quantization.quantize_model(config, {k: v for k, v in params.items() if k != "dense"}, task, mode)
    if dense is None or embedding is None or embedding.dense is None:
        return config, stored
    net = pooling.SentenceEmbedder(config, modes=embedding.modes, dense_features=embedding.dense["features"],
                                   dense_bias=embedding.dense["bias"], dense_activation=embedding.dense["activation"])
    batch = bert_model.dummy_batch(1, 2, 1)
    inputs = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    return config, {**stored, "dense": quantization.quantize(net, {"dense": dense}, inputs, mode)["dense"]}


def load(path: str | os.PathLike, dtype: str = "float32", quantize: str | None = None) -> LoadedBert:
    """Loads a BERT for inference: a bertjax training or fine-tuning workdir (a fine-tuning workdir's
    best dev checkpoint), its checkpoints/ or one step's directory, a params export, or a Hugging Face
    directory of any family (BERT, RoBERTa, ALBERT, ModernBERT), or a sentence-transformers directory
    around one (its pooling, Dense, Normalize and prompts then what `embed` computes). `dtype` is the
    compute dtype ("bfloat16" on accelerators); the params stay in float32. quantize: "int8" (or
    "int8-weights", "int8-dynamic"; group-wise "int4-g128", "int8-g128", ...: bertjax/compression/quantize.py)
    quantises every dense layer's kernel on load; a quantised params export is so already (quantize then
    picks the mode its int8 weights run in; by default the one it was exported with). A BiLSTM student of task
    distillation (its workdir or params export) loads as a LoadedBiLSTM."""
    mode = quantization.resolve(quantize)
    path = str(path) if files.is_remote(str(path)) else str(Path(path).expanduser())
    if not epath.Path(path).exists():
        raise ValueError(f"bertjax.load: {path} does not exist")
    # mlm_loss="logits": fill_mask reads the masked-LM logits, however the loss was computed in training. No
    # attention dropout (nothing here trains), so that auto may attend blockwise on long rows on a CPU.
    overrides = dict(dtype=dtype, attention_impl="auto", word_embedding="auto", remat_policy="none", mlm_loss="logits",
                     attention_dropout_rate=0.0)
    if init_from.kind_of(path) is None:
        raise ValueError(f"bertjax.load: {path} is not a model directory it can read: expected a bertjax training "
                         f"or fine-tuning workdir, its checkpoints/ (or best/) directory or one step's directory; "
                         f"a params export (params.npz, config.json); or a Hugging Face BERT directory of any "
                         f"family (config.json, model.safetensors / model.safetensors.index.json / "
                         f"pytorch_model.bin, and its tokenizer's files); or a sentence-transformers directory "
                         f"(modules.json)")
    start = init_from.resolve(path, "bertjax.load")
    student = bilstm.from_record(start.meta.distill) if start.meta is not None else None
    if student is not None:  # a BiLSTM student: its own network, no BERT to build
        return _load_bilstm(start, student, mode)
    # How it was computed in training (cuDNN attention on a GPU, say) is chosen anew for this machine.
    model = init_from.load(start, model_overrides=overrides, quantized=True)
    stored = model.meta.quantize if model.meta is not None else None
    if mode and stored and not quantization.same_weights(stored, mode):
        raise ValueError(f"bertjax.load: {path} was exported as {stored}, whose weights do not run as {mode}: load it "
                         f"with quantize={stored!r} or without quantize")
    mode = mode or stored  # a quantised params export runs in the mode it was exported with
    if model.tokenizer is None:
        raise ValueError(f"{path} was trained on synthetic data and has no tokenizer: load it with "
                         f"bertjax.training.checkpoint.restore_params instead")
    config, params = model.config, model.params
    if model.st_dense is not None:  # a sentence-transformers directory's Dense layer, as SentenceEmbedder names it
        params = {**params, "dense": model.st_dense}
    if mode is not None and not quantization.is_stored(params):
        if mode == quantization.MIXED:
            raise ValueError(f"bertjax.load: quantize='mixed' is a plan chosen per layer on a dev set: make it with "
                             f"python -m bertjax.export --from={path} --quantize=mixed --size_budget=B --dev=FILE")
        config, params = _quantized(config, params, model.task, model.embedding, mode)
    return LoadedBert(config, params, _make_tokenizer(model.tokenizer), source=model.source,
                      missing=model.missing, task=model.task, vocab_path=model.tokenizer.vocab_path, quantize=mode,
                      embedding=model.embedding)

