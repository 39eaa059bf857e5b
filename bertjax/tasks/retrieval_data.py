"""Retrieval data sets: a corpus of passages, queries, and graded relevance judgements (qrels).

Two layouts are read, each one split at a time:
  BEIR's directory      corpus.jsonl   {"_id", "title" (optional), "text"} per line
                        queries.jsonl  {"_id", "text"} per line
                        qrels/<split>.tsv  a header `query-id  corpus-id  score`, then one judgement per
                                       line, tab-separated, the score a whole number (0: judged not relevant)
  Hugging Face datasets the MTEB/BEIR layout of the Hub, each part as save_to_disk writes it:
                        corpus/   a Dataset (or a DatasetDict of one split) with _id, title, text
                        queries/  the same with _id, text
                        qrels/<split>/  a Dataset with query-id, corpus-id, score (a DatasetDict's split,
                                        or a Dataset saved there)

A passage's text is its title, a space, and its text, stripped (BEIR's convention: its models embed
`(title + " " + text).strip()`), so a passage without a title is its text. Only the queries that
have judgements in the split are kept, in queries.jsonl's order (as BEIR's loader keeps them).
Every problem is one ValueError line naming the file and line (or row): an empty corpus, a missing
field, an id given twice, judgements naming a query or passage that is not there, a split with no
judgements; nothing is returned half-read.
"""

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator

from bertjax.text import files

QRELS_HEADER = ("query-id", "corpus-id", "score")
HF_BATCH_ROWS = 10_000  # rows of a save_to_disk dataset read at a time: columns, not a dict per row


@dataclasses.dataclass(frozen=True)
class RetrievalSet:
    """One split of a retrieval data set.

    corpus_ids, passages:  the corpus in its file order; passages[i] is corpus_ids[i]'s text
    query_ids, queries:    the queries judged in this split
    qrels:                 query id -> {corpus id: relevance}; relevance >= 1 is relevant, 0 judged not
    """

    name: str
    corpus_ids: list[str]
    passages: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]


def read_retrieval(path: str, split: str = "test") -> RetrievalSet:
    """A split of the retrieval data set at `path`, in BEIR's layout or the Hugging Face one (module
    docstring), named after its directory."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, "corpus.jsonl")):
        return read_beir(path, split)
    if os.path.isdir(os.path.join(path, "corpus")):
        return read_hf_retrieval(path, split)
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such directory; give a BEIR data set's directory (corpus.jsonl, "
                         f"queries.jsonl, qrels/) or a directory of save_to_disk datasets (corpus/, queries/, qrels/)")
    raise ValueError(f"{path}: neither corpus.jsonl (BEIR's layout) nor corpus/ (datasets' save_to_disk) is there")


def dataset_name(path: str) -> str:
    return os.path.basename(os.path.normpath(os.fspath(path)))


# ----------------------------------------------------------------------------------------------------
# BEIR's files
# ----------------------------------------------------------------------------------------------------


def read_beir(path: str, split: str = "test") -> RetrievalSet:
    """BEIR's layout: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""
    qrels_path = os.path.join(path, "qrels", f"{split}.tsv")
    if not os.path.isfile(qrels_path):
        found = sorted(f[:-4] for f in os.listdir(os.path.join(path, "qrels")) if f.endswith(".tsv")) \
            if os.path.isdir(os.path.join(path, "qrels")) else []
        raise ValueError(f"{path}: no qrels/{split}.tsv for split {split!r}"
                         + (f" (its splits: {', '.join(found)})" if found else " (no qrels/*.tsv at all)"))
    queries_path = os.path.join(path, "queries.jsonl")
    if not os.path.isfile(queries_path):
        raise ValueError(f"{path}: no queries.jsonl")
    return assemble(dataset_name(path), _json_rows(os.path.join(path, "corpus.jsonl")), _json_rows(queries_path),
                    _tsv_qrels(qrels_path), corpus_where=os.path.join(path, "corpus.jsonl"),
                    queries_where=queries_path)


def _json_rows(path: str) -> Iterator[tuple[str, dict]]:
    """(where, object) for each non-blank line of a JSON-lines file."""
    for number, line in files.read_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, row


def _tsv_qrels(path: str) -> Iterator[tuple[str, str, str, object]]:
    """(where, query id, corpus id, score) per judgement of a BEIR qrels file, after its header."""
    lines = files.read_lines(path)
    header = next((line for _, line in lines if line.strip()), None)
    if header is None or tuple(h.strip() for h in header.split("\t")) != QRELS_HEADER:
        raise ValueError(f"{path}: expected the header line {' <tab> '.join(QRELS_HEADER)}, got "
                         f"{'an empty file' if header is None else repr(header[:80])}")
    for number, line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{path}:{number}: expected query-id, corpus-id and score separated by tabs, "
                             f"got {len(fields)} field(s)")
        yield f"{path}:{number}", fields[0].strip(), fields[1].strip(), fields[2].strip()


# ----------------------------------------------------------------------------------------------------
# Hugging Face datasets (save_to_disk)
# ----------------------------------------------------------------------------------------------------


def _load_from_disk(path: str, part: str):
    """The one Dataset of a save_to_disk directory: a Dataset, or a DatasetDict of one split (or a split
    named after the part, as the Hub's BEIR sets name theirs)."""
    try:
        import datasets  # an optional dependency: only this layout needs it
    except ImportError:
        raise ValueError(f"{path}: reading save_to_disk datasets needs the Hugging Face datasets package: "
                         f"pip install datasets") from None
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")):
        raise ValueError(f"{path}: not a directory written by save_to_disk (no state.json or dataset_dict.json)")
    loaded = datasets.load_from_disk(path)
    if isinstance(loaded, datasets.DatasetDict):
        if part in loaded:
            return loaded[part]
        if len(loaded) != 1:
            raise ValueError(f"{path}: a DatasetDict of the splits {', '.join(loaded)}; expected one split "
                             f"(or one named {part!r})")
        return next(iter(loaded.values()))
    return loaded


def _hf_rows(path: str, part: str, columns: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    dataset = _load_from_disk(path, part)
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(map(repr, missing))} "
                         f"(its columns: {', '.join(dataset.column_names)})")
    present = [c for c in (*columns, "title") if c in dataset.column_names]
    number = 0
    for batch in dataset.select_columns(present).iter(batch_size=HF_BATCH_ROWS):  # column -> values
        for values in zip(*(batch[c] for c in present)):
            yield f"{path} row {number}", dict(zip(present, values))
            number += 1


def read_hf_retrieval(path: str, split: str = "test") -> RetrievalSet:
    """The Hub's MTEB/BEIR layout as save_to_disk writes it: corpus/, queries/, qrels/<split>/."""
    qrels_path = os.path.join(path, "qrels", split)
    if not os.path.isdir(qrels_path):
        qrels_dir = os.path.join(path, "qrels")
        found = sorted(d for d in os.listdir(qrels_dir) if os.path.isdir(os.path.join(qrels_dir, d))) \
            if os.path.isdir(qrels_dir) else []
        how = f"its splits: {', '.join(found)}" if found else f"save the qrels as a DatasetDict with a {split!r} split"
        raise ValueError(f"{path}: no qrels/{split}/ for split {split!r} ({how})")
    if not os.path.isdir(os.path.join(path, "queries")):
        raise ValueError(f"{path}: no queries/ beside corpus/")
    qrels = ((where, row["query-id"], row["corpus-id"], row["score"])
             for where, row in _hf_rows(qrels_path, split, QRELS_HEADER))
    return assemble(dataset_name(path), _hf_rows(os.path.join(path, "corpus"), "corpus", ("_id", "text")),
                    _hf_rows(os.path.join(path, "queries"), "queries", ("_id", "text")), qrels,
                    corpus_where=os.path.join(path, "corpus"), queries_where=os.path.join(path, "queries"))


# ----------------------------------------------------------------------------------------------------
# Either layout: rows checked and put together
# ----------------------------------------------------------------------------------------------------


def _id(value, where: str, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise ValueError(f"{where}: {field!r} must be a non-empty string, got {json.dumps(value)[:60]}")
    return str(value).strip()


def _text(row: dict, field: str, where: str, required: bool = True) -> str:
    value = row.get(field)
    if value is None:
        if required:
            raise ValueError(f"{where}: missing field {field!r}")
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {field!r} must be a string, got {json.dumps(value)[:60]}")
    return value


def _texts(rows: Iterable[tuple[str, dict]], with_title: bool) -> tuple[list[str], list[str]]:
    """(ids, texts) of corpus or query rows; an id given twice is an error."""
    ids, texts, seen = [], [], {}
    for where, row in rows:
        if row.get("_id") is None:
            raise ValueError(f"{where}: missing field '_id'")
        row_id = _id(row["_id"], where, "_id")
        if row_id in seen:
            raise ValueError(f"{where}: _id {row_id!r} was given before, at {seen[row_id]}")
        seen[row_id] = where
        text = _text(row, "text", where)
        if with_title:  # BEIR's passage: title, a space, text; stripped
            text = (_text(row, "title", where, required=False) + " " + text).strip()
        ids.append(row_id)
        texts.append(text)
    return ids, texts


def _score(value, where: str) -> int:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{where}: score {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{where}: score {value!r} must be a whole number (the relevance grade)")
    return int(value)


def assemble(name: str, corpus_rows, query_rows, qrels_rows, *, corpus_where: str, queries_where: str) -> RetrievalSet:
    """The split from its rows ((where, dict) for the corpus and queries; (where, query id, corpus id,
    score) for the judgements), every row checked before anything is returned."""
    corpus_ids, passages = _texts(corpus_rows, with_title=True)
    if not corpus_ids:
        raise ValueError(f"{corpus_where}: the corpus is empty: it needs at least one passage")
    all_query_ids, all_queries = _texts(query_rows, with_title=False)
    known_queries, known_passages = set(all_query_ids), set(corpus_ids)
    qrels, first = {}, None
    for where, query_id, corpus_id, score in qrels_rows:
        first = first or where
        query_id, corpus_id = _id(query_id, where, "query-id"), _id(corpus_id, where, "corpus-id")
        if query_id not in known_queries:
            raise ValueError(f"{where}: query-id {query_id!r} is not in {queries_where}")
        if corpus_id not in known_passages:
            raise ValueError(f"{where}: corpus-id {corpus_id!r} is not in {corpus_where}")
        judged = qrels.setdefault(query_id, {})
        if corpus_id in judged:
            raise ValueError(f"{where}: query {query_id!r} and passage {corpus_id!r} are judged twice")
        judged[corpus_id] = _score(score, where)
    if not qrels:
        raise ValueError(f"{name}: the split's qrels hold no judgements")
    kept = [i for i, query_id in enumerate(all_query_ids) if query_id in qrels]
    return RetrievalSet(name, corpus_ids, passages, [all_query_ids[i] for i in kept], [all_queries[i] for i in kept],
                        qrels)
