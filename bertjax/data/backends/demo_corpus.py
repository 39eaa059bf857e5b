"""data.source=demo: the built-in demo corpus (bertjax/data/demo.py), Python's own documentation. No
settings: it is English, split by the default splitter whatever data.sentence_splitter says."""

from collections.abc import Iterator

from bertjax.data import demo, splits
from bertjax.data.backends.backend import Backend, BadRows, require_documents


def shard_documents(settings, split, shard: int, num_shards: int, bad_rows: BadRows) -> Iterator[list[str]]:
    return splits.share(demo.demo_documents(), shard, num_shards)


def documents(settings, split, bad_rows: BadRows) -> Iterator[list[str]]:
    return require_documents(demo.demo_documents(), "data.source='demo'")


BACKEND = Backend(name="demo", reads="the documentation that ships with Python, no download",
                  documents=documents, shard=shard_documents)
