"""Sentence embeddings of many texts: how the model's embedding settings resolve, and the batches; and
ColBERT's token vectors (embed_tokens' settings and batches: multivector_settings, embed_token_rows).

Texts are tokenized with their prompt, sorted by length and laid out in rows of a few fixed widths
(buckets: 16, 32, 48, 64, then four per doubling, 80, 96, 112, 128, 160, ... up to the limit), so that a
text is padded by at most a quarter of its length rather than to the longest, and the encoder compiles
once per bucket rather than once per batch. Texts of at most half the packing width
share rows as the fine-tuning batches pack them (bertjax/tasks/batches.py: sequence_ids, position_ids,
cls_positions): attention stays within each text, so each one's embedding is the one it has alone.
Rows per batch are a power of two up to batch_size, again so that few shapes compile, and on CPUs also
up to a budget of tokens per batch (row width x rows): XLA's CPU code runs an encoder fastest on about a
thousand tokens at a time, its intermediates then staying in cache, where PyTorch's kernels keep their
speed on larger batches (docs/performance.md, "Fewer tokens a batch on CPUs").

ColBERT's rows are fixed-width already (bertjax/tasks/multivector_texts.py: a query is exactly its length,
a document padded to its most tokens), so they are batched as they are, without buckets or packing.

Shape legend: N texts, R rows of a batch, S row width (a bucket), K texts per row, D embedding width, L a
ColBERT row's width (its query or document length).
"""

import dataclasses
from typing import Callable

import numpy as np

from bertjax.data import packing
from bertjax.interop import sentence_transformers
from bertjax.models import pooling
from bertjax.tasks.contrastive_settings import COLBERT, DENSE, SPLADE, STATIC
from bertjax.tasks.multivector_texts import MultiVectorTexts
from bertjax.training.checkpoint_meta import EmbeddingRecord

MIN_BUCKET = 16  # the narrowest row, and the step between widths up to 4 x MIN_BUCKET
BUCKETS_PER_DOUBLING = 4  # above that: 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, ...
PACK_WIDTH = 128  # rows that several short texts share are at most this wide
MIN_PACKED_TOKENS = 8  # K = width / this: the most texts one packed row holds
PACK_WINDOW = 4096  # texts the packer places at a time (in length order): its cost stays linear in N
# Row tokens per batch on CPUs (None elsewhere: accelerators want the whole batch_size).
TOKENS_PER_BATCH = {"cpu": 1024}
# A model without an embedding record embeds with sentence-transformers' default Pooling: the mean of
# its token states, not normalised.
DEFAULT = EmbeddingRecord()
QUERY = "query"  # the task (and prompt name) of queries
DOCUMENT = "document"  # the task of passages: sentence-transformers' encode_document
# What a call computes (Settings.representation): pooled token states (DENSE), SPLADE's vectors over the
# vocabulary, the static query table's (SPLADE's inference-free query side, for task="query"), or ColBERT's
# token vectors (COLBERT: embed_tokens, never embed).


@dataclasses.dataclass(frozen=True)
class Settings:
    """How one embed call computes: the record's, or the caller's where given."""

    modes: tuple
    normalize: bool
    dense: dict | None  # the record's {"features", "bias", "activation"}
    prompt: str  # prepended to every text ("" for none)
    include_prompt: bool
    max_length: int  # tokens per text, [CLS] and [SEP] included (STATIC: the text's tokens alone)
    representation: str = DENSE  # DENSE | SPLADE | STATIC | COLBERT


def representation(record: EmbeddingRecord | None) -> tuple[str, str]:
    """(DENSE, SPLADE or COLBERT, SPLADE's query side: SPLADE or STATIC) of a model, as its EmbeddingRecord
    says (None, or a record from before the field: dense)."""
    record = record or DEFAULT
    return record.representation, record.splade_query


def resolve(record: EmbeddingRecord | None, model_limit: int, *, prompt_name: str | None, prompt: str | None,
            pooling_modes=None, normalize: bool | None = None, task: str | None = None,
            model: tuple = (DENSE, SPLADE)) -> Settings:
    """The settings of one call; a prompt name the model lacks, or pooling its Dense cannot take, is one
    line. model_limit: the most tokens the encoder's positions allow. task="query" (sentence-transformers'
    encode_query): the "query" prompt where none is given and the model has one, and texts cut to the
    record's max_query_length where it has one (shorter or longer than max_seq_length, as training cut them).
    task="document" (encode_document): the passage prompt where none is given
    (interop/sentence_transformers.document_prompt_name). model: representation()'s pair; a SPLADE model has
    no pooling or normalisation to choose, and its static query side embeds task="query"'s texts."""
    record = record or DEFAULT
    if model[0] == COLBERT:
        raise ValueError("a ColBERT model gives a vector per token, not one per text: call embed_tokens(texts, "
                         "task='query' or 'document') for its token vectors and masks")
    kind = STATIC if model == (SPLADE, STATIC) and task == QUERY else model[0]
    if kind != DENSE and (pooling_modes is not None or normalize is not None):
        raise ValueError("pooling and normalize are a dense embedder's: a SPLADE model's vector is the max over a "
                         "text's tokens of log(1 + ReLU(MLM logits)); leave them unset")
    if task not in (None, QUERY, DOCUMENT):
        raise ValueError(f"task={task!r}: None, 'query' (the texts are queries) or 'document' (passages)")
    if prompt_name is None and prompt is None:
        if task == QUERY and QUERY in record.prompts:
            prompt_name = QUERY  # as sentence-transformers' encode_query
        elif task == DOCUMENT:
            prompt_name = sentence_transformers.document_prompt_name(record.prompts)
    if prompt is None:
        name = prompt_name if prompt_name is not None else record.default_prompt_name
        if name is not None and name not in record.prompts:
            have = f"the prompts {', '.join(sorted(record.prompts))}" if record.prompts else "no prompts"
            raise ValueError(f"prompt_name={name!r}: the model has {have}; pass prompt='...' to give one")
        prompt = record.prompts.get(name, "") if name is not None else ""
    modes = record.modes if pooling_modes is None else pooling.check_modes(pooling_modes)
    if record.dense is not None and len(modes) != len(record.modes):
        raise ValueError(f"pooling={list(modes)}: the model's Dense layer takes the width of {len(record.modes)} "
                         f"pooling mode(s) ({', '.join(record.modes)}); pass as many")
    limit = min(record.max_seq_length or model_limit, model_limit)
    if task == QUERY and record.max_query_length is not None:  # Transformer.query_length, in place of max_seq_length
        limit = min(record.max_query_length, model_limit)
    return Settings(tuple(modes), record.normalize if normalize is None else bool(normalize), record.dense, prompt,
                    record.include_prompt, limit, kind)


def multivector_settings(record: EmbeddingRecord | None, model_limit: int,
                         task: str | None) -> tuple[MultiVectorTexts, str, Settings]:
    """(the text settings, the featurize kind "query" or "document", Settings) of an embed_tokens call, as a
    ColBERT model's record says: task="query" embeds queries, "document" (or None) documents, as
    sentence-transformers' encode_query and encode_document. One line for a model that is no ColBERT, a task
    it does not know, or a length beyond the model_limit tokens its positions allow."""
    record = record or DEFAULT
    if record.representation != COLBERT or not record.multivector:
        raise ValueError(f"embed_tokens gives ColBERT's token vectors; this model's representation is "
                         f"{record.representation}: call embed(texts) for its embeddings")
    if task not in (None, QUERY, DOCUMENT):
        raise ValueError(f"task={task!r}: None or 'document' (the texts are documents) or 'query' (queries)")
    fields = dict(record.multivector)
    texts = MultiVectorTexts(**{k: v for k, v in fields.items() if k != "dim"})
    kind = QUERY if task == QUERY else DOCUMENT
    if texts.length(kind) > model_limit:
        raise ValueError(f"the model's {kind} length {texts.length(kind)} is beyond its {model_limit} positions: "
                         "its record and config disagree")
    return texts, kind, Settings((), False, None, "", True, texts.length(kind), COLBERT)


def embed_token_rows(forward: Callable[[dict], object], rows: dict[str, np.ndarray], batch_size: int,
                     tokens_per_batch: int | None = None) -> np.ndarray:
    """Token vectors float32 [N, L, D] of fixed-width rows (multivector_texts.featurize's input_ids,
    segment_ids, input_mask, score_mask [N, L]), in order. forward(batch) -> [R, L, D] device arrays, read
    back after every batch is dispatched; R is rows_per_batch's (a power of two up to it where the texts
    are fewer), the last batch padded with copies of its last row, so that one shape compiles."""
    count, width = rows["input_ids"].shape
    size = _batch_rows(count, rows_per_batch(batch_size, width, tokens_per_batch))
    dispatched = []
    for start in range(0, count, size):
        part = {key: value[start:start + size] for key, value in rows.items()}
        extra = size - len(part["input_ids"])
        if extra:
            part = {key: np.concatenate([value, np.repeat(value[-1:], extra, axis=0)]) for key, value in part.items()}
        dispatched.append((start, size - extra, forward(part)))
    out = None
    for start, real, result in dispatched:
        result = np.asarray(result, np.float32)
        if out is None:
            out = np.zeros([count, width, result.shape[-1]], np.float32)
        out[start:start + real] = result[:real]
    return out


def buckets(limit: int) -> list[int]:
    """The row widths below `limit`, and `limit`: steps of MIN_BUCKET, then BUCKETS_PER_DOUBLING widths
    per doubling. A batch of one text a row is as wide as its longest text's bucket, so finer widths
    compute fewer padding tokens (docs/performance.md: "Sentence embeddings") at the price of a few more
    shapes to compile."""
    widths, width = [], MIN_BUCKET
    while width < limit:
        widths.append(width)
        width += max(MIN_BUCKET, (1 << (width.bit_length() - 1)) // BUCKETS_PER_DOUBLING)
    return widths + [limit]


def _bucket(length: int, widths: list[int]) -> int:
    return next(w for w in widths if w >= length)


def _batch_rows(num_rows: int, batch_size: int) -> int:
    """Rows a batch is padded to: a power of two up to batch_size."""
    rows = 1
    while rows < num_rows and rows < batch_size:
        rows *= 2
    return min(rows, batch_size)


def rows_per_batch(batch_size: int, width: int, tokens_per_batch: int | None) -> int:
    """batch_size, or fewer rows where a budget of tokens says so: the largest power of two whose rows of
    `width` stay within it (at least one row)."""
    if tokens_per_batch is None or width * batch_size <= tokens_per_batch:
        return batch_size
    rows = 1
    while rows * 2 * width <= tokens_per_batch:
        rows *= 2
    return rows


def plan(lengths: np.ndarray, batch_size: int, limit: int,
         tokens_per_batch: int | None = None) -> list[tuple[np.ndarray, int]]:
    """Batches as (text indices int64 [R, K] with -1 at empty slots, row width S), every text once.

    Longer texts (more than half the packing width) go one a row, longest first, each batch as wide as
    the smallest bucket that holds its longest; the shorter ones share rows of the packing width (or of
    the smallest bucket that holds them all, when they are few). tokens_per_batch: None, or the most
    row tokens (R x S) a batch of more than one row may hold."""
    widths = buckets(limit)
    pack_width = _bucket(min(PACK_WIDTH, limit), widths)
    order = np.argsort(-lengths, kind="stable")
    short = lengths[order] <= pack_width // 2
    alone, shared = order[~short], order[short]
    batches, start = [], 0
    while start < len(alone):  # each batch as wide as its first (longest) text's bucket
        width = _bucket(int(lengths[alone[start]]), widths)
        size = rows_per_batch(batch_size, width, tokens_per_batch)
        members = alone[start:start + size]
        rows = np.full([_batch_rows(len(members), size), 1], -1, np.int64)
        rows[:len(members), 0] = members
        batches.append((rows, width))
        start += size
    if len(shared):
        total = int(lengths[shared].sum())
        width = pack_width if total >= pack_width else _bucket(total, widths)
        k = max(1, width // MIN_PACKED_TOKENS)
        packed = packing.pack_rows(lengths[shared], np.zeros(len(shared), np.int64), max_tokens=width,
                                   max_predictions=1, max_sequences=k, window=PACK_WINDOW)
        packed = np.where(packed >= 0, shared[np.maximum(packed, 0)], -1)  # [rows, K] text indices
        size = rows_per_batch(batch_size, width, tokens_per_batch)
        for start in range(0, len(packed), size):
            part = packed[start:start + size]
            rows = np.full([_batch_rows(len(part), size), k], -1, np.int64)
            rows[:len(part)] = part
            batches.append((rows, width))
    return batches


def assemble(rows: list[list[int]], prompt_lengths: np.ndarray, members: np.ndarray, width: int,
             pad_id: int) -> dict[str, np.ndarray]:
    """One batch's arrays: input_ids, segment_ids, input_mask [R, S], prompt_lengths ([R] one text a row,
    else [R, K]) and, for packed rows, sequence_ids, position_ids [R, S] and cls_positions [R, K]."""
    num_rows, k = members.shape
    batch = {"input_ids": np.full([num_rows, width], pad_id, np.int32),
             "input_mask": np.zeros([num_rows, width], np.int32)}
    batch["segment_ids"] = np.zeros_like(batch["input_ids"])
    sequence_ids, position_ids = np.zeros_like(batch["input_ids"]), np.zeros_like(batch["input_ids"])
    cls_positions, prompts = np.zeros([num_rows, k], np.int32), np.zeros([num_rows, k], np.int32)
    for r in range(num_rows):
        start = 0
        for slot, i in enumerate(members[r]):
            if i < 0:
                break
            ids = rows[i]
            end = start + len(ids)
            batch["input_ids"][r, start:end], batch["input_mask"][r, start:end] = ids, 1
            sequence_ids[r, start:end], position_ids[r, start:end] = slot + 1, np.arange(len(ids))
            cls_positions[r, slot], prompts[r, slot] = start, prompt_lengths[i]
            start = end
    if k == 1:
        return {**batch, "prompt_lengths": prompts[:, 0]}
    return {**batch, "prompt_lengths": prompts, "sequence_ids": sequence_ids, "position_ids": position_ids,
            "cls_positions": cls_positions}


def embed_rows(forward: Callable[[dict], object], rows: list[list[int]], prompt_lengths: np.ndarray,
               batch_size: int, limit: int, pad_id: int, tokens_per_batch: int | None = None) -> np.ndarray:
    """Embeddings float32 [N, D] of token rows ([CLS] ... [SEP], each at most `limit` long), in their
    order. forward(batch) -> [R, D] for one text a row, [R, K, D] for packed rows: device arrays, read
    back after every batch is dispatched, so that the host lays out the next batch while one computes."""
    lengths = np.array([len(r) for r in rows], np.int64)
    dispatched = [(members, forward(assemble(rows, prompt_lengths, members, width, pad_id)))
                  for members, width in plan(lengths, batch_size, limit, tokens_per_batch)]
    out = None
    for members, result in dispatched:
        result = np.asarray(result, np.float32)
        result = result.reshape(members.shape + result.shape[-1:])  # [R, K, D]
        if out is None:
            out = np.zeros([len(rows), result.shape[-1]], np.float32)
        taken = members >= 0
        out[members[taken]] = result[taken]
    return out
