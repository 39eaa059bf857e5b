"""From the config's data section to the streams an entry program consumes.

    documents (demo | text | tfds | parquet | hf_datasets | prepared shards)
      -> this host's share                     (document i belongs to host i % process_count)
      -> held-out split                         (a stable hash of each document: training never sees it)
      -> tokenizer                              (data.vocab_path, or learned once and cached in the workdir)
      -> TokenizedCorpus -> PretrainingStream   (train and eval; data.objective: nsp | sop | none;
                                                 data.packing: several examples per row)
      data.mixture: each source its own corpus and stream, interleaved by weight (bertjax.data.mixture)

Entry programs (train, data.preview, the benchmark) call build_inputs(config.data, ...); everything
below it takes explicit arguments.
"""

import contextlib
import dataclasses
import json
import os
import tempfile
from typing import Iterable, Iterator, Sequence, TypeVar

from absl import logging
from etils import epath

from bertjax.data import mixture as mixing
from bertjax.data import prepared
from bertjax.data import pretraining as pt
from bertjax.data import sources
from bertjax.text import files
from bertjax.text import tokenizers
from bertjax.text import vocab as vocabularies

T = TypeVar("T")


def host_documents(documents: Iterable[T], process_index: int, process_count: int) -> list[T]:
    """This host's share: every process_count-th document from process_index on.

    Interleaving rather than contiguous blocks keeps the shares alike when a corpus is ordered
    (by topic, by source file, by date).
    """
    return [d for i, d in enumerate(documents) if i % process_count == process_index]


@dataclasses.dataclass
class PretrainingInputs:
    tokenizer: object
    train: pt.PretrainingStream | mixing.MixtureStream
    eval: pt.PretrainingStream | mixing.MixtureStream
    vocab_path: str  # the tokenizer's file, recorded in checkpoints so bertjax.load finds it
    bad_rows: sources.BadRows = dataclasses.field(default_factory=sources.BadRows)  # table rows skipped

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[dict]:
        """numpy batches of this host's examples, from step start_step on, without end."""
        return self.train.dataset(batch_size, start_step=start_step).as_numpy_iterator()

    def eval_batches(self, batch_size: int, num_batches: int) -> list[dict]:
        """The fixed held-out batches: the same examples and masks at every evaluation."""
        return list(self.eval.dataset(batch_size).take(num_batches).as_numpy_iterator())


def read_source_documents(data, bad_rows: sources.BadRows | None = None) -> Iterator[list[str]]:
    """The documents of the configured raw-text source (demo, text files, TFDS, Parquet, HF datasets);
    table rows that are not text are skipped into `bad_rows`."""
    return sources.read_documents(
        data.source,
        input_pattern=data.input_pattern,
        text_format=data.text_format,
        text_field=data.text_field,
        tfds_name=data.tfds_name,
        tfds_split=data.tfds_split,
        tfds_text_feature=data.tfds_text_feature,
        tfds_data_dir=data.tfds_data_dir,
        # Configs written before these keys existed read no table.
        text_column=data.get("text_column", "text"),
        sentences_column=data.get("sentences_column"),
        hf_dataset_path=data.get("hf_dataset_path"),
        hf_dataset_name=data.get("hf_dataset_name"),
        hf_dataset_split=data.get("hf_dataset_split", "train"),
        sentence_splitter=data.sentence_splitter,
        bad_rows=bad_rows,
    )


# What a data.mixture entry may set besides its weight: where and how its documents are read. The
# recipe (tokenizer, lengths, masking, objective, packing, seed, held-out share) is the data section's,
# shared by all sources: their elements are interleaved into the same batches.
MIXTURE_SOURCES = ("demo", "text", "tfds", "parquet", "hf_datasets")
MIXTURE_KEYS = ("source", "input_pattern", "text_format", "text_field", "sentence_splitter", "tfds_name",
                "tfds_split", "tfds_text_feature", "tfds_data_dir", "text_column", "sentences_column",
                "hf_dataset_path", "hf_dataset_name", "hf_dataset_split")


def mixture_sources(data) -> list[tuple[object, float]]:
    """(the data section as source k sees it, weight k) for each data.mixture entry; [] without a
    mixture. An entry sets `source`, `weight` and any of MIXTURE_KEYS; the rest is the data section's."""
    entries = data.get("mixture") or ()
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"data.mixture={entries!r}: give a tuple of dicts, each with source= and weight=")
    result = []
    for k, entry in enumerate(entries):
        entry = dict(entry) if hasattr(entry, "keys") else entry
        if not isinstance(entry, dict):
            raise ValueError(f"data.mixture[{k}]={entry!r}: give a dict with source and weight, e.g. "
                             f"{{'source': 'text', 'input_pattern': 'books/*.txt', 'weight': 0.2}}")
        if "source" not in entry or "weight" not in entry:
            raise ValueError(f"data.mixture[{k}]={entry!r} needs both source= and weight=")
        if entry["source"] not in MIXTURE_SOURCES:
            raise ValueError(f"data.mixture[{k}] source={entry['source']!r}: choose one of "
                             f"{', '.join(MIXTURE_SOURCES)}")
        weight = entry.pop("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise ValueError(f"data.mixture[{k}] weight={weight!r}: set a number above 0 (weights are relative: "
                             f"0.8 and 0.2, or 4 and 1)")
        unknown = sorted(set(entry) - set(MIXTURE_KEYS))
        if unknown:
            shared = [key for key in unknown if key in data]
            why = (f"{', '.join(shared)} belong{'s' * (len(shared) == 1)} to the recipe the sources share: set "
                   f"them in data" if shared else f"it may set {', '.join(MIXTURE_KEYS)}")
            raise ValueError(f"data.mixture[{k}] sets {', '.join(unknown)}: {why}")
        source_data = data.copy_and_resolve_references()
        with source_data.unlocked():
            source_data.mixture = ()
            for key, value in entry.items():
                try:
                    source_data[key] = value
                except TypeError:
                    raise ValueError(f"data.mixture[{k}] {key}={value!r}: data.{key} is "
                                     f"{type(source_data[key]).__name__}") from None
        result.append((source_data, float(weight)))
    return result


def vocabulary_path(data, workdir: str | None) -> str:
    """Where the tokenizer's vocabulary is: data.vocab_path, or the one learned into the workdir."""
    if data.vocab_path:
        return data.vocab_path
    if not workdir:
        raise ValueError("data.vocab_path is not set and there is no workdir to learn a vocabulary into")
    if data.tokenizer not in files.VOCAB_FILES:
        raise ValueError(f"data.tokenizer={data.tokenizer!r}: choose {' or '.join(files.VOCAB_FILES)}")
    name = files.VOCAB_FILES[data.tokenizer]
    return files.join(workdir, name) if files.is_remote(workdir) else os.path.join(workdir, name)


def load_or_learn_tokenizer(data, workdir: str | None, train_documents: Sequence[list[str]] | None):
    """The configured tokenizer and the path of its vocabulary. Without data.vocab_path, a vocabulary of
    data.vocab_size is learned from the training documents on first use and cached in the workdir, so a
    resumed or repeated run reads the very same vocabulary."""
    path = vocabulary_path(data, workdir)
    learned = not data.vocab_path
    # What a learned vocabulary was asked for, kept beside it: a cached one must still match the config.
    request = {"tokenizer": data.tokenizer, "vocab_size": int(data.vocab_size), "lower_case": bool(data.lower_case)}
    # A workdir may be remote (gs://...): its files are read and written through etils.epath.
    vocab, request_file = epath.Path(path), epath.Path(path + ".json")
    if learned and vocab.exists() and request_file.exists():
        cached = json.loads(request_file.read_text())
        changed = [f"data.{k}={cached.get(k)!r}" for k in request if cached.get(k) != request[k]]
        if changed:
            raise ValueError(f"the vocabulary cached in {path} was learned with {', '.join(changed)}, which the "
                             f"config changes: use a new workdir, or set those back")
    if not vocab.exists():
        if data.vocab_path:
            raise FileNotFoundError(f"data.vocab_path={data.vocab_path} does not exist")
        if train_documents is None:
            raise ValueError("no vocabulary to read and no documents to learn one from: set data.vocab_path")
        logging.info("learning a %s vocabulary of %d from the training documents into %s",
                     data.tokenizer, data.vocab_size, path)
        sentences = (s for doc in train_documents for s in doc)
        if data.tokenizer not in ("wordpiece", "sentencepiece"):
            raise ValueError(f"data.tokenizer={data.tokenizer!r}: choose wordpiece or sentencepiece")
        # The learners write beside and rename: a crash or a second host never leaves a half file. A
        # remote workdir gets the finished files copied in, each object whole.
        with tempfile.TemporaryDirectory() if files.is_remote(path) else contextlib.nullcontext() as local:
            out_path = os.path.join(local, vocab.name) if local else path
            os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
            if data.tokenizer == "wordpiece":
                vocabularies.learn_wordpiece_vocab(sentences, data.vocab_size, lower_case=data.lower_case,
                                                   out_path=out_path)
            else:
                vocabularies.learn_sentencepiece_model(sentences, data.vocab_size, out_path=out_path,
                                                       lower_case=data.lower_case)
            for name in sorted(os.listdir(local)) if local else ():  # the vocabulary and its listing
                files.write_bytes(str(vocab.parent / name), epath.Path(local, name).read_bytes())
        files.write_bytes(path + ".json", json.dumps(request).encode("utf-8"))
    local_path = files.local_copy(path)  # the tokenizers read local files
    return tokenizers.load_tokenizer(data.tokenizer, local_path, lower_case=data.lower_case), path


def mask_rates(data) -> tuple[float, float]:
    """(training, held-out) mask rates. data.masked_lm_prob, the older name, wins over data.mask_rate
    when a config or a command line sets it (configs/common.py no longer does); data.eval_mask_rate
    unset means the training rate."""
    old = data.get("masked_lm_prob")
    rate = float(old if old is not None else data.get("mask_rate", 0.15))
    eval_rate = data.get("eval_mask_rate")
    return rate, float(rate if eval_rate is None else eval_rate)


def objective(data) -> str:
    """data.objective, "nsp" for configs written before it existed."""
    value = data.get("objective", "nsp")
    if value not in pt.OBJECTIVES:
        raise ValueError(f"data.objective={value!r}: choose {' or '.join(pt.OBJECTIVES)}")
    return value


def masking_spec(data, tokenizer, mask_rate: float) -> pt.MaskingSpec:
    return pt.MaskingSpec.from_tokenizer(
        tokenizer,
        max_predictions_per_seq=data.max_predictions_per_seq,
        mask_rate=mask_rate,
        whole_word_masking=data.whole_word_masking,
        mask_token_fraction=data.get("mask_token_fraction", 0.8),
        random_token_fraction=data.get("random_token_fraction", 0.1),
    )


def make_stream(corpus: pt.TokenizedCorpus, data, tokenizer, *, shard: int, mask_rate: float, seed_offset: int = 0):
    """The stream of one corpus; data.packing and its keys default to off for configs written before them."""
    return pt.PretrainingStream(
        corpus, masking_spec(data, tokenizer, mask_rate), seed=data.seed + seed_offset,
        max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob, shard=shard,
        objective=objective(data), packing=data.get("packing", False),
        max_sequences_per_row=data.get("max_sequences_per_row", 8),
        packing_window=data.get("packing_window", 1000),
    )


def build_inputs(data, *, workdir: str | None, process_index: int = 0, process_count: int = 1) -> PretrainingInputs:
    """The train and held-out streams of this host, from the config's data section."""
    objective(data)  # a bad data.objective fails before the corpus is read
    bad_rows = sources.BadRows()
    mixture = mixture_sources(data)
    if mixture:
        return _mixture_inputs(data, mixture, workdir=workdir, process_index=process_index,
                               process_count=process_count, bad_rows=bad_rows)
    if data.source == "prepared":
        if not data.prepared_dir:
            raise ValueError("data.source='prepared' needs data.prepared_dir (written by python -m bertjax.data.prepare)")
        meta = prepared.read_metadata(data.prepared_dir)
        vocab_path = prepared.vocab_file(data.prepared_dir, meta)
        tokenizer = tokenizers.load_tokenizer(meta["tokenizer"], vocab_path, lower_case=meta["lower_case"])
        train_corpus = prepared.load_corpus(data.prepared_dir, "train", process_index, process_count)
        eval_corpus = prepared.load_corpus(data.prepared_dir, "eval", process_index, process_count)
    else:
        documents, held_out = _split_documents(data, bad_rows)
        _log_bad_rows(bad_rows)
        # Every host learns (or reads) the same vocabulary, from all training documents.
        train_documents = [d for d, e in zip(documents, held_out) if not e]
        tokenizer, vocab_path = load_or_learn_tokenizer(data, workdir, train_documents)
        train_corpus, eval_corpus = _host_corpora(documents, held_out, tokenizer, process_index, process_count)
    _check_corpus(data, train_corpus, eval_corpus, process_index, process_count)
    train_rate, eval_rate = mask_rates(data)
    return PretrainingInputs(
        tokenizer=tokenizer,
        vocab_path=_absolute(vocab_path),
        train=make_stream(train_corpus, data, tokenizer, shard=process_index, mask_rate=train_rate),
        # Its own seed stream, so held-out examples share no random draws with training ones; its own
        # mask rate, so a recipe training at 30% can report at BERT's 15%.
        eval=make_stream(eval_corpus, data, tokenizer, shard=process_index, mask_rate=eval_rate,
                         seed_offset=EVAL_SEED_OFFSET),
        bad_rows=bad_rows,
    )


EVAL_SEED_OFFSET = 1_000_003
# Source k of a mixture draws its pairs and masks from data.seed + k * this: its own random streams.
MIXTURE_SEED_OFFSET = 10_007


def _mixture_inputs(data, mixture, *, workdir, process_index: int, process_count: int,
                    bad_rows: sources.BadRows) -> PretrainingInputs:
    """A data.mixture's streams: each source split, tokenized and streamed on its own, then interleaved by
    weight; the held-out batches are a mixture of the sources' held-out streams with the same weights."""
    splits = []
    for k, (source_data, _) in enumerate(mixture):
        try:
            splits.append(_split_documents(source_data, bad_rows))
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"data.mixture[{k}] (source={source_data.source!r}): {e}") from None
    _log_bad_rows(bad_rows)
    # One vocabulary for all sources, learned from all their training documents.
    tokenizer, vocab_path = load_or_learn_tokenizer(
        data, workdir, [d for documents, held_out in splits for d, e in zip(documents, held_out) if not e])
    train_rate, eval_rate = mask_rates(data)
    train_streams, eval_streams = [], []
    for k, (documents, held_out) in enumerate(splits):
        try:
            train_corpus, eval_corpus = _host_corpora(documents, held_out, tokenizer, process_index, process_count)
            _check_corpus(data, train_corpus, eval_corpus, process_index, process_count)
        except ValueError as e:
            raise ValueError(f"data.mixture[{k}]: {e}") from None
        offset = k * MIXTURE_SEED_OFFSET
        train_streams.append(make_stream(train_corpus, data, tokenizer, shard=process_index, mask_rate=train_rate,
                                         seed_offset=offset))
        eval_streams.append(make_stream(eval_corpus, data, tokenizer, shard=process_index, mask_rate=eval_rate,
                                        seed_offset=EVAL_SEED_OFFSET + offset))
    weights = [weight for _, weight in mixture]
    block = data.get("mixture_block_size", 100)
    return PretrainingInputs(
        tokenizer=tokenizer,
        vocab_path=_absolute(vocab_path),
        train=mixing.MixtureStream(train_streams, weights, seed=data.seed, block_size=block),
        eval=mixing.MixtureStream(eval_streams, weights, seed=data.seed + EVAL_SEED_OFFSET, block_size=block),
        bad_rows=bad_rows,
    )


def _split_documents(data, bad_rows: sources.BadRows) -> tuple[list[list[str]], list[bool]]:
    """All documents of a raw-text source, and which of them are held out (sources.is_eval_document)."""
    documents = list(read_source_documents(data, bad_rows))
    held_out = [sources.is_eval_document(doc, data.eval_fraction) for doc in documents]
    logging.info("corpus: %d documents, %d held out for evaluation", len(documents), sum(held_out))
    if not any(held_out):
        raise ValueError(
            f"no document of the {len(documents)} fell into the held-out split: raise data.eval_fraction "
            f"(now {data.eval_fraction}) or give a larger corpus"
        )
    return documents, held_out


def _log_bad_rows(bad_rows: sources.BadRows) -> None:
    """The table rows skipped as not text, one line (at WARNING: programs show it by default)."""
    if bad_rows.count:
        logging.warning("corpus: %s", bad_rows.summary())


def _host_corpora(documents, held_out, tokenizer, process_index: int, process_count: int):
    """(training corpus, held-out corpus) of this host's share of the documents."""
    # Split between hosts first, as prepare does with --num_shards=process_count, so that both paths
    # give a host the very same documents.
    mine = host_documents(zip(documents, held_out), process_index, process_count)
    for split, wanted in (("training", False), ("held-out", True)):
        if not any(e == wanted for _, e in mine):
            raise ValueError(
                f"host {process_index} of {process_count} gets no {split} document of the {len(documents)}: "
                f"give a larger corpus{' or raise data.eval_fraction' if wanted else ''}"
            )
    return (pt.tokenize_documents([d for d, e in mine if not e], tokenizer),
            pt.tokenize_documents([d for d, e in mine if e], tokenizer))


def _check_corpus(data, train_corpus, eval_corpus, process_index: int, process_count: int) -> None:
    if objective(data) == "nsp" and train_corpus.num_documents < 2:
        # A NotNext pair takes its second segment from another document: with one, it would come from
        # the same document and carry a wrong label.
        raise ValueError(f"host {process_index} of {process_count} has {train_corpus.num_documents} training "
                         f"document: next-sentence pairs need at least 2; give more documents (a blank line "
                         f"separates documents in data.text_format=sentences), or set data.objective=sop or none")
    logging.info(
        "host %d/%d: %d training documents (%d sentences, %d tokens), %d held-out documents",
        process_index, process_count, train_corpus.num_documents, train_corpus.num_sentences,
        len(train_corpus.tokens), eval_corpus.num_documents,
    )


def _absolute(vocab_path: str) -> str:
    return vocab_path if files.is_remote(vocab_path) else os.path.abspath(vocab_path)
