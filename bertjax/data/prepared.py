"""The prepared-corpus format: tokenized documents as flat .npy arrays per split and shard, memory-mapped.

    DIR/metadata.json                                format_version, tokenizer, vocabulary file, lower_case,
                                                     num_shards, eval_fraction, token dtype, the source
                                                     prepared; once every shard is written, the counts
    DIR/<vocabulary file>                            a copy, so the directory is self-contained
    DIR/train-00003-of-00016.tokens.npy              [T] uint16 (vocabulary <= 65,536 pieces) or uint32
    DIR/train-00003-of-00016.sentence_starts.npy     [S + 1] int64 offsets of the sentences in tokens
    DIR/train-00003-of-00016.doc_starts.npy          [D + 1] int64 offsets of the documents in sentences
    DIR/eval-00003-of-00016.*.npy                    the held-out documents, the same three arrays

These are a shard's TokenizedCorpus as it is in memory, so training maps them (np.load mmap_mode="r")
instead of loading them: the pages of tokens a batch reads are read from disk then, and the operating
system may drop them again. Host p of P maps the shards k with k % P == p; their token maps stay
separate (TokenShards reads a range across them), and only the offsets, which are small, are joined in
memory. Directories of the older TFRecord format (no format_version) are refused with a line saying
to prepare them again.
"""

import json
import os

import numpy as np

from bertjax.data import splits
from bertjax.data.corpus import TokenizedCorpus

METADATA = "metadata.json"
SPLITS = ("train", "eval")
ARRAYS = ("tokens", "sentence_starts", "doc_starts")
FORMAT_VERSION = 2


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (BERT's 30,522 pieces do): half of uint32's disk and page cache."""
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32)


def array_path(directory: str, split: str, shard: int, num_shards: int, array: str) -> str:
    return os.path.join(directory, f"{split}-{shard:05d}-of-{num_shards:05d}.{array}.npy")


def shard_files(directory: str, shard: int, num_shards: int) -> list[str]:
    """Every file of one output shard, both splits."""
    return [array_path(directory, split, shard, num_shards, a) for split in SPLITS for a in ARRAYS]


def shard_complete(directory: str, shard: int, num_shards: int) -> bool:
    """Each file is written beside and renamed, so a shard whose files all exist is complete."""
    return all(os.path.exists(p) for p in shard_files(directory, shard, num_shards))


def _save(path: str, array: np.ndarray) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def write_shard(directory: str, split: str, shard: int, num_shards: int, corpus: TokenizedCorpus | None,
                dtype: np.dtype) -> None:
    """One split of one shard as its three arrays (None: a split with no documents)."""
    if corpus is None:
        arrays = dict(tokens=np.zeros(0, dtype), sentence_starts=np.zeros(1, np.int64),
                      doc_starts=np.zeros(1, np.int64))
    else:
        arrays = dict(tokens=np.asarray(corpus.tokens).astype(dtype), sentence_starts=corpus.sentence_starts,
                      doc_starts=corpus.doc_starts)
    for name in ARRAYS:
        _save(array_path(directory, split, shard, num_shards, name), np.asarray(arrays[name]))


def shard_counts(directory: str, split: str, shard: int, num_shards: int) -> tuple[int, int, int]:
    """(documents, sentences, tokens) of a written shard, from the arrays' headers."""
    shapes = [np.load(array_path(directory, split, shard, num_shards, a), mmap_mode="r").shape[0] for a in ARRAYS]
    return shapes[2] - 1, shapes[1] - 1, shapes[0]


def write_metadata(directory: str, meta: dict) -> None:
    """metadata.json, written beside and renamed; sorted keys so that the same corpus gives the same bytes."""
    path = os.path.join(directory, METADATA)
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)


def read_metadata(directory: str) -> dict:
    if "://" in directory:
        raise ValueError(f"data.prepared_dir={directory}: prepared corpora are memory-mapped, so they must be on "
                         f"a local (or mounted, e.g. gcsfuse) file system: copy the directory to the host")
    path = os.path.join(directory, METADATA)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: is data.prepared_dir a directory written by bertjax.prepare?")
    with open(path) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{directory} holds prepared shards of an older format (TFRecord): run python -m "
                         f"bertjax.prepare again into a fresh --output_dir (the new shards are memory-mapped)")
    return meta


def vocab_file(directory: str, meta: dict) -> str:
    return os.path.join(directory, meta["vocab"])


class TokenShards:
    """Several shards' token maps read as one flat array, without copying them.

    len() and [start:stop] (an ndarray, read across shard boundaries where the range crosses them),
    which is all the stream and the plans read. np.asarray() reads the whole of it (tests).
    """

    def __init__(self, parts: list[np.ndarray]):
        self.parts = parts
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        self.dtype = parts[0].dtype
        self.shape = (int(self.starts[-1]),)
        self.ndim = 1

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("TokenShards reads contiguous ranges only")
            pieces = []
            k = int(np.searchsorted(self.starts, start, side="right")) - 1
            while start < stop:
                end = min(stop, int(self.starts[k + 1]))
                pieces.append(self.parts[k][start - self.starts[k]:end - self.starts[k]])
                start, k = end, k + 1
            return np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)
        i = int(index) + (len(self) if int(index) < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(f"token {index} of {len(self)}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - self.starts[k]]

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)


def load_corpus(directory: str, split: str, process_index: int, process_count: int) -> TokenizedCorpus:
    """This host's shards of one split, memory-mapped -> TokenizedCorpus (documents in shard order).

    One shard: its three maps as they are. Several: the token maps behind a TokenShards, the offsets
    joined (shifted by the tokens and sentences before each shard) in memory.
    """
    meta = read_metadata(directory)
    num_shards = meta["num_shards"]
    if num_shards < process_count:
        raise ValueError(
            f"{directory} has {num_shards} shards for {process_count} processes: prepare it again with "
            f"--num_shards a multiple of {process_count}"
        )
    shards = list(splits.share(range(num_shards), process_index, process_count))
    missing = [k for k in shards if not shard_complete(directory, k, num_shards)]
    if missing:
        raise FileNotFoundError(f"prepared shard {array_path(directory, split, missing[0], num_shards, 'tokens')} is "
                                f"missing ({len(missing)} of {len(shards)} shards incomplete): run prepare again "
                                f"with the same settings to finish it")
    maps = []
    for k in shards:
        arrays = {a: np.load(array_path(directory, split, k, num_shards, a), mmap_mode="r") for a in ARRAYS}
        if arrays["tokens"].dtype != np.dtype(meta["dtype"]):
            raise ValueError(f"{array_path(directory, split, k, num_shards, 'tokens')} holds {arrays['tokens'].dtype}, "
                             f"metadata.json says {meta['dtype']}: prepare the directory again")
        if len(arrays["doc_starts"]) > 1:  # a shard without documents of this split adds nothing
            maps.append(arrays)
    if not maps:
        raise ValueError(f"the {split} shards of host {process_index} in {directory} hold no documents")
    if len(maps) == 1:
        return TokenizedCorpus(maps[0]["tokens"], maps[0]["sentence_starts"], maps[0]["doc_starts"])
    token_offsets = np.cumsum([0] + [len(m["tokens"]) for m in maps])
    sentence_offsets = np.cumsum([0] + [len(m["sentence_starts"]) - 1 for m in maps])
    sentence_starts = np.concatenate([m["sentence_starts"][:-1] + t for m, t in zip(maps, token_offsets)]
                                     + [token_offsets[-1:]]).astype(np.int64)
    doc_starts = np.concatenate([m["doc_starts"][:-1] + s for m, s in zip(maps, sentence_offsets)]
                                + [sentence_offsets[-1:]]).astype(np.int64)
    return TokenizedCorpus(TokenShards([m["tokens"] for m in maps]), sentence_starts, doc_starts)
