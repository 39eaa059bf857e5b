"""Epoch plans: an epoch's examples as token ranges of a TokenizedCorpus, in numpy, before a token is
touched. A plan is int64 [N, 5], one row per example:

    A_START, A_END   segment A, a range of the corpus's flat tokens (FULL-SENTENCES: the row's range of
                     the stream with a separator after each document)
    B_START, B_END   segment B (FULL-SENTENCES: 0)
    LABEL            NSP's is-random-next, SOP's is-swapped, 0 for FULL-SENTENCES

Every segment of a pair -- A, the real continuation, a random next segment, each after truncation -- is
one contiguous range, so a plan is light metadata and resuming builds one plan (docs/data.md). Each plan
is drawn from random.Random seeded by (seed, epoch, host) and shuffled. bertjax/data/objectives.py names
them.
"""

import random

import numpy as np

from bertjax.data.corpus import TokenizedCorpus

# Columns of a plan row. The label column is NSP's is-random-next, SOP's is-swapped, 0 for "none".
A_START, A_END, B_START, B_END, IS_RANDOM_NEXT = range(5)
LABEL = IS_RANDOM_NEXT


def truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """truncate_seq_pair on [start, end) ranges: trim the longer segment, from the front or the back
    with probability 1/2 each, until the pair fits. Trimming the front too keeps the model from
    learning that a segment always ends a sentence."""
    while (a[1] - a[0]) + (b[1] - b[0]) > max_num_tokens:
        seg = a if (a[1] - a[0]) > (b[1] - b[0]) else b
        if rng.random() < 0.5:
            seg[0] += 1
        else:
            seg[1] -= 1


def build_epoch_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int, max_seq_length: int,
                     short_seq_prob: float) -> np.ndarray:
    """All NSP pairs of one epoch of this host's shard, shuffled: int64 [num_pairs, 5] token ranges.

    The algorithm is create_instances_from_document of the original release, document by document:
    whole sentences fill a chunk up to a target length (max_seq_length - 3, or with probability
    short_seq_prob a random shorter one, so that the model also sees the short inputs of fine-tuning);
    A is a random prefix of the chunk; B is the rest of the chunk, or -- for half of the pairs, and
    always when the chunk is a single sentence -- text from a random other document of the whole shard,
    in which case the chunk's unused sentences go back to be used by the next pair.
    """
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    # random.Random seeded by a string is stable across platforms and Python versions.
    rng = random.Random(f"bertjax-pairs:{seed}:{epoch}:{shard}")
    starts = corpus.sentence_starts.tolist()
    doc_starts = corpus.doc_starts.tolist()
    num_docs = len(doc_starts) - 1
    plan: list[tuple[int, int, int, int, int]] = []
    for d in range(num_docs):
        first, last = doc_starts[d], doc_starts[d + 1]  # sentence range of the document
        target = max_num_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk_start, i = first, first
        while i < last:
            chunk_end = i + 1  # the chunk is sentences [chunk_start, chunk_end)
            if chunk_end < last and starts[chunk_end] - starts[chunk_start] < target:
                i += 1
                continue
            num_chunk = chunk_end - chunk_start
            a_end = chunk_start + (rng.randint(1, num_chunk - 1) if num_chunk >= 2 else 1)
            a = [starts[chunk_start], starts[a_end]]
            if num_chunk == 1 or rng.random() < 0.5:
                is_random = 1
                target_b = target - (a[1] - a[0])
                for _ in range(10):  # a different document, if the shard has one
                    other = rng.randint(0, num_docs - 1)
                    if other != d:
                        break
                o_first, o_last = doc_starts[other], doc_starts[other + 1]
                j = rng.randint(o_first, o_last - 1)
                b_first = j
                while True:  # whole sentences until B reaches its target
                    j += 1
                    if starts[j] - starts[b_first] >= target_b or j == o_last:
                        break
                b = [starts[b_first], starts[j]]
                i = a_end  # the chunk's unused sentences are put back
            else:
                is_random = 0
                b = [starts[a_end], starts[chunk_end]]
                i = chunk_end
            truncate_pair(a, b, max_num_tokens, rng)
            plan.append((a[0], a[1], b[0], b[1], is_random))
            chunk_start = i
    rng.shuffle(plan)
    return np.asarray(plan, dtype=np.int64).reshape(-1, 5)


def build_sop_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int, max_seq_length: int,
                   short_seq_prob: float) -> np.ndarray:
    """All sentence-order pairs of one epoch (ALBERT, Lan et al. 2020), shuffled: int64 [num_pairs, 5].

    Chunks, targets, A's split point and truncation are NSP's real-continuation case; B is always the
    rest of the chunk, never another document's text, so that the only signal is the order (a topic
    shift would give NSP's shortcut back). With probability 1/2 the two are swapped: the row then lists
    the later segment first and its label is 1. A chunk of one sentence gives no pair (ALBERT would take
    a random document there); the next chunk starts after it.
    """
    max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
    rng = random.Random(f"bertjax-sop:{seed}:{epoch}:{shard}")
    starts = corpus.sentence_starts.tolist()
    doc_starts = corpus.doc_starts.tolist()
    plan: list[tuple[int, int, int, int, int]] = []
    for d in range(len(doc_starts) - 1):
        first, last = doc_starts[d], doc_starts[d + 1]
        target = max_num_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk_start = first
        for chunk_end in range(first + 1, last + 1):  # the chunk is sentences [chunk_start, chunk_end)
            if chunk_end < last and starts[chunk_end] - starts[chunk_start] < target:
                continue
            num_chunk = chunk_end - chunk_start
            if num_chunk >= 2:
                a_end = chunk_start + rng.randint(1, num_chunk - 1)
                a, b = [starts[chunk_start], starts[a_end]], [starts[a_end], starts[chunk_end]]
                swapped = rng.random() < 0.5
                if swapped:  # as ALBERT's code: swap, then truncate the pair as the model sees it
                    a, b = b, a
                truncate_pair(a, b, max_num_tokens, rng)
                plan.append((a[0], a[1], b[0], b[1], int(swapped)))
            chunk_start = chunk_end
    rng.shuffle(plan)
    return np.asarray(plan, dtype=np.int64).reshape(-1, 5)


def document_separators(corpus: TokenizedCorpus) -> np.ndarray:
    """Where the [SEP] between documents stand in the FULL-SENTENCES stream: the flat tokens with one
    separator after every document but the last. int64 [num_documents - 1], ascending."""
    doc_token_ends = corpus.sentence_starts[corpus.doc_starts[1:-1]]
    return doc_token_ends + np.arange(len(doc_token_ends), dtype=np.int64)


def build_full_sentences_plan(corpus: TokenizedCorpus, *, seed: int, epoch: int, shard: int, max_seq_length: int,
                              short_seq_prob: float | None = None) -> np.ndarray:
    """The FULL-SENTENCES rows of one epoch (RoBERTa, Liu et al. 2019), shuffled: int64 [num_rows, 5].

    The corpus, an extra separator between documents, is cut into consecutive blocks of
    max_seq_length - 2 tokens ([CLS] ... [SEP]): every row is full but the corpus's last, and rows cross
    document boundaries instead of padding. A row is [start, end) in that stream (A_START, A_END); the
    other columns are 0. Cut points are the same every epoch; the order and the masks are not.
    short_seq_prob does not apply (it is taken so that every plan is built with the same arguments).
    """
    budget = max_seq_length - 2
    total = len(corpus.tokens) + corpus.num_documents - 1
    plan = np.zeros([-(-total // budget), 5], np.int64)
    plan[:, A_START] = np.arange(0, total, budget)
    plan[:, A_END] = np.minimum(plan[:, A_START] + budget, total)
    order = list(range(len(plan)))
    random.Random(f"bertjax-full-sentences:{seed}:{epoch}:{shard}").shuffle(order)
    return plan[order]
