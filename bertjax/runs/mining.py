"""Hard negatives added to a pairs file: python -m bertjax.mine's run.

The pairs are read and checked, the corpus is read (the pairs' own positives where none is given), every
distinct query and corpus text is embedded by the model (its query and document prompts), each query's
negatives are mined (tasks/mining.py: sentence-transformers' mine_hard_negatives), and the pairs are
written again with `negatives` added, in one piece: a failure leaves no output file.

Lines with the same query are one query whose positives are all of theirs, as sentence-transformers
reads them; a positive is always in the corpus; a negative is never one of the query's positives nor
the query's own text.
"""

import json

from bertjax import inference
from bertjax.runs import console
from bertjax.tasks import mining, readers, retrieval
from bertjax.tasks.kinds import contrastive
from bertjax.text import files
from bertjax.training import sharding

DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # the prompt names sentence-transformers' encode_document tries


def read_corpus(path: str) -> list[str]:
    """A corpus file's texts: JSON lines with `text`, or BEIR's {"_id", "title", "text"} (title, a space,
    text)."""
    texts = []
    for number, obj in readers.json_lines(path):
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{number}: expected a non-empty string field 'text' (lines of {{\"text\": ...}} "
                             f"or BEIR's {{\"_id\", \"title\", \"text\"}})")
        title = obj.get("title")
        texts.append(f"{title} {text}".strip() if isinstance(title, str) and title.strip() else text)
    return texts


def _embedder(model, batch_size: int):
    prompts = model.embedding.prompts if model.embedding else {}
    document = next((name for name in DOCUMENT_PROMPTS if name in prompts), None)

    def embed(texts, kind):  # as sentence-transformers' encode_query and encode_document
        if kind == "query":
            return model.embed(texts, task="query", batch_size=batch_size)
        return model.embed(texts, prompt_name=document, batch_size=batch_size)
    return embed


def mine(model_path: str, pairs_path: str, out_path: str, *, corpus_path: str | None = None, num_negatives: int = 3,
         range_min: int = 0, range_max: int | None = None, absolute_margin: float | None = None,
         relative_margin: float | None = None, max_score: float | None = None, min_score: float | None = None,
         sampling: str = "top", seed: int = 0, batch_size: int = 64) -> dict:
    """Write out_path: the pairs of pairs_path, each with its query's mined negatives after any it had.
    Returns {"pairs", "queries", "corpus", "negatives", "short"} (short: queries given fewer than
    num_negatives)."""
    # ---- the pairs and the corpus -----------------------------------------------------------------
    pairs = contrastive.read_pairs(pairs_path, "mnrl")
    lines = [obj for _, obj in readers.json_lines(pairs_path)]
    corpus = read_corpus(corpus_path) if corpus_path else []
    if corpus_path and not corpus:
        raise ValueError(f"--corpus={corpus_path}: no texts to mine negatives from")
    corpus = list(dict.fromkeys(corpus + [p.positive for p in pairs]))  # the positives always in it, once
    row = {text: i for i, text in enumerate(corpus)}
    queries = list(dict.fromkeys(p.query for p in pairs))
    query_index = {text: i for i, text in enumerate(queries)}
    positive_ids = [[] for _ in queries]
    for p in pairs:
        positive_ids[query_index[p.query]].append(row[p.positive])
    if len(corpus) < 2:
        raise ValueError(f"{pairs_path}: the corpus holds {len(corpus)} text: negatives need more than the "
                         f"positives (give --corpus=FILE)")
    console.say(f"mining: {len(pairs)} pairs, {len(queries)} distinct queries, a corpus of {len(corpus)} texts")

    # ---- embeddings ---------------------------------------------------------------------------------
    model = inference.load(model_path)
    embed = _embedder(model, batch_size)
    query_embeddings = retrieval.embed_texts(embed, queries, "query", batch_size)
    corpus_embeddings = retrieval.embed_texts(embed, corpus, "document", batch_size)

    # ---- mining -------------------------------------------------------------------------------------
    negatives = mining.mine_negatives(
        query_embeddings, corpus_embeddings, positive_ids, range_min=range_min, range_max=range_max,
        max_score=max_score, min_score=min_score, absolute_margin=absolute_margin, relative_margin=relative_margin,
        num_negatives=num_negatives, sampling=sampling, seed=seed,
        exclude=[row.get(q, -1) for q in queries], mesh=sharding.make_mesh({"data": -1}))

    # ---- the pairs written with their negatives --------------------------------------------------------
    out = []
    for obj, p in zip(lines, pairs):
        given = list(p.negatives)
        mined = [corpus[i] for i in negatives[query_index[p.query]] if corpus[i] not in given]
        record = {key: value for key, value in obj.items() if key != "negative"}
        out.append(json.dumps({**record, "negatives": given + mined}, ensure_ascii=False) + "\n")
    files.write_bytes(out_path, "".join(out).encode("utf-8"))
    short = sum(len(n) < num_negatives for n in negatives)
    advice = f"; {short} got fewer than {num_negatives} (raise range_max or loosen the margins)" if short else ""
    console.say(f"wrote {out_path}: {sum(map(len, negatives))} negatives for {len(queries)} queries{advice}")
    return {"pairs": len(pairs), "queries": len(queries), "corpus": len(corpus),
            "negatives": sum(map(len, negatives)), "short": short}
