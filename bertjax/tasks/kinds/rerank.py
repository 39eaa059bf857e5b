"""Reranking: a cross-encoder scores each (query, candidate passage) pair; trained over each query's candidates
by the loss of rerank.loss (bertjax/models/rerank_losses.py), scored by reranking each dev query's candidates.

Data: JSON lines of yours (data.train, data.validation, data.test), in either form:
  field        form       meaning
  query        both       the query (segment A)
  passages     list       the query's candidates, a list of strings (segment B each); each such row is one
                          list (a query may have several rows)
  labels       list       one relevance per candidate: bce, in [0, 1]; listnet, lambdaloss, ranknet, grades
                          or any numbers; dev sets, whole-number grades (0 not relevant, 1, 2, ... more)
  scores       list       one teacher score per candidate (margin_mse, kl train on these instead of labels;
                          margin_mse reads the first candidate as the positive)
  passage_ids  list       optional: the candidates' ids, written to the predictions file (default 0, 1, ...)
  passage      pointwise  one candidate; with "label" (or "score"), "passage_id" optional: rows of the same
                          query are gathered into its list, in the order they come
Examples, a line of each form:
  {"query": "what is a panda", "passages": ["Pandas are bears.", "Paris is big."], "labels": [1, 0]}
  {"query": "what is a panda", "passage": "Pandas are bears.", "label": 1}
  python -m bertjax.finetune --config=configs/finetune/rerank.py --config.train.init_from=PATH \
      --config.data.train=train.jsonl --config.data.validation=dev.jsonl --config.rerank.loss=listnet --workdir=DIR

Each query holds at most rerank.candidates candidates (C): a training step takes train.batch_size queries, so
every listwise loss sees a query's whole list; with data.packing (the default) their pairs share rows
(bertjax/tasks/rerank_batches.py). Dev sets are scored by nDCG@10, MRR@10, MAP@10 and Recall@10 of
each query's candidates reranked (trec_eval's definitions, bertjax/tasks/retrieval_metrics.py); nDCG@10 chooses
the best checkpoint. The model exports as a sentence-transformers CrossEncoder, its score the raw logit.
"""

import dataclasses
import json

import numpy as np

from bertjax.models import heads
from bertjax.tasks import features, readers, registry, retrieval_metrics
from bertjax.tasks.kinds.classification import INPUT_KEYS, encode_texts
from bertjax.tasks.kinds.base import Kind, Scored, Split, refuse_questions

METRIC_NAMES = {"ndcg@10": "ndcg_at_10", "mrr@10": "mrr_at_10", "map@10": "map_at_10", "recall@10": "recall_at_10"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """config.rerank: the loss and its settings, and the candidate slots per query."""

    loss: str
    candidates: int  # C
    k: int | None  # lambdaloss, ranknet: pairs with either candidate in the model's top k; None: all
    sigma: float
    mu: float
    temperature: float  # kl

    def loss_settings(self) -> dict:
        return dict(name=self.loss, k=self.k, sigma=self.sigma, mu=self.mu, temperature=self.temperature)


def settings_from_config(config) -> Settings:
    r = config.rerank
    if r.loss not in registry.RERANK_LOSSES:
        raise ValueError(f"rerank.loss={r.loss!r}: choose one of {', '.join(registry.RERANK_LOSSES)}")
    if not isinstance(r.candidates, int) or r.candidates < 1:
        raise ValueError(f"rerank.candidates={r.candidates!r}: the most candidates a query has, a positive integer")
    if r.loss == "margin_mse" and r.candidates < 2:
        raise ValueError("rerank.loss=margin_mse compares the positive with the other candidates: rerank.candidates "
                         "must be at least 2")
    if r.k is not None and (not isinstance(r.k, int) or r.k < 1):
        raise ValueError(f"rerank.k={r.k!r}: a positive integer, or unset for every pair")
    if r.temperature <= 0:
        raise ValueError(f"rerank.temperature={r.temperature}: must be positive")
    return Settings(r.loss, r.candidates, r.k, float(r.sigma), float(r.mu), float(r.temperature))


@dataclasses.dataclass
class RerankExample:
    """One query and its candidates; targets (relevance or teacher scores) None where unlabeled."""

    idx: int
    query: str
    passages: list
    passage_ids: list
    targets: list | None


def _numbers(value, where: str, field: str, count: int) -> list:
    if not isinstance(value, list) or len(value) != count or not all(readers._is_number(v) for v in value):
        raise ValueError(f"{where}: field {field!r} must be a list of {count} numbers, one per candidate, got "
                         f"{json.dumps(value)[:60]}")
    return [float(v) for v in value]


def _list_row(obj: dict, query: str, where: str, idx: int, field: str, why: str, labeled: bool) -> RerankExample:
    """A row of the list form: its passages, their ids and targets, checked."""
    passages = obj["passages"]
    if not isinstance(passages, list) or not passages or not all(isinstance(p, str) for p in passages):
        raise ValueError(f"{where}: field 'passages' must be a non-empty list of strings")
    ids = obj.get("passage_ids") or [str(i) for i in range(len(passages))]
    if len(ids) != len(passages):
        raise ValueError(f"{where}: 'passage_ids' has {len(ids)} ids for {len(passages)} passages")
    targets = None
    if field in obj:
        targets = _numbers(obj[field], where, field, len(passages))
    elif labeled:
        raise ValueError(f"{where}: missing field {field!r}{why}: a list of numbers, one per passage")
    return RerankExample(idx, query, list(passages), [str(i) for i in ids], targets)


def read(task, split: str, path: str | None = None, data_dir: str | None = None, labeled: bool = True) -> list:
    """A JSON-lines file of either form (module docstring) -> RerankExample per query, in the file's order.
    The training split of margin_mse and kl reads "scores" (the teacher's); every other split "labels"."""
    if not path:
        raise ValueError(f"task {task.name} reads the user's JSON-lines files: set data.{split} to a file")
    teacher = split == "train" and task.rerank_loss in registry.RERANK_TEACHER_LOSSES
    field, single = ("scores", "score") if teacher else ("labels", "label")
    why = (f" (rerank.loss={task.rerank_loss} trains on a teacher's scores)" if teacher else "")
    examples: list[RerankExample] = []
    pointwise: dict[str, RerankExample] = {}  # a query's pointwise rows gather into one example
    for number, obj in readers.json_lines(path):
        where = f"{path}:{number}"
        query = readers._string_field(obj, "query", where)
        if "passages" in obj:  # a row is one query's list (the same query may have several rows)
            examples.append(_list_row(obj, query, where, len(examples), field, why, labeled))
            continue
        passage = readers._string_field(obj, "passage", where)
        if single not in obj and labeled:
            raise ValueError(f"{where}: missing field {single!r}{why} (or give a row 'passages' with '{field}')")
        target = obj.get(single)
        if target is not None and not readers._is_number(target):
            raise ValueError(f"{where}: field {single!r} must be a number, got {json.dumps(target)[:60]}")
        if query not in pointwise:
            pointwise[query] = RerankExample(len(examples), query, [], [], [] if target is not None else None)
            examples.append(pointwise[query])
        group = pointwise[query]
        group.passage_ids.append(str(obj.get("passage_id", len(group.passages))))
        group.passages.append(passage)
        if (group.targets is None) != (target is None):
            raise ValueError(f"{where}: query {query[:40]!r} has candidates with and without {single!r}")
        if target is not None:
            group.targets.append(float(target))
    if labeled and not teacher and split != "train":  # judged by trec_eval's grades
        for e in examples:
            if any(t < 0 or not float(t).is_integer() for t in e.targets):
                raise ValueError(f"{path}: query {e.query[:40]!r}: a dev set's labels are whole-number grades (0 not "
                                 f"relevant, 1, 2, ...), got {e.targets}")
    return examples


def featurize(task, examples: list, tokenizer, max_seq_length: int, settings: Settings | None = None) -> dict:
    """[CLS] query [SEP] candidate [SEP] of every candidate of each query: input_ids, segment_ids, input_mask
    [N, C, S]; label [N, C] float32 (the targets, 0 where none), label_weight [N, C] (1 for a real candidate),
    example_weight [N], idx [N]. An empty slot repeats the query's first pair, at weight 0."""
    slots = settings.candidates if settings is not None else max(len(e.passages) for e in examples)
    longest = max(examples, key=lambda e: len(e.passages))
    if len(longest.passages) > slots:
        raise ValueError(f"query {longest.query[:40]!r} has {len(longest.passages)} candidates, more than "
                         f"rerank.candidates={slots}: raise rerank.candidates to {len(longest.passages)}")
    special = dict(template=tokenizer.template, pad_id=tokenizer.pad_id)
    queries = tokenizer.encode_arrays([e.query for e in examples])
    passages = tokenizer.encode_arrays([p for e in examples for p in e.passages])
    n = len(examples)
    out = {k: np.zeros((n, slots, max_seq_length), np.int32) for k in INPUT_KEYS}
    out["label"] = np.zeros((n, slots), np.float32)
    out["label_weight"] = np.zeros((n, slots), np.float32)
    start = 0
    for i, e in enumerate(examples):
        for j in range(slots):
            real = j < len(e.passages)
            pair = features.encode_pair(queries[i], passages[start + (j if real else 0)], max_seq_length, **special)
            for k in INPUT_KEYS:
                out[k][i, j] = pair[k]
            out["label_weight"][i, j] = float(real)
            if real and e.targets is not None:
                out["label"][i, j] = e.targets[j]
        start += len(e.passages)
    out["example_weight"] = np.ones(n, np.float32)
    out["idx"] = np.arange(n, dtype=np.int32)
    return out


def score(task, split_name: str, split: Split, logits: np.ndarray, settings=None, null_threshold: float = 0.0):
    """Each query's candidates ranked by their scores (logits [N, C]): the ranking metrics against the labels
    (labeled splits), and rerank_<split>.jsonl: per query its candidates' ids and scores, best first."""
    runs, qrels, lines = {}, {}, []
    for e, row in zip(split.examples, np.asarray(logits, np.float32)):
        scores = {pid: float(s) for pid, s in zip(e.passage_ids, row[:len(e.passages)])}
        runs[str(e.idx)] = retrieval_metrics.trec_ranking(scores)
        if split.labeled:
            qrels[str(e.idx)] = {pid: int(t) for pid, t in zip(e.passage_ids, e.targets)}
        lines.append(json.dumps({"idx": e.idx, "query": e.query,
                                 "ranked": [[pid, scores[pid]] for pid in runs[str(e.idx)]]}))
    found = {}
    if split.labeled:
        every = retrieval_metrics.retrieval_scores(qrels, runs, k_values=(10,))
        found = {name: float(every[key]) for key, name in METRIC_NAMES.items()}
    return Scored(found, {f"rerank_{split_name}.jsonl": "\n".join(lines) + "\n"})


def predict(model, texts=None, text_pairs=None, choices=None, questions=None, contexts=None) -> list[dict]:
    """{"score"} per (query, passage): texts the queries, text_pairs the passages."""
    refuse_questions(model.task.kind, questions, contexts)
    if text_pairs is None:
        raise ValueError("a reranker scores (query, passage) pairs: give texts=queries and text_pairs=passages")
    texts = [texts] if isinstance(texts, str) else list(texts)
    text_pairs = [text_pairs] if isinstance(text_pairs, str) else list(text_pairs)
    encoded = encode_texts(model, texts, text_pairs)
    return [{"score": float(v)} for v in np.reshape(model.task_logits(encoded, batch_size=32), -1)]


def signatures(graph) -> dict:
    """predict_pair(queries, passages): each pair's score (the logit)."""
    tf = graph.tf
    tf_scores = graph.convert(heads.network(graph.bert.task.kind, graph.bert.config))

    @tf.function(input_signature=[graph.text_spec(), graph.text_spec()], autograph=False)
    def predict_pair(texts, text_pairs):
        return {"score": tf.reshape(tf_scores(*graph.pair(texts, text_pairs)), [-1])}

    return {"predict_pair": predict_pair}


RERANK = Kind(
    "rerank", class_labels=False, read=read, featurize=featurize, score=score, predict=predict,
    signatures=signatures, settings_from_config=settings_from_config,
    hf_class=dict(architecture="BertForSequenceClassification", prefix="classifier", pooler=True, labels=True,
                  problem_type=None, auto_class="AutoModelForSequenceClassification"))
