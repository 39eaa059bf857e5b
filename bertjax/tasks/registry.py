"""The fine-tuning task table: what each task reads, predicts, scores and submits.

One frozen `Task` per benchmark task (GLUE, HellaSwag, SQuAD v1.1 and v2.0, CoNLL-2003 NER) and one
generic task per kind for the user's own files (JSON lines; SQuAD-format JSON; CoNLL columns), whose
class or tag names come from the config. Fields that do not apply to a kind stay empty.

Main metrics follow the GLUE table of Devlin et al. (2018): F1 for MRPC and QQP, Spearman for
STS-B, Matthews correlation for CoLA, accuracy elsewhere. Submission files and label formats are
those of the GLUE server (gluebenchmark.com): names for the NLI tasks, 0/1 for the others, floats
for STS-B.
"""

import dataclasses

CLASSIFICATION = "classification"
REGRESSION = "regression"
MULTIPLE_CHOICE = "multiple_choice"
SPAN = "span"
TAGGING = "tagging"
CONTRASTIVE = "contrastive"
RERANK = "rerank"
KINDS = (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE, SPAN, TAGGING, CONTRASTIVE, RERANK)
# The contrastive losses of scored pairs: bertjax/models/contrastive_losses.py's SCORED, repeated so that the
# task table stays plain data without JAX (tests/test_kinds.py holds the two equal).
SCORED_CONTRASTIVE_LOSSES = ("cosent", "cosine_mse")
# The reranking losses (bertjax/models/rerank_losses.py's LOSSES and TEACHER_LOSSES), plain data here as well.
RERANK_LOSSES = ("bce", "listnet", "lambdaloss", "ranknet", "margin_mse", "kl")
RERANK_TEACHER_LOSSES = ("margin_mse", "kl")
# Kinds whose examples are one per row of a JSON-lines file (bertjax/tasks/readers.py).
JSONL_KINDS = (CLASSIFICATION, REGRESSION, MULTIPLE_CHOICE)

# CoNLL-2003's tags in TFDS's ClassLabel order, as BIO (IOB2): the files' IOB1 tags are read as BIO.
CONLL2003_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


@dataclasses.dataclass(frozen=True)
class Task:
    """One fine-tuning task.

    name:            the table's key ("mrpc", "mnli", "hellaswag", "classification", ...)
    kind:            "classification" | "regression" | "multiple_choice" | "span" | "tagging"
    labels:          class (or tag) names, index order (TFDS's ClassLabel order for TFDS tasks); ()
                     for regression, multiple choice and span
    metrics:         names bertjax.tasks.metrics.task_metrics returns, as metrics.jsonl writes them
    main_metric:     the one metric the paper reports (and model selection uses)
    tfds_name:       "glue/mrpc" ...; None where the data are the user's files only
    text_features:   the TFDS features holding the text: one (single sentence) or two (a pair,
                     segment A then B); multiple choice: (context, list of choices)
    train_split:     TFDS split to train on; None for evaluation-only sets (GLUE's ax)
    eval_splits:     TFDS splits with labels to evaluate on (MNLI: matched and mismatched)
    test_splits:     TFDS splits without labels, predicted for a submission
    positive_label:  the class F1 counts as positive (binary tasks with an F1 metric)
    num_choices:     choices per example (multiple choice)
    submission_files: test split -> GLUE submission file name; () where there is no leaderboard file
    submission_labels: what the submission file writes for each class index; () writes floats
    squad_version:   "v1.1" or "v2.0" (span: whether questions may have no answer)
    contrastive_loss: contrastive: the loss, which decides the data's form (pairs or scored pairs)
    rerank_loss:     rerank: the loss, which decides what the training rows' targets are (labels or a
                     teacher's scores)
    """

    name: str
    kind: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    main_metric: str
    tfds_name: str | None = None
    text_features: tuple[str, ...] = ()
    train_split: str | None = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ("test",)
    positive_label: str | None = None
    num_choices: int | None = None
    submission_files: tuple[tuple[str, str], ...] = ()
    submission_labels: tuple[str, ...] = ()
    squad_version: str | None = None
    contrastive_loss: str | None = None
    rerank_loss: str | None = None

    @property
    def num_labels(self) -> int:
        """Outputs of the task head: classes, 1 score (regression), 1 score per choice."""
        if self.kind in (CLASSIFICATION, TAGGING):
            return len(self.labels)
        return 2 if self.kind == SPAN else 1

    @property
    def positive_index(self) -> int | None:
        return None if self.positive_label is None else self.labels.index(self.positive_label)

    def submission_file(self, split: str) -> str:
        files = dict(self.submission_files)
        if split not in files:
            raise ValueError(
                f"task {self.name} has no submission file for split {split!r}"
                + (f": it has one for {', '.join(files)}" if files else "")
            )
        return files[split]


_BINARY_01 = ("0", "1")
_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")


def _glue(name, labels, features, metrics, main, submission_file, submission_labels, **kw) -> Task:
    kind = CLASSIFICATION if labels else REGRESSION
    test_splits = kw.pop("test_splits", ("test",))
    files = kw.pop("submission_files", None) or tuple((s, submission_file) for s in test_splits)
    return Task(name=name, kind=kind, labels=labels, metrics=metrics, main_metric=main,
                tfds_name=f"glue/{name}", text_features=features, test_splits=test_splits,
                submission_files=files, submission_labels=submission_labels, **kw)


_ACC = ("accuracy",)
_ACC_F1 = ("accuracy", "f1")
_SQUAD_V1 = ("exact_match", "f1")
_SQUAD_V2 = ("exact_match", "f1", "best_exact_match", "best_f1", "best_f1_threshold")
_ENTITIES = ("precision", "recall", "f1")

TASKS: dict[str, Task] = {t.name: t for t in (
    _glue("cola", ("unacceptable", "acceptable"), ("sentence",), ("matthews_corr",), "matthews_corr",
          "CoLA.tsv", _BINARY_01),
    _glue("sst2", ("negative", "positive"), ("sentence",), _ACC, "accuracy", "SST-2.tsv", _BINARY_01),
    _glue("mrpc", ("not_equivalent", "equivalent"), ("sentence1", "sentence2"), _ACC_F1, "f1",
          "MRPC.tsv", _BINARY_01, positive_label="equivalent"),
    _glue("qqp", ("not_duplicate", "duplicate"), ("question1", "question2"), _ACC_F1, "f1",
          "QQP.tsv", _BINARY_01, positive_label="duplicate"),
    _glue("stsb", (), ("sentence1", "sentence2"), ("pearson", "spearman"), "spearman", "STS-B.tsv", ()),
    _glue("mnli", _NLI3, ("premise", "hypothesis"), _ACC, "accuracy", None, _NLI3,
          eval_splits=("validation_matched", "validation_mismatched"),
          test_splits=("test_matched", "test_mismatched"),
          submission_files=(("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv"))),
    _glue("qnli", _NLI2, ("question", "sentence"), _ACC, "accuracy", "QNLI.tsv", _NLI2),
    _glue("rte", _NLI2, ("sentence1", "sentence2"), _ACC, "accuracy", "RTE.tsv", _NLI2),
    # TFDS orders WNLI's classes not_entailment, entailment: index 1 is entailment, GLUE's "1".
    _glue("wnli", ("not_entailment", "entailment"), ("sentence1", "sentence2"), _ACC, "accuracy",
          "WNLI.tsv", _BINARY_01),
    # The diagnostic set: test only, predicted by a model fine-tuned on MNLI.
    _glue("ax", _NLI3, ("premise", "hypothesis"), _ACC, "accuracy", "AX.tsv", _NLI3,
          train_split=None, eval_splits=()),
    # SWAG (the paper's multiple-choice task) is not in TFDS; HellaSwag, its successor, is, in the
    # same form: a context and four endings.
    Task(name="hellaswag", kind=MULTIPLE_CHOICE, labels=(), metrics=_ACC, main_metric="accuracy",
         tfds_name="hellaswag", text_features=("context", "endings"), num_choices=4),
    # Span QA (Rajpurkar et al. 2016, 2018): dev scores by the official scripts' algorithm; there is
    # no public test set, so no submission file.
    Task(name="squad", kind=SPAN, labels=(), metrics=_SQUAD_V1, main_metric="f1", tfds_name="squad/v1.1",
         test_splits=(), squad_version="v1.1"),
    # v2.0: the main metric is F1 at the no-answer threshold tuned on the dev set (the best_f1 of the
    # official v2.0 script), as the leaderboard's dev figures are reported.
    Task(name="squad_v2", kind=SPAN, labels=(), metrics=_SQUAD_V2, main_metric="best_f1",
         tfds_name="squad/v2.0", test_splits=(), squad_version="v2.0"),
    # NER (Tjong Kim Sang and De Meulder 2003): entity-level F1 on dev (model selection) and test,
    # both labelled, as the paper reports both.
    Task(name="conll2003", kind=TAGGING, labels=CONLL2003_TAGS, metrics=_ENTITIES, main_metric="f1",
         tfds_name="conll2003", eval_splits=("dev", "test"), test_splits=()),
)}

def _contrastive_task(loss: str) -> Task:
    """Pairs (mnrl) are scored by retrieval in the dev set, scored pairs by Spearman of cosine and score,
    texts (distill_mse) by -mse to the teacher's embeddings (the best checkpoint is the highest)."""
    scored = loss in SCORED_CONTRASTIVE_LOSSES
    metrics = ("spearman", "pearson") if scored else ("mrr_at_10", "recall_at_1")
    if loss == "distill_mse":
        metrics = ("neg_mse", "mse", "teacher_cosine")
    return Task(name=CONTRASTIVE, kind=CONTRASTIVE, labels=(), metrics=metrics, main_metric=metrics[0],
                train_split=None, eval_splits=(), test_splits=(), contrastive_loss=loss)


def _classification_task(labels) -> Task:
    labels = tuple(str(label) for label in (labels or ()))
    if len(labels) < 2:
        raise ValueError("task classification needs at least two class names: set data.labels, "
                         "e.g. ['negative', 'positive']")
    if len(set(labels)) != len(labels):
        raise ValueError(f"task classification: data.labels lists a class twice: {list(labels)}")
    binary = len(labels) == 2
    return Task(name=CLASSIFICATION, kind=CLASSIFICATION, labels=labels, metrics=_ACC_F1 if binary else _ACC,
                main_metric="accuracy", train_split=None, eval_splits=(), test_splits=(),
                positive_label=labels[1] if binary else None)


def _tagging_task(labels) -> Task:
    labels = tuple(str(label) for label in (labels or ()))
    if "O" not in labels or len(labels) < 2:
        raise ValueError("task tagging needs its tags, 'O' and the entity tags (BIO), in data.labels, e.g. "
                         "['O', 'B-PER', 'I-PER']")
    if len(set(labels)) != len(labels):
        raise ValueError(f"task tagging: data.labels lists a tag twice: {list(labels)}")
    return Task(name=TAGGING, kind=TAGGING, labels=labels, metrics=_ENTITIES, main_metric="f1", train_split=None,
                eval_splits=(), test_splits=())


def _rerank_task(loss: str) -> Task:
    """A reranker of each query's candidates, scored by reranking the dev set's: nDCG@10 chooses the checkpoint."""
    if loss not in RERANK_LOSSES:
        raise ValueError(f"rerank.loss={loss!r}: choose one of {', '.join(RERANK_LOSSES)}")
    metrics = ("ndcg_at_10", "mrr_at_10", "map_at_10", "recall_at_10")
    return Task(name=RERANK, kind=RERANK, labels=(), metrics=metrics, main_metric=metrics[0], train_split=None,
                eval_splits=(), test_splits=(), rerank_loss=loss)


# Tasks on the user's own JSON-lines files; their classes / choice count come from the config.
GENERIC_TASKS = KINDS


def get_task(name: str, labels=None, num_choices: int | None = None, squad_version: str | None = None,
             contrastive_loss: str | None = None, rerank_loss: str | None = None) -> Task:
    """The task called `name`: a row of TASKS, or a generic kind built from the given labels.

    "classification" needs `labels` (class names, index order; two labels also get F1 with the
    second as the positive class, GLUE's convention); "multiple_choice" needs `num_choices`;
    "regression" needs neither; "tagging" needs `labels` (the tags, "O" among them: BIO or IOB1);
    "span" takes `squad_version` (v1.1 default); "contrastive" its `contrastive_loss` (mnrl default: query /
    positive pairs scored by retrieval in the dev set; cosent, cosine_mse: scored pairs, by Spearman); "rerank"
    its `rerank_loss` (bce default).
    Benchmark tasks take none of them.
    """
    if name in TASKS:
        if labels or num_choices or squad_version:
            raise ValueError(f"task {name} has fixed labels and choices: leave data.labels and "
                             "data.num_choices unset, or use a generic task (classification, regression,"
                             " multiple_choice)")
        return TASKS[name]
    if name == CLASSIFICATION:
        return _classification_task(labels)
    if name == REGRESSION:
        if labels:
            raise ValueError("task regression predicts a number: leave data.labels unset")
        return Task(name=name, kind=REGRESSION, labels=(), metrics=("pearson", "spearman"),
                    main_metric="spearman", train_split=None, eval_splits=(), test_splits=())
    if name == MULTIPLE_CHOICE:
        if not num_choices or num_choices < 2:
            raise ValueError("task multiple_choice needs the number of choices per example (2 or more): "
                             "set data.num_choices")
        return Task(name=name, kind=MULTIPLE_CHOICE, labels=(), metrics=_ACC, main_metric="accuracy",
                    train_split=None, eval_splits=(), test_splits=(), num_choices=int(num_choices))
    if name == SPAN:
        version = squad_version or "v1.1"
        if version not in ("v1.1", "v2.0"):
            raise ValueError(f"data.squad_version={version!r}: choose v1.1 or v2.0 (questions without answers)")
        v2 = version == "v2.0"
        return Task(name=name, kind=SPAN, labels=(), metrics=_SQUAD_V2 if v2 else _SQUAD_V1,
                    main_metric="best_f1" if v2 else "f1", train_split=None, eval_splits=(), test_splits=(),
                    squad_version=version)
    if name == TAGGING:
        return _tagging_task(labels)
    if name == CONTRASTIVE:
        return _contrastive_task(contrastive_loss or "mnrl")
    if name == RERANK:
        return _rerank_task(rerank_loss or "bce")
    known = ", ".join(list(TASKS) + list(GENERIC_TASKS))
    raise ValueError(f"unknown task {name!r}: known tasks are {known}")
