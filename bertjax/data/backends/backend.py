"""What every corpus backend exports: one `Backend` record. Also what their readers share: the count of
table rows skipped as not text (`BadRows`) and the check that a source gave any document.

A backend gives one of three things, and its record says which by the functions it fills in:
raw documents (`documents`, and `shard` for python -m bertjax.prepare), a host's corpora tokenized
already (`corpora`: prepared shards), or nothing at all (synthetic batches, made without a corpus).
A document is a `list[str]` of sentences, each non-empty, stripped, whitespace runs collapsed.
"""

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from bertjax.data.corpus import TokenizedCorpus

# (settings, split, bad_rows) -> the source's documents, lazily; its settings are checked at the call.
Documents = Callable[..., Iterator[list[str]]]
# (settings, split, shard, num_shards, bad_rows) -> the documents of prepare's output shard `shard`.
Shard = Callable[..., Iterable[list[str]]]
# (settings, process_index, process_count) -> HostCorpora.
Corpora = Callable[..., "HostCorpora"]
# (settings) -> None: what the source reads is there (files match, a directory exists), found cheaply before
# a run builds anything; raises the source's own one line when it is not.
Locate = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Backend:
    """One corpus source, as the table in bertjax/data/backends/__init__.py lists it.

    keys: the data keys it reads. A data.mixture entry of this source may set them; one that defaults
    to None (a path, a name) is refused when set under another source that does not read it.
    cache_keys: those of `keys` that say where a cache is rather than which documents: left out of
    a prepared directory's metadata.json, which records what the shards are a function of.
    """

    name: str
    reads: str  # what it reads, in a few words
    keys: tuple[str, ...] = ()
    cache_keys: tuple[str, ...] = ()
    documents: Documents | None = None
    shard: Shard | None = None
    corpora: Corpora | None = None
    locate: Locate | None = None


@dataclasses.dataclass(frozen=True)
class HostCorpora:
    """A host's training and held-out corpora as a backend gives them tokenized, and the vocabulary
    they were tokenized with (a file of the backend's own)."""

    train: TokenizedCorpus
    eval: TokenizedCorpus
    tokenizer: str  # wordpiece | sentencepiece
    vocab_path: str
    lower_case: bool


class BadRows:
    """Rows of a table that were skipped because their value is not readable text: a null, a null
    sentence inside a sentences list, or bytes that are not UTF-8. All are counted; the first few
    are kept as "file:row: reason" (rows numbered from 0 within their file) for the summary line."""

    def __init__(self, keep: int = 5):
        self.count, self.keep, self.first = 0, keep, []

    def add(self, file: str, row: int, reason: str) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(f"{file}:{row}: {reason}")

    def summary(self) -> str:
        """One line: how many rows were skipped, and the first few; "" when none were."""
        if not self.count:
            return ""
        more = f"; and {self.count - len(self.first)} more" if self.count > len(self.first) else ""
        return f"skipped {self.count} bad row{'s' * (self.count != 1)}: {'; '.join(self.first)}{more}"


def require_documents(
    documents: Iterable[list[str]], what: str, *, check: str = "that the input is not empty",
    bad_rows: BadRows | None = None,
) -> Iterator[list[str]]:
    """Passes `documents` through lazily, and raises at the end if there were none (saying which rows
    were skipped as bad, when there were).

    An empty corpus would otherwise surface much later as an empty or endlessly waiting pipeline.
    """
    empty = True
    for document in documents:
        empty = False
        yield document
    if empty:
        skipped = f" ({bad_rows.summary()})" if bad_rows is not None and bad_rows.count else ""
        raise ValueError(f"{what} yielded no documents{skipped}: check {check}")
