"""Contrastive fine-tuning: a sentence embedder (bertjax/models/pooling.py), a SPLADE encoder
(bertjax/models/sparse.py: contrastive.representation=splade) or a ColBERT encoder (bertjax/models/multivector.py:
contrastive.representation=colbert) trained on pairs, its losses in bertjax/models/contrastive_losses.py
(ColBERT's: bertjax/models/multivector_losses.py), its settings in bertjax/tasks/contrastive_settings.py, its step
in bertjax/tasks/contrastive_steps.py.

Data: JSON lines of yours (data.train, data.validation), one row per line (blank lines skipped), the
fields decided by contrastive.loss:
  data field       required?                 meaning
  query            mnrl, margin_mse, kl: yes the query ("anchor", sentence-transformers' name, is read too)
  positive         mnrl, margin_mse, kl: yes its relevant passage (and a candidate for every other query)
  negatives        mnrl: no; margin_mse, kl: hard negatives, a list of texts or one text ("negative" is read
                   yes                       too); each row's first contrastive.max_negatives are candidates
  scores           margin_mse, kl: yes       the teacher's scores: the positive's, then each negative's (a list
                   (training file)           of 1 + len(negatives) numbers; dev files need none)
  text, text_pair  cosent, cosine_mse: both  the pair; distill_mse: text alone, the text the student embeds
  score            cosent, cosine_mse: yes   cosent: any range (only the order counts); cosine_mse: the
                                             target cosine, in [-1, 1] (STS-B's 0-5 divided by 5)
  target_text      distill_mse: no           the text contrastive.teacher embeds (e.g. a translation; default
                                             text); the run layer (bertjax/runs/task_data.py) adds the
                                             teacher's embeddings as the feature target
Every problem (a missing field, an empty text, an empty file) is one ValueError line naming file:line.
Example, a line of pairs.jsonl and the run that fine-tunes on it (scored pairs: --config.contrastive.loss=cosent):
  {"query": "sort a list", "positive": "sorted(xs) returns a sorted copy.", "negatives": ["A list keeps order."]}
  python -m bertjax.finetune --config=configs/finetune/contrastive.py --config.train.init_from=PATH \
      --config.data.train=pairs.jsonl --config.data.validation=dev_pairs.jsonl --workdir=DIR

Each text is tokenized alone as [CLS] text [SEP]: the query (or text) after contrastive.query_prompt, cut
to data.max_query_length tokens (scored pairs: data.max_seq_length); the passage (text_pair) and the
negatives after contrastive.passage_prompt, cut to data.max_seq_length. With contrastive.include_prompt=False
[CLS] and the prompt's tokens are left out of pooling (sentence-transformers' Pooling(include_prompt=False));
they are still encoded. SPLADE's static query side (contrastive.splade_query=static) reads a query's tokens
alone, no [CLS] or [SEP], the first data.max_query_length of them. ColBERT's rows are its own
(bertjax/tasks/multivector_texts.py: its markers, queries exactly contrastive.colbert_query_length long with
their [MASK] expansion, documents cut to colbert_document_length, the skiplist's tokens not scored); it reads
no prompt and neither data length. Training may pack these texts several to a row (data.packing:
bertjax/tasks/contrastive_batches.py); the features here are each text's own.

Dev sets: pairs are scored by retrieval inside the set, each dev query against every distinct dev
positive by cosine (SPLADE: by dot product, with document_similarity, the mean cosine of two documents' vectors,
and query_active_dims, document_active_dims: the mean non-zeros
of the queries' and of those positives' vectors; ColBERT: by MaxSim): mrr_at_10 (the reciprocal rank of its
positive, 0 below rank 10) and recall_at_1; a candidate scored equal to the positive ranks ahead of it, so
ties never flatter.
Scored pairs: spearman (and pearson) of the pair's cosine against its score. <split>_positive_ranks.tsv lists
each query's rank. Texts (distill_mse): mse (the loss), neg_mse (-mse, the main metric: higher is better, as
the best checkpoint is chosen) and teacher_cosine (the mean cosine of each text's embedding and its
teacher's); <split>_teacher_cosines.tsv lists each text's. Without a dev set (data.validation unset) a run
trains every step and its last step's model is the model, as sentence-transformers keeps its last without
an evaluator (bertjax/runs/finetuning.py).

Features (N pairs, G = the most negatives any row keeps, Sq / S query / passage length):
  query_ids, query_mask [N, Sq]; passage_ids, passage_mask [N, S]; score float32 [N] (nan: none)
  negative_ids, negative_mask [N, G, S], negative_present [N, G] (G > 0 only; a missing negative is an
  empty text, its prompt alone, with negative_present 0: no candidate); idx, example_weight [N]
  teacher_scores float32 [N, 1 + G] (margin_mse, kl: the training split's; 0 for a negative not there)
  query_skip, passage_skip int32 [N] (include_prompt=False only): the leading tokens of a query / of a
  passage or negative left out of pooling ([CLS] and the prompt's tokens; 0 without a prompt)
  ColBERT: query_score_mask [N, Sq], passage_score_mask [N, S], negative_score_mask [N, G, S]: the tokens MaxSim
  scores (query_mask leaves the [MASK] expansion out of attention unless colbert_attend_expansion)
Texts (distill_mse): query_ids, query_mask [N, S] (the text after contrastive.query_prompt, cut to
  data.max_seq_length), query_skip [N] as above; idx, example_weight [N]; target float32 [N, Dt] (added by
  the run layer)
"""

import dataclasses
import math

import jax
import numpy as np

from bertjax.models import contrastive_losses, multivector
from bertjax.tasks import contrastive_steps, features, metrics, multivector_texts, readers
from bertjax.tasks.contrastive_settings import Settings, settings_from_config
from bertjax.tasks.kinds.base import Kind, Scored, Split

MRR_CUTOFF = 10
RANK_BLOCK = 1024  # queries ranked at a time in the dev retrieval


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pair:
    """One row: a query (or text) and its positive (or text_pair), hard negatives, a score (scored pairs)."""

    idx: int
    query: str
    positive: str
    negatives: tuple = ()
    score: float | None = None
    scores: tuple = ()  # margin_mse, kl: the teacher's score of the positive, then of each negative


def _text(obj: dict, names: tuple, where: str) -> str:
    name = next((n for n in names if n in obj and obj[n] is not None), None)
    if name is None:
        raise ValueError(f"{where}: missing field {names[0]!r}" + (f" (or {names[1]!r})" if len(names) > 1 else ""))
    value = obj[name]
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {name!r} must be a string, got {str(value)[:60]}")
    if not value.strip():
        raise ValueError(f"{where}: field {name!r} is an empty text")
    return value


def _negatives(obj: dict, where: str) -> tuple:
    value = obj.get("negatives", obj.get("negative"))
    if value is None:
        return ()
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        raise ValueError(f"{where}: field 'negatives' must be a list of strings")
    if any(not t.strip() for t in listed):
        raise ValueError(f"{where}: field 'negatives' holds an empty text")
    return tuple(listed)


def _score(obj: dict, where: str, loss: str) -> float:
    value = obj.get("score")
    if value is None:
        raise ValueError(f"{where}: missing field 'score': contrastive.loss={loss} trains on scored pairs "
                         "{text, text_pair, score}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: score {str(value)[:60]} is not a number")
    if loss == "cosine_mse" and not -1.0 <= value <= 1.0:
        raise ValueError(f"{where}: score {value} is outside [-1, 1], the cosines contrastive.loss=cosine_mse "
                         "targets: rescale the scores (e.g. STS-B's 0-5 divided by 5)")
    return float(value)


def _teacher_scores(obj: dict, where: str, loss: str, negatives: tuple) -> tuple:
    """margin_mse, kl: the row's "scores", one number for the positive and one for each negative."""
    value = obj.get("scores")
    if not negatives:
        raise ValueError(f"{where}: contrastive.loss={loss} compares the positive with hard negatives: the row has "
                         "no 'negatives'")
    if value is None:
        raise ValueError(f"{where}: missing field 'scores': contrastive.loss={loss} trains on a teacher's scores "
                         "(a list: the positive's, then each negative's)")
    if (not isinstance(value, list) or len(value) != 1 + len(negatives)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise ValueError(f"{where}: field 'scores' must be {1 + len(negatives)} numbers (the positive's score, then "
                         f"one per negative), got {str(value)[:60]}")
    return tuple(float(v) for v in value)


def read_pairs(path: str, loss: str, teacher_scores: bool = False) -> list:
    """A JSON-lines file of pairs (or scored pairs, for the scored losses; texts for distill_mse, the
    teacher's text as the positive) -> Pairs, in file order. teacher_scores: each row's "scores" read too
    (margin_mse and kl train on them; their dev sets are scored by retrieval, without them)."""
    scored = loss in contrastive_losses.SCORED
    pairs = []
    for number, obj in readers.json_lines(path):
        where = f"{path}:{number}"
        if loss == contrastive_losses.DISTILL:  # the text, and the teacher's text as the positive
            text = _text(obj, ("text",), where)
            target = _text(obj, ("target_text",), where) if obj.get("target_text") is not None else text
            pairs.append(Pair(len(pairs), text, target))
        elif scored:
            pairs.append(Pair(len(pairs), _text(obj, ("text",), where), _text(obj, ("text_pair",), where),
                              score=_score(obj, where, loss)))
        else:
            negatives = _negatives(obj, where)
            scores = _teacher_scores(obj, where, loss, negatives) if teacher_scores else ()
            pairs.append(Pair(len(pairs), _text(obj, ("query", "anchor"), where),
                              _text(obj, ("positive",), where), negatives, scores=scores))
    return pairs


def read(task, split: str, path: str | None = None, data_dir: str | None = None, labeled: bool = True) -> list:
    """The user's JSON-lines file (there is no TFDS contrastive task)."""
    if not path:
        raise ValueError(f"task {task.name} reads the user's JSON-lines files: set data.{split} to a file")
    return read_pairs(path, task.contrastive_loss,
                      teacher_scores=split == "train" and task.contrastive_loss in contrastive_losses.TEACHER)


# --------------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------------


def _encoded(tokenizer, texts: list, length: int) -> tuple:
    """[CLS] text [SEP] (the tokenizer's template) for each text, cut and padded to `length`: ids, mask int32
    [N, length]."""
    special = dict(template=tokenizer.template, pad_id=tokenizer.pad_id)
    rows = [features.encode_pair(ids, None, length, **special) for ids in tokenizer.encode_arrays(texts)]
    return (np.stack([r["input_ids"] for r in rows]).astype(np.int32),
            np.stack([r["input_mask"] for r in rows]).astype(np.int32))


def _tokens(tokenizer, texts: list, length: int) -> tuple:
    """Each text's tokens without [CLS] and [SEP] (the static query side's), cut and padded to `length`: ids,
    mask int32 [N, length]."""
    ids = np.full([len(texts), length], tokenizer.pad_id, np.int32)
    mask = np.zeros([len(texts), length], np.int32)
    for n, row in enumerate(tokenizer.encode_arrays(texts)):
        kept = row[:length]
        ids[n, :len(kept)], mask[n, :len(kept)] = kept, 1
    return ids, mask


def _rows(tokenizer, s: Settings, role: str, texts: list) -> dict:
    """One role's texts (query, passage or negative) as rows: {role}_ids, {role}_mask [N, L]; ColBERT's also
    {role}_score_mask, the tokens MaxSim scores (bertjax/tasks/multivector_texts.py: markers, a query's [MASK]
    expansion, a document's skiplist)."""
    if s.colbert:
        kind = "query" if role == "query" else "document"
        rows = multivector_texts.featurize(tokenizer, texts, kind, s.multivector_texts())
        return {f"{role}_ids": rows["input_ids"], f"{role}_mask": rows["input_mask"],
                f"{role}_score_mask": rows["score_mask"]}
    if role == "query":  # the static query side reads a query's tokens alone, as SparseStaticEmbedding does
        encode = _tokens if s.static_queries else _encoded
        length, prompt = s.max_seq_length if s.scored else s.max_query_length, s.query_prompt
    else:
        encode, length, prompt = _encoded, s.max_seq_length, s.passage_prompt
    ids, mask = encode(tokenizer, [prompt + t for t in texts], length)
    return {f"{role}_ids": ids, f"{role}_mask": mask}


def featurize(task, examples: list, tokenizer, max_seq_length: int, settings: Settings | None = None) -> dict:
    """Pairs -> the features in the module docstring."""
    s = settings or Settings(max_seq_length=max_seq_length)
    if not examples:
        raise ValueError(f"task {task.name}: no pairs to featurize")
    skips = {} if s.include_prompt else {
        "query_skip": np.full(len(examples), s.skip(tokenizer, s.query_prompt), np.int32),
        "passage_skip": np.full(len(examples), s.skip(tokenizer, s.passage_prompt), np.int32)}
    if s.distill:  # each text alone; the run layer adds the teacher's embeddings (target)
        ids, mask = _encoded(tokenizer, [s.query_prompt + e.query for e in examples], s.max_seq_length)
        return {"query_ids": ids, "query_mask": mask, "idx": np.array([e.idx for e in examples], np.int32),
                "example_weight": np.ones(len(examples), np.float32),
                **{k: v for k, v in skips.items() if k == "query_skip"}}
    out = _rows(tokenizer, s, "query", [e.query for e in examples])
    out.update(_rows(tokenizer, s, "passage", [e.positive for e in examples]))
    g = min(max(len(e.negatives) for e in examples), s.max_negatives)
    if g and not s.scored:
        texts = [e.negatives[n] if n < len(e.negatives) else "" for e in examples for n in range(g)]
        out.update({key: value.reshape(len(examples), g, -1)  # [N * G, S] -> [N, G, S]
                    for key, value in _rows(tokenizer, s, "negative", texts).items()})
        out["negative_present"] = np.array([[n < len(e.negatives) for n in range(g)] for e in examples], np.float32)
    if any(e.scores for e in examples):  # margin_mse, kl: the kept negatives' scores (0 for one not there)
        out["teacher_scores"] = np.array([(list(e.scores) + [0.0] * g)[:1 + g] for e in examples], np.float32)
    out.update(skips)
    out["score"] = np.array([np.nan if e.score is None else e.score for e in examples], np.float32)
    out["idx"] = np.array([e.idx for e in examples], np.int32)
    out["example_weight"] = np.ones(len(examples), np.float32)
    return out


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


def _ranks(scores: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """1 + the candidates scoring at least as high as the relevant one, for scores [n, U] and relevant [n]."""
    own = scores[np.arange(scores.shape[0]), relevant][:, None]
    return np.sum(scores >= own, axis=-1)  # the relevant candidate counts itself: ranks start at 1


def positive_ranks(queries: np.ndarray, candidates: np.ndarray, relevant: np.ndarray,
                   similarity: str = "cosine") -> np.ndarray:
    """Each query's rank (1 = first) of its relevant candidate by cosine (or dot product: SPLADE): 1 + the
    candidates scoring at least as high, itself left out. queries [N, D], candidates [U, D], relevant [N] int."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    queries, candidates = queries.astype(np.float64), candidates.astype(np.float64)
    if similarity == "cosine":
        queries, candidates = unit(queries), unit(candidates)
    ranks = np.empty(len(relevant), np.int64)
    for start in range(0, len(relevant), RANK_BLOCK):  # [block, U] at a time, whatever the dev set's size
        rows = slice(start, start + RANK_BLOCK)
        ranks[rows] = _ranks(queries[rows] @ candidates.T, relevant[rows])
    return ranks


_MAXSIM = jax.jit(multivector.maxsim)


def maxsim_ranks(queries: np.ndarray, query_mask: np.ndarray, candidates: np.ndarray, candidate_mask: np.ndarray,
                 relevant: np.ndarray) -> np.ndarray:
    """positive_ranks by MaxSim (ColBERT): queries [N, Sq, D] and query_mask [N, Sq], candidates [U, Sd, D] and
    candidate_mask [U, Sd], relevant [N] int."""
    ranks = np.empty(len(relevant), np.int64)
    for start in range(0, len(relevant), RANK_BLOCK):
        rows = slice(start, start + RANK_BLOCK)
        scores = np.asarray(_MAXSIM(queries[rows], query_mask[rows], candidates, candidate_mask))  # [block, U]
        ranks[rows] = _ranks(scores, relevant[rows])
    return ranks


def active_dims(vectors: np.ndarray) -> float:
    """The mean count of non-zero features of vectors [N, V] (SPLADE's sparsity, as sentence-transformers'
    sparse evaluators report it)."""
    return float(np.mean(np.count_nonzero(vectors, axis=-1)))


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    """The mean cosine of every two distinct rows of vectors [N, V] (N >= 2), from the sum of the unit rows
    (|sum u|^2 = N + the sum over ordered pairs of u_i . u_j), so no [N, N] matrix; a zero row counts as
    unlike every other. SPLADE's document_similarity: near 1 when a start's masked-LM head gives every text the
    same terms, as a barely pretrained one does (README, "Sparse (SPLADE) and multi-vector (ColBERT) encoders")."""
    vectors = vectors.astype(np.float64)
    count = len(vectors)
    if count < 2:
        return 0.0
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    units = np.where(norms > 0, vectors / np.maximum(norms, 1e-300), 0.0)
    total = units.sum(axis=0)
    return float((total @ total - np.sum(units * units)) / (count * (count - 1)))


def retrieval_metrics(ranks: np.ndarray) -> dict:
    """mrr_at_10 and recall_at_1 of the positives' ranks."""
    reciprocal = np.where(ranks <= MRR_CUTOFF, 1.0 / ranks, 0.0)
    return {"mrr_at_10": float(np.mean(reciprocal)), "recall_at_1": float(np.mean(ranks == 1))}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's cosine of a [N, D] and b [N, D], in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def distill_score(split_name: str, split: Split, student: np.ndarray) -> Scored:
    """mse, neg_mse and teacher_cosine of the student's embeddings [N, D] against split.features["target"]."""
    if "target" not in split.features:  # a split without the teacher's embeddings (test): nothing to score
        return Scored({}, {})
    target = split.features["target"].astype(np.float64)
    mse = float(np.mean(np.square(student.astype(np.float64) - target)))
    cos = cosines(student, target)
    lines = ["index\tteacher_cosine"] + [f"{i}\t{c:.6f}" for i, c in zip(split.features["idx"], cos)]
    return Scored({"neg_mse": -mse, "mse": mse, "teacher_cosine": float(np.mean(cos))},
                  {f"{split_name}_teacher_cosines.tsv": "\n".join(lines) + "\n"})


def score(task, split_name: str, split: Split, logits: np.ndarray, settings=None, null_threshold: float = 0.0):
    """logits: each pair's (query, passage) embeddings [N, 2, D] (distill_mse: each text's [N, 1, D]; SPLADE:
    vectors [N, 2, V], held whole: 4 N x 2 x V bytes; ColBERT: token vectors and masks as
    contrastive_steps.pair_token_vectors lays them out, [N, Sq + Sd, D + 1]). Retrieval in the set (pairs;
    SPLADE by dot product, with the active dimensions; ColBERT by MaxSim), the correlations of cosine with
    score (scored pairs), or the distance to the teacher's embeddings (distill_mse)."""
    if task.contrastive_loss == contrastive_losses.DISTILL:
        return distill_score(split_name, split, logits[:, 0])
    queries, passages = logits[:, 0], logits[:, 1]
    if task.contrastive_loss in contrastive_losses.SCORED:
        cos = cosines(queries, passages)
        found = {}
        if split.labeled:
            found = {"spearman": metrics.spearman(cos, split.features["score"]),
                     "pearson": metrics.pearson(cos, split.features["score"])}
        lines = ["index\tcosine"] + [f"{i}\t{c:.6f}" for i, c in zip(split.features["idx"], cos)]
        return Scored(found, {f"{split_name}_cosines.tsv": "\n".join(lines) + "\n"})
    texts = [e.positive for e in split.examples]
    distinct = {text: n for n, text in reversed(list(enumerate(texts)))}  # each text at its first row
    order = sorted(distinct.values())
    column = {texts[row]: c for c, row in enumerate(order)}
    sparse = settings is not None and settings.sparse
    relevant = np.array([column[t] for t in texts])
    if settings is not None and settings.colbert:
        q, q_mask, d, d_mask = contrastive_steps.split_token_vectors(logits, settings.colbert_query_length)
        ranks = maxsim_ranks(q, q_mask, d[order], d_mask[order], relevant)
    else:
        ranks = positive_ranks(queries, passages[order], relevant, "dot" if sparse else "cosine")
    lines = ["index\trank"] + [f"{i}\t{r}" for i, r in zip(split.features["idx"], ranks)]
    found = retrieval_metrics(ranks)
    if sparse:  # the queries' and the distinct documents' mean non-zeros
        found.update(query_active_dims=active_dims(queries), document_active_dims=active_dims(passages[order]),
                     document_similarity=mean_pairwise_cosine(passages[order]))
    return Scored(found, {f"{split_name}_positive_ranks.tsv": "\n".join(lines) + "\n"})


def predict(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    raise ValueError("a contrastive model gives sentence embeddings, not predictions: embed texts with the "
                     "pooling, normalisation and prompts of its checkpoint's embedding record")


def signatures(graph) -> dict:
    """No task signature: the SavedModel's encode signature gives the encoder's outputs."""
    return {}


CONTRASTIVE = Kind("contrastive", class_labels=False, read=read, featurize=featurize, score=score, predict=predict,
                   signatures=signatures, settings_from_config=settings_from_config, hf_class=None,
                   batch_keys=contrastive_steps.batch_keys, eval_keys=contrastive_steps.EVAL_KEYS)
