"""data.source=prepared: the shards python -m bertjax.prepare wrote (bertjax/data/prepared.py),
tokenized already and memory-mapped. Host p of P maps the shards k with k % P == p, and tokenizes
nothing: the directory carries its vocabulary."""

from bertjax.data import prepared
from bertjax.data.backends.backend import Backend, HostCorpora


def corpora(settings, process_index: int, process_count: int) -> HostCorpora:
    if not settings.prepared_dir:
        raise ValueError("data.source='prepared' needs data.prepared_dir (written by python -m bertjax.prepare)")
    meta = prepared.read_metadata(settings.prepared_dir)
    return HostCorpora(
        train=prepared.load_corpus(settings.prepared_dir, "train", process_index, process_count),
        eval=prepared.load_corpus(settings.prepared_dir, "eval", process_index, process_count),
        tokenizer=meta["tokenizer"], vocab_path=prepared.vocab_file(settings.prepared_dir, meta),
        lower_case=meta["lower_case"],
    )


def _locate(settings) -> None:
    if not settings.prepared_dir:
        raise ValueError("data.source='prepared' needs data.prepared_dir (written by python -m bertjax.prepare)")
    prepared.read_metadata(settings.prepared_dir)


BACKEND = Backend(name="prepared", reads="shards written by python -m bertjax.prepare, memory-mapped",
                  keys=("prepared_dir",), corpora=corpora, locate=_locate)
