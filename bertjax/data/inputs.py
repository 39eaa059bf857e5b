"""From the config's data section to the streams an entry program consumes.

    documents (a backend of bertjax/data/backends: demo | text | tfds | parquet | hf_datasets)
      -> this host's share                     (splits.share: document i belongs to host i % process_count)
      -> held-out split                         (splits.is_eval_document: a stable hash of each document)
      -> tokenizer                              (data.vocab_path, or learned once and cached in the workdir)
      -> TokenizedCorpus -> PretrainingStream   (train and eval; data.objective: nsp | sop | none;
                                                 data.packing: several examples per row)
    or a host's corpora tokenized already (data.source=prepared: the shards of bertjax.prepare)
      data.mixture: each source its own corpus and stream, interleaved by weight (bertjax.data.mixture)

Entry programs (train, preview) call build_inputs(config.data, ...); the section is read into a
DataSettings (bertjax/data/settings.py) there, and everything below takes the record.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from typing import Iterator, Sequence

import numpy as np
from absl import logging
from etils import epath

from bertjax.data import backends
from bertjax.data import mixture as mixing
from bertjax.data import splits, units
from bertjax.data.backends.backend import BadRows
from bertjax.data.corpus import TokenizedCorpus, tokenize_documents
from bertjax.data.masking import MaskingSpec
from bertjax.data.settings import DataSettings
from bertjax.data.stream import PretrainingStream
from bertjax.text import files
from bertjax.text import tokenizers
from bertjax.text import vocab_learning as vocabularies


@dataclasses.dataclass
class PretrainingInputs:
    tokenizer: object
    train: PretrainingStream | mixing.MixtureStream
    eval: PretrainingStream | mixing.MixtureStream
    vocab_path: str  # the tokenizer's file, recorded in checkpoints so bertjax.load finds it
    bad_rows: BadRows = dataclasses.field(default_factory=BadRows)  # table rows skipped

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[dict]:
        """numpy batches of this host's examples, from step start_step on, without end."""
        return self.train.dataset(batch_size, start_step=start_step).as_numpy_iterator()

    def eval_batches(self, batch_size: int, num_batches: int) -> list[dict]:
        """The fixed held-out batches: the same examples and masks at every evaluation."""
        return list(self.eval.dataset(batch_size).take(num_batches).as_numpy_iterator())


def vocabulary_path(settings: DataSettings, workdir: str | None) -> str:
    """Where the tokenizer's vocabulary is: data.vocab_path, or the one learned into the workdir."""
    if settings.vocab_path:
        return settings.vocab_path
    if not workdir:
        raise ValueError("data.vocab_path is not set and there is no workdir to learn a vocabulary into")
    name = files.VOCAB_FILES[settings.tokenizer]
    return files.join(workdir, name) if files.is_remote(workdir) else os.path.join(workdir, name)


def load_or_learn_tokenizer(settings: DataSettings, workdir: str | None,
                            train_documents: Sequence[list[str]] | None, vocab_cache: str | None = None):
    """The configured tokenizer and the path of its vocabulary. Without data.vocab_path, a vocabulary of
    data.vocab_size is learned from the training documents on first use and cached in the workdir, so a
    resumed or repeated run reads the very same vocabulary. Without a workdir, vocab_cache (a directory)
    keeps it under a digest of those documents and the settings it was learned with."""
    if not settings.vocab_path and not workdir and vocab_cache and train_documents is not None:
        workdir = os.path.join(vocab_cache, _vocabulary_digest(settings, train_documents))
    path = vocabulary_path(settings, workdir)
    learned = not settings.vocab_path
    # What a learned vocabulary was asked for, kept beside it: a cached one must still match the config.
    request = {"tokenizer": settings.tokenizer, "vocab_size": settings.vocab_size, "lower_case": settings.lower_case}
    # A workdir may be remote (gs://...): its files are read and written through etils.epath.
    vocab, request_file = epath.Path(path), epath.Path(path + ".json")
    if learned and vocab.exists() and request_file.exists():
        cached = json.loads(request_file.read_text())
        changed = [f"data.{k}={cached.get(k)!r}" for k in request if cached.get(k) != request[k]]
        if changed:
            raise ValueError(f"the vocabulary cached in {path} was learned with {', '.join(changed)}, which the "
                             f"config changes: use a new workdir, or set those back")
    if not vocab.exists():
        if settings.vocab_path:
            raise FileNotFoundError(f"data.vocab_path={settings.vocab_path} does not exist")
        if train_documents is None:
            raise ValueError("no vocabulary to read and no documents to learn one from: set data.vocab_path")
        if settings.tokenizer == "bpe":
            raise ValueError("data.tokenizer=bpe reads a model's tokenizer.json: set data.vocab_path to it (bertjax "
                             "learns wordpiece and sentencepiece vocabularies)")
        logging.info("learning a %s vocabulary of %d from the training documents into %s",
                     settings.tokenizer, settings.vocab_size, path)
        sentences = (s for doc in train_documents for s in doc)
        # The learners write beside and rename: a crash or a second host never leaves a half file. A
        # remote workdir gets the finished files copied in, each object whole.
        with tempfile.TemporaryDirectory() if files.is_remote(path) else contextlib.nullcontext() as local:
            out_path = os.path.join(local, vocab.name) if local else path
            os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
            if settings.tokenizer == "wordpiece":
                vocabularies.learn_wordpiece_vocab(sentences, settings.vocab_size, lower_case=settings.lower_case,
                                                   out_path=out_path)
            else:
                vocabularies.learn_sentencepiece_model(sentences, settings.vocab_size, out_path=out_path,
                                                       lower_case=settings.lower_case)
            for name in sorted(os.listdir(local)) if local else ():  # the vocabulary and its listing
                files.write_bytes(str(vocab.parent / name), epath.Path(local, name).read_bytes())
        files.write_bytes(path + ".json", json.dumps(request).encode("utf-8"))
    local_path = files.local_copy(path)  # the tokenizers read local files
    return tokenizers.load_tokenizer(settings.tokenizer, local_path, lower_case=settings.lower_case), path


def _vocabulary_digest(settings: DataSettings, train_documents: Sequence[list[str]]) -> str:
    """What a learned vocabulary depends on, hashed: the tokenizer's settings and every training sentence."""
    digest = hashlib.sha256(json.dumps([settings.tokenizer, settings.vocab_size, settings.lower_case]).encode())
    for document in train_documents:
        for sentence in document:
            digest.update(sentence.encode("utf-8") + b"\0")
        digest.update(b"\1")
    return digest.hexdigest()[:24]


def masking_spec(settings: DataSettings, tokenizer, mask_rate: float, documents=None) -> MaskingSpec:
    """The masking recipe of the settings. documents: the training documents (lists of sentences) a word
    segmenter reads for data.masking='units' (data.word_segmenter)."""
    unit_hashes, unit_max_words = np.zeros([0], np.int64), 1
    if "units" in (settings.masking, settings.held_out_masking):
        unit_hashes, unit_max_words = units.lexicon_for(settings, tokenizer, documents)
    return MaskingSpec.from_tokenizer(
        tokenizer,
        max_predictions_per_seq=settings.max_predictions_per_seq,
        mask_rate=mask_rate,
        masking=settings.masking,
        span_p=settings.span_p,
        span_max_words=settings.span_max_words,
        ngram_max_n=settings.ngram_max_n,
        unit_hashes=unit_hashes,
        unit_max_words=unit_max_words,
        mask_token_fraction=settings.mask_token_fraction,
        random_token_fraction=settings.random_token_fraction,
    )


def make_stream(corpus: TokenizedCorpus, settings: DataSettings, tokenizer, *, shard: int, mask_rate: float,
                seed_offset: int = 0, spec: MaskingSpec | None = None, schedule: bool = False) -> PretrainingStream:
    """The stream of one corpus, with the recipe of the settings (spec: its masking, made once for both
    streams; schedule: the training stream follows data.mask_rate_schedule)."""
    if spec is None:
        spec = masking_spec(settings, tokenizer, mask_rate)
    spec = dataclasses.replace(spec, mask_rate=mask_rate)
    return PretrainingStream(
        corpus, spec, seed=settings.seed + seed_offset,
        max_seq_length=settings.max_seq_length, short_seq_prob=settings.short_seq_prob, shard=shard,
        objective=settings.objective, packing=settings.packing,
        max_sequences_per_row=settings.max_sequences_per_row, packing_window=settings.packing_window,
        mask_rate_schedule=settings.mask_rate_schedule if schedule else (),
    )


def build_inputs(data, *, workdir: str | None, process_index: int = 0, process_count: int = 1,
                 vocab_cache: str | None = None) -> PretrainingInputs:
    """The train and held-out streams of this host, from the config's data section (a ConfigDict, read
    into a DataSettings here, or the record itself). vocab_cache: where a vocabulary learned without a
    workdir is kept (load_or_learn_tokenizer)."""
    settings = data if isinstance(data, DataSettings) else DataSettings.from_config(data)
    bad_rows = BadRows()
    if settings.mixture:
        return _mixture_inputs(settings, workdir=workdir, process_index=process_index, process_count=process_count,
                               bad_rows=bad_rows, vocab_cache=vocab_cache)
    backend = backends.get(settings.source)
    if backend.corpora is not None:  # tokenized already, with a vocabulary of its own
        host = backend.corpora(settings, process_index, process_count)
        tokenizer = tokenizers.load_tokenizer(host.tokenizer, host.vocab_path, lower_case=host.lower_case)
        vocab_path, train_corpus, eval_corpus = host.vocab_path, host.train, host.eval
        train_documents = None
    elif backend.documents is not None:
        documents, held_out = _split_documents(settings, bad_rows)
        _log_bad_rows(bad_rows)
        # Every host learns (or reads) the same vocabulary, from all training documents.
        train_documents = [d for d, e in zip(documents, held_out) if not e]
        tokenizer, vocab_path = load_or_learn_tokenizer(settings, workdir, train_documents, vocab_cache)
        train_corpus, eval_corpus = _host_corpora(documents, held_out, tokenizer, process_index, process_count)
    else:
        raise ValueError(f"data.source={settings.source!r} has no corpus to stream ({backend.reads})")
    _check_corpus(settings, train_corpus, eval_corpus, process_index, process_count)
    spec = masking_spec(settings, tokenizer, settings.mask_rate, train_documents)
    eval_spec = dataclasses.replace(spec, masking=settings.held_out_masking, whole_word_masking=False)
    return PretrainingInputs(
        tokenizer=tokenizer,
        vocab_path=_absolute(vocab_path),
        train=make_stream(train_corpus, settings, tokenizer, shard=process_index, mask_rate=settings.mask_rate,
                          spec=spec, schedule=True),
        # Its own seed stream, so held-out examples share no random draws with training ones; its own
        # mask rate, so a recipe training at 30% can report at BERT's 15%.
        eval=make_stream(eval_corpus, settings, tokenizer, shard=process_index,
                         mask_rate=settings.held_out_mask_rate, seed_offset=EVAL_SEED_OFFSET, spec=eval_spec),
        bad_rows=bad_rows,
    )


EVAL_SEED_OFFSET = 1_000_003
# Source k of a mixture draws its pairs and masks from data.seed + k * this: its own random streams.
MIXTURE_SEED_OFFSET = 10_007


def _mixture_inputs(settings: DataSettings, *, workdir, process_index: int, process_count: int,
                    bad_rows: BadRows, vocab_cache: str | None) -> PretrainingInputs:
    """A data.mixture's streams: each source split, tokenized and streamed on its own, then interleaved by
    weight; the held-out batches are a mixture of the sources' held-out streams with the same weights."""
    parts = []
    for k, entry in enumerate(settings.mixture):
        try:
            parts.append(_split_documents(entry.settings, bad_rows))
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"data.mixture[{k}] (source={entry.settings.source!r}): {e}") from None
    _log_bad_rows(bad_rows)
    # One vocabulary for all sources, learned from all their training documents.
    tokenizer, vocab_path = load_or_learn_tokenizer(
        settings, workdir, [d for documents, held_out in parts for d, e in zip(documents, held_out) if not e],
        vocab_cache)
    train_streams, eval_streams = [], []
    spec = masking_spec(settings, tokenizer, settings.mask_rate,
                        [d for documents, held_out in parts for d, e in zip(documents, held_out) if not e])
    eval_spec = dataclasses.replace(spec, masking=settings.held_out_masking, whole_word_masking=False)
    for k, (documents, held_out) in enumerate(parts):
        try:
            train_corpus, eval_corpus = _host_corpora(documents, held_out, tokenizer, process_index, process_count)
            _check_corpus(settings, train_corpus, eval_corpus, process_index, process_count)
        except ValueError as e:
            raise ValueError(f"data.mixture[{k}]: {e}") from None
        offset = k * MIXTURE_SEED_OFFSET
        train_streams.append(make_stream(train_corpus, settings, tokenizer, shard=process_index,
                                         mask_rate=settings.mask_rate, seed_offset=offset, spec=spec))
        eval_streams.append(make_stream(eval_corpus, settings, tokenizer, shard=process_index,
                                        mask_rate=settings.held_out_mask_rate, seed_offset=EVAL_SEED_OFFSET + offset,
                                        spec=eval_spec))
    weights = [entry.weight for entry in settings.mixture]
    block = settings.mixture_block_size
    return PretrainingInputs(
        tokenizer=tokenizer,
        vocab_path=_absolute(vocab_path),
        train=mixing.MixtureStream(train_streams, weights, seed=settings.seed, block_size=block),
        eval=mixing.MixtureStream(eval_streams, weights, seed=settings.seed + EVAL_SEED_OFFSET, block_size=block),
        bad_rows=bad_rows,
    )


def _split_documents(settings: DataSettings, bad_rows: BadRows) -> tuple[list[list[str]], list[bool]]:
    """All documents of a raw-text source, and which of them are held out (splits.is_eval_document)."""
    documents = list(backends.read_documents(settings, bad_rows))
    held_out = [splits.is_eval_document(doc, settings.eval_fraction) for doc in documents]
    logging.info("corpus: %d documents, %d held out for evaluation", len(documents), sum(held_out))
    if not any(held_out):
        raise ValueError(
            f"no document of the {len(documents)} fell into the held-out split: raise data.eval_fraction "
            f"(now {settings.eval_fraction}) or give a larger corpus"
        )
    return documents, held_out


def _log_bad_rows(bad_rows: BadRows) -> None:
    """The table rows skipped as not text, one line (at WARNING: programs show it by default)."""
    if bad_rows.count:
        logging.warning("corpus: %s", bad_rows.summary())


def _host_corpora(documents, held_out, tokenizer, process_index: int, process_count: int):
    """(training corpus, held-out corpus) of this host's share of the documents."""
    # Split between hosts first, as prepare does with --num_shards=process_count, so that both paths
    # give a host the very same documents.
    mine = list(splits.share(zip(documents, held_out), process_index, process_count))
    for part, wanted in (("training", False), ("held-out", True)):
        if not any(e == wanted for _, e in mine):
            raise ValueError(
                f"host {process_index} of {process_count} gets no {part} document of the {len(documents)}: "
                f"give a larger corpus{' or raise data.eval_fraction' if wanted else ''}"
            )
    return (tokenize_documents([d for d, e in mine if not e], tokenizer),
            tokenize_documents([d for d, e in mine if e], tokenizer))


def _check_corpus(settings: DataSettings, train_corpus, eval_corpus, process_index: int,
                  process_count: int) -> None:
    if settings.objective == "nsp" and train_corpus.num_documents < 2:
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
