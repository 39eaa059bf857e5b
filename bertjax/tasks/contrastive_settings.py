"""The contrastive kind's settings: config.contrastive (and data's two lengths) as one typed record, checked
once, with what follows from them: the representation (dense, SPLADE, ColBERT) and what each cannot do, the
loss's keywords, the network heads.network builds, and the embedding record a checkpoint keeps. The kind
(bertjax/tasks/kinds/contrastive.py), its step (bertjax/tasks/contrastive_steps.py) and bertjax.load's
embeddings (bertjax/embeddings.py) read them from here.
"""

import dataclasses

from bertjax.models import contrastive_losses, multivector, pooling
from bertjax.tasks import multivector_texts
from bertjax.training.checkpoint_meta import EmbeddingRecord

DENSE, SPLADE, STATIC, COLBERT = "dense", "splade", "static", "colbert"
REPRESENTATIONS = (DENSE, SPLADE, COLBERT)  # contrastive.representation
SPLADE_QUERIES = (SPLADE, STATIC)  # contrastive.splade_query: the encoder's SPLADE vector, or the static table
SPLADE_LOSSES = ("mnrl", "margin_mse", "kl")
# ColBERT's losses (sentence-transformers' multi-vector ones, bertjax/models/multivector_losses.py) by
# contrastive.loss's name.
COLBERT_LOSSES = {"mnrl": "mnrl", "margin_mse": "margin_mse", "kl": "distill_kl"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The contrastive section of a config (configs/finetune/contrastive.py), typed and checked once."""

    loss: str = "mnrl"
    scale: float = 20.0
    symmetric: bool = False
    matryoshka_dims: tuple = ()
    matryoshka_weights: tuple = ()
    pooling: tuple = ("mean",)
    normalize: bool = True
    dense_features: int | None = None
    dense_activation: str = "tanh"
    query_prompt: str = ""
    passage_prompt: str = ""
    max_query_length: int = 32
    max_seq_length: int = 128
    max_negatives: int = 1
    include_prompt: bool = True  # False: a prompt's tokens (and [CLS]) are left out of pooling
    teacher: str = ""  # distill_mse: the model whose embeddings the student learns (any path bertjax.load reads)
    kl_temperature: float = 2.0  # kl: both softmaxes' temperature
    # SPLADE (bertjax/models/sparse.py): vectors over the vocabulary from the model's masked-LM head
    representation: str = DENSE  # dense | splade
    splade_query: str = SPLADE  # static: queries through a learned per-token weight table (inference-free)
    splade_scale: float = 1.0  # mnrl's scale on dot products (scale is the dense cosine's)
    splade_lambda_query: float = 5e-5
    splade_lambda_document: float = 3e-5
    splade_warmup_fraction: float = 1 / 3  # the lambdas grow quadratically over this share of the steps
    splade_chunk_rows: int = 8  # rows projected to the vocabulary at a time
    # ColBERT (bertjax/models/multivector.py): a vector per token, scored by MaxSim; the texts' rows as
    # bertjax/tasks/multivector_texts.py makes them (data.max_query_length and max_seq_length are not read)
    colbert_dim: int = multivector.DEFAULT_DIM  # the projection's width
    colbert_markers: str = "prompt"  # prompt | token | none
    colbert_query_length: int = 32  # every query exactly this long ([MASK] expansion) or cut to it
    colbert_document_length: int = 180  # a document's most tokens
    colbert_expansion: bool = True  # queries padded to colbert_query_length with scored [MASK]s
    colbert_attend_expansion: bool = False  # the encoder attends to those [MASK]s
    colbert_skiplist: tuple = multivector_texts.PUNCTUATION  # words whose tokens a document does not score
    colbert_scale: float = 1.0  # mnrl's scale on MaxSim (scale is the dense cosine's)

    @property
    def scored(self) -> bool:
        return self.loss in contrastive_losses.SCORED

    @property
    def sparse(self) -> bool:
        return self.representation == SPLADE

    @property
    def colbert(self) -> bool:
        return self.representation == COLBERT

    def multivector_texts(self) -> multivector_texts.MultiVectorTexts:
        """ColBERT's text settings: what featurize makes of queries and documents, and the record keeps."""
        return multivector_texts.MultiVectorTexts(
            markers=self.colbert_markers, query_length=int(self.colbert_query_length),
            document_length=int(self.colbert_document_length), query_expansion=bool(self.colbert_expansion),
            attend_expansion=bool(self.colbert_attend_expansion), skiplist=tuple(self.colbert_skiplist))

    @property
    def static_queries(self) -> bool:
        return self.sparse and self.splade_query == STATIC

    @property
    def distill(self) -> bool:
        return self.loss == contrastive_losses.DISTILL

    def loss_settings(self) -> dict:
        """contrastive_losses.embedding_loss's keywords (SPLADE: on dot products, with its regularizer; the
        step adds the warmup's regularizer_weight); ColBERT: multivector_losses.embedding_loss's."""
        if self.colbert:
            return dict(loss=COLBERT_LOSSES[self.loss], scale=float(self.colbert_scale),
                        temperature=float(self.kl_temperature))
        out = dict(loss=self.loss, scale=float(self.scale), symmetric=bool(self.symmetric),
                   matryoshka_dims=tuple(self.matryoshka_dims), matryoshka_weights=tuple(self.matryoshka_weights),
                   temperature=float(self.kl_temperature))
        if self.sparse:
            out.update(scale=float(self.splade_scale), similarity="dot", lambda_query=float(self.splade_lambda_query),
                       lambda_document=float(self.splade_lambda_document))
        return out

    def width(self, hidden_size: int) -> int:
        """The embeddings' width on an encoder of hidden_size: the Dense projection's, else the pooled modes'
        (ColBERT: each token vector's)."""
        if self.colbert:
            return int(self.colbert_dim)
        return self.dense_features or hidden_size * len(self.pooling)

    def network(self) -> dict:
        """heads.network's embedding: pooling.SentenceEmbedder's settings, SPLADE's (sparse.SpladeEncoder) or
        ColBERT's (multivector.ColbertEncoder)."""
        if self.colbert:
            return dict(representation=COLBERT, dim=int(self.colbert_dim))
        if self.sparse:
            return dict(representation=SPLADE, static_queries=self.static_queries,
                        chunk_rows=int(self.splade_chunk_rows))
        return dict(modes=tuple(self.pooling), dense_features=self.dense_features,
                    dense_activation=self.dense_activation, normalize=bool(self.normalize))

    def embedding_record(self) -> EmbeddingRecord:
        """What a checkpoint records for embedding texts as this model was trained to (ColBERT: its text
        settings and width, in multivector; no pooling, prompts or normalisation of a whole text)."""
        if self.colbert:
            texts = self.multivector_texts()
            return EmbeddingRecord(normalize=False, max_seq_length=texts.document_length,
                                   max_query_length=texts.query_length, similarity="maxsim", representation=COLBERT,
                                   multivector={**dataclasses.asdict(texts), "dim": int(self.colbert_dim)})
        prompts = {name: text for name, text in (("query", self.query_prompt), ("passage", self.passage_prompt))
                   if text}
        dense = None if self.dense_features is None else {"features": int(self.dense_features), "bias": True,
                                                          "activation": self.dense_activation}
        # Queries of pairs are cut to max_query_length (sentence-transformers' Transformer.query_length);
        # the texts of scored pairs and of distill_mse to max_seq_length.
        query_length = None if self.scored or self.distill else int(self.max_query_length)
        # SPLADE scores by dot product and has no pooling modes, Dense or normalisation of its own.
        return EmbeddingRecord(modes=tuple(self.pooling), normalize=bool(self.normalize) and not self.sparse,
                               dense=dense, prompts=prompts, include_prompt=bool(self.include_prompt),
                               max_seq_length=int(self.max_seq_length), max_query_length=query_length,
                               similarity="dot" if self.sparse else "cosine", representation=self.representation,
                               splade_query=self.splade_query if self.sparse else SPLADE)

    def skip(self, tokenizer, prompt: str) -> int:
        """The leading tokens of a text after `prompt` left out of pooling: [CLS] and the prompt's tokens
        where include_prompt is False and there is a prompt (sentence-transformers' prompt_length), else 0."""
        if self.include_prompt or not prompt:
            return 0
        return 1 + len(tokenizer.encode([prompt])[0])


def settings_from_config(config) -> Settings:
    """config.contrastive and data's max lengths as Settings, each value checked in one line."""
    section = dict(config.get("contrastive") or {})
    known = {f.name for f in dataclasses.fields(Settings)} - {"max_query_length", "max_seq_length"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"contrastive.{unknown[0]} is not a setting: choose from {', '.join(sorted(known))}")
    s = Settings(**section, max_query_length=int(config.data.get("max_query_length", 32)),
                 max_seq_length=int(config.data.max_seq_length))
    s = dataclasses.replace(s, pooling=pooling.check_modes(s.pooling), matryoshka_dims=tuple(s.matryoshka_dims or ()),
                            matryoshka_weights=tuple(float(w) for w in s.matryoshka_weights or ()))
    width = None if s.dense_features is None else int(s.dense_features)
    contrastive_losses.check_settings(s.loss, s.scale, s.matryoshka_dims, s.matryoshka_weights, width)
    if s.dense_activation not in pooling.ACTIVATIONS:
        raise ValueError(f"contrastive.dense_activation={s.dense_activation!r}: choose one of "
                         f"{', '.join(pooling.ACTIVATIONS)}")
    for key in ("max_query_length", "max_seq_length"):
        if getattr(s, key) < 3:
            raise ValueError(f"data.{key}={getattr(s, key)}: needs at least 3 ([CLS] a token [SEP])")
    if s.distill != bool(s.teacher):
        raise ValueError("contrastive.loss=distill_mse needs contrastive.teacher=PATH (a model bertjax.load reads)"
                         if s.distill else f"contrastive.teacher={s.teacher!r} is for contrastive.loss=distill_mse")
    if not isinstance(s.include_prompt, bool):
        raise ValueError(f"contrastive.include_prompt={s.include_prompt!r}: True (the prompt's tokens pooled) or False")
    if not isinstance(s.max_negatives, int) or s.max_negatives < 0:
        raise ValueError(f"contrastive.max_negatives={s.max_negatives!r}: a whole number, 0 for in-batch ones only")
    if s.loss in contrastive_losses.TEACHER and s.max_negatives < 1:
        raise ValueError(f"contrastive.loss={s.loss} compares each positive with hard negatives: set "
                         "contrastive.max_negatives to 1 or more")
    if not s.kl_temperature > 0:
        raise ValueError(f"contrastive.kl_temperature={s.kl_temperature}: must be positive (2.0 by default)")
    check_representation(s)
    return s


def check_representation(s: Settings) -> None:
    """contrastive.representation and, for SPLADE and ColBERT, their settings and what they cannot do, each in
    one line."""
    if s.representation not in REPRESENTATIONS:
        raise ValueError(f"contrastive.representation={s.representation!r}: choose one of {', '.join(REPRESENTATIONS)}")
    if s.splade_query not in SPLADE_QUERIES:
        raise ValueError(f"contrastive.splade_query={s.splade_query!r}: choose one of {', '.join(SPLADE_QUERIES)}")
    for prefix, representation in (("splade_", SPLADE), ("colbert_", COLBERT)):  # another representation's
        if s.representation != representation:
            _only_for(s, prefix, representation)
    if s.colbert:
        check_colbert(s)
    if not s.sparse:
        return
    if s.loss not in SPLADE_LOSSES:
        raise ValueError(f"contrastive.loss={s.loss} with contrastive.representation=splade: choose one of "
                         f"{', '.join(SPLADE_LOSSES)} (sentence-transformers' sparse losses on dot products)")
    _no_dense_settings(s, "SPLADE's vector is the max over every token of the vocabulary's log(1 + ReLU(logits))")
    for key in ("splade_lambda_query", "splade_lambda_document"):
        if not getattr(s, key) >= 0:
            raise ValueError(f"contrastive.{key}={getattr(s, key)}: a weight of at least 0")
    if not (s.splade_scale > 0 and 0 < s.splade_warmup_fraction <= 1):
        raise ValueError(f"contrastive.splade_scale={s.splade_scale}, splade_warmup_fraction="
                         f"{s.splade_warmup_fraction}: the scale must be positive and the fraction in (0, 1]")
    if not isinstance(s.splade_chunk_rows, int) or s.splade_chunk_rows < 1:
        raise ValueError(f"contrastive.splade_chunk_rows={s.splade_chunk_rows!r}: rows a chunk, at least 1")


def _only_for(s: Settings, prefix: str, representation: str) -> None:
    """One line for a setting of another representation (its name starts with `prefix`) changed from its
    default."""
    for field in dataclasses.fields(Settings):
        value = getattr(s, field.name)
        if field.name.startswith(prefix) and value != field.default:
            raise ValueError(f"contrastive.{field.name}={value} is for contrastive.representation={representation}: "
                             f"leave it at {field.default!r}, or set contrastive.representation={representation}")


def _no_dense_settings(s: Settings, reason: str, extra: tuple = ()) -> None:
    """One line for a dense embedder's setting (and those of `extra`) changed from its default under SPLADE or
    ColBERT, whose `reason` says why it has no such thing."""
    defaults = {field.name: field.default for field in dataclasses.fields(Settings)}
    for key in ("matryoshka_dims", "dense_features", "include_prompt") + extra:
        if getattr(s, key) != defaults[key]:
            raise ValueError(f"contrastive.{key}={getattr(s, key)!r} is for dense embeddings: {reason}; set it to "
                             f"{defaults[key]!r}")


def check_colbert(s: Settings) -> None:
    """ColBERT's settings, each mistake in one line. Packing (data.packing) and GradCache
    (train.contrastive_microbatch) both apply: bertjax/tasks/contrastive_batches.py packs its documents."""
    if s.loss not in COLBERT_LOSSES:
        raise ValueError(f"contrastive.loss={s.loss} with contrastive.representation=colbert: choose one of "
                         f"{', '.join(COLBERT_LOSSES)} (sentence-transformers' multi-vector losses on MaxSim)")
    _no_dense_settings(s, "ColBERT scores token vectors by MaxSim, query to document, and its markers "
                          "(contrastive.colbert_markers) are its prompts", extra=("symmetric", "query_prompt",
                                                                                  "passage_prompt"))
    if s.colbert_markers not in multivector_texts.MARKERS:
        raise ValueError(f"contrastive.colbert_markers={s.colbert_markers!r}: choose one of "
                         f"{', '.join(multivector_texts.MARKERS)} (prompt: \"[Q] \" and \"[D] \" before the text, "
                         "sentence-transformers' way; token: [unused0] and [unused1] after [CLS], Stanford ColBERT's)")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not whole(s.colbert_dim) or s.colbert_dim < 1:
        raise ValueError(f"contrastive.colbert_dim={s.colbert_dim!r}: the token vectors' width, a whole number "
                         f"(ColBERT's {multivector.DEFAULT_DIM})")
    for key in ("colbert_query_length", "colbert_document_length"):
        if not whole(getattr(s, key)) or getattr(s, key) < 3:
            raise ValueError(f"contrastive.{key}={getattr(s, key)!r}: a whole number of tokens, at least 3 ([CLS] a "
                             "token [SEP])")
    for key in ("colbert_expansion", "colbert_attend_expansion"):
        if not isinstance(getattr(s, key), bool):
            raise ValueError(f"contrastive.{key}={getattr(s, key)!r}: True or False")
    skiplist = s.colbert_skiplist
    if not isinstance(skiplist, (tuple, list)) or not all(isinstance(w, str) for w in skiplist):
        raise ValueError(f"contrastive.colbert_skiplist={skiplist!r}: a tuple of words (each a vocabulary token) "
                         "a document does not score, () for none")
    if not s.colbert_scale > 0:
        raise ValueError(f"contrastive.colbert_scale={s.colbert_scale}: must be positive (1 is sentence-transformers' "
                         "default for MaxSim)")
