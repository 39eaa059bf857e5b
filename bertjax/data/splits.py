"""How a corpus is divided: among hosts and shards by position (`share`), and into training and
held-out documents by content (`is_eval_document`).

Every split across processes goes through `share`: training hosts taking documents or prepared shards,
prepare's output shards taking files, Parquet row groups or documents. So a host's documents are the
same whichever path (in memory, or prepared with --num_shards a multiple of the hosts) reads them.
"""

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def share(items: Iterable[T], index: int, count: int) -> Iterator[T]:
    """Share `index` of `count`: items i with i % count == index, lazily.

    Interleaving rather than contiguous blocks keeps the shares alike when the items are ordered (by
    topic, by source file, by date), and needs no length: a stream of documents is split as it is read.
    """
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count} does not exist: the index must lie in [0, {count})")
    return itertools.islice(items, index, None, count)


def is_eval_document(sentences: list[str], eval_fraction: float) -> bool:
    """Whether a document belongs to the held-out evaluation split.

    A document is held out iff the hash of its text, as a number in [0, 1), is below
    `eval_fraction`. The decision depends on the document alone, not on its position, file or
    shard, so no way of splitting or ordering the corpus can leak an eval document into training,
    and identical copies of a document land on the same side. It does depend on the sentence
    boundaries: reading the same files with another text_format may move documents across.
    """
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be between 0 and 1")
    digest = hashlib.blake2b("\n".join(sentences).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < eval_fraction * 2.0**64
