"""A host's tokenized documents as three flat arrays (`TokenizedCorpus`), and its builders. No
TensorFlow here: the tokenizer is handed lists of strings and its flat output is kept.

Sentences are contiguous token ranges, documents contiguous sentence ranges, so every segment an
objective cuts is one range of `tokens` (bertjax/data/plans.py) and no token is copied per example.
"""

import dataclasses
from typing import Iterable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """A host's documents, tokenized, in three flat arrays.

    tokens:          [num_tokens] token ids of all sentences, back to back
    sentence_starts: [num_sentences + 1] offset of each sentence in tokens (last = num_tokens)
    doc_starts:      [num_documents + 1] offset of each document in sentences (last = num_sentences)

    The arrays are in memory, or memory-mapped from a prepared corpus (prepared.load_corpus): then
    tokens is an np.memmap, or a prepared.TokenShards over several shards' maps; either is read only
    by len() and [start:stop].
    """

    tokens: np.ndarray
    sentence_starts: np.ndarray
    doc_starts: np.ndarray

    @property
    def in_memory(self) -> bool:
        """The tokens are an array in RAM (not a map of files): the stream may copy them into TensorFlow."""
        return isinstance(self.tokens, np.ndarray) and not isinstance(self.tokens, np.memmap)

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_starts) - 1

    def document(self, d: int) -> list[np.ndarray]:
        """The sentences of document d, as token arrays (for tests and previews)."""
        s0, s1 = self.doc_starts[d], self.doc_starts[d + 1]
        return [self.tokens[self.sentence_starts[s]:self.sentence_starts[s + 1]] for s in range(s0, s1)]


def corpus_from_lengths(tokens: np.ndarray, sentence_lengths: np.ndarray, sentence_document: np.ndarray,
                        vocab_size: int) -> TokenizedCorpus:
    """All tokens in order, each sentence's length and each sentence's document index -> TokenizedCorpus.

    Sentences without tokens and documents without sentences are dropped: they can take part in no pair.
    """
    kept = sentence_lengths > 0
    doc_sizes = np.bincount(sentence_document[kept], minlength=1)
    doc_sizes = doc_sizes[doc_sizes > 0]
    if not len(doc_sizes):
        raise ValueError("the corpus has no document with a non-empty sentence after tokenization")
    # uint16 halves the host memory of a corpus whenever the vocabulary fits (BERT's 30,522 does).
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    sentence_starts = np.concatenate([[0], np.cumsum(sentence_lengths[kept])]).astype(np.int64)
    doc_starts = np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64)
    return TokenizedCorpus(tokens.astype(dtype), sentence_starts, doc_starts)


def _document_index(documents: Sequence[Sequence]) -> np.ndarray:
    """For each sentence, in order, the index of its document."""
    return np.repeat(np.arange(len(documents)), [len(doc) for doc in documents])


def corpus_from_token_lists(documents: Iterable[Sequence[Sequence[int]]], vocab_size: int) -> TokenizedCorpus:
    """Documents given as lists of sentences of token ids -> TokenizedCorpus (see corpus_from_lengths)."""
    documents = list(documents)
    sentences = [np.asarray(s, np.int64) for doc in documents for s in doc]
    tokens = np.concatenate(sentences) if sentences else np.zeros(0, np.int64)
    lengths = np.array([len(s) for s in sentences], np.int64)
    return corpus_from_lengths(tokens, lengths, _document_index(documents), vocab_size)


def tokenize_documents(documents: Iterable[list[str]], tokenizer, batch_sentences: int = 4096) -> TokenizedCorpus:
    """Documents of sentence strings -> TokenizedCorpus, tokenizing many sentences per TF call and
    keeping the tokenizer's flat output (no per-sentence arrays)."""
    documents = list(documents)
    sentences = [s for doc in documents for s in doc]
    values, lengths = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i in range(0, len(sentences), batch_sentences):
        ragged = tokenizer.tokenize(sentences[i:i + batch_sentences])  # [n] strings -> ragged ids
        values.append(ragged.flat_values.numpy())
        lengths.append(np.diff(ragged.row_splits.numpy()))
    return corpus_from_lengths(np.concatenate(values), np.concatenate(lengths), _document_index(documents),
                               tokenizer.vocab_size)
