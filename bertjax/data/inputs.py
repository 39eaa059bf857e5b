"""From the config's data section to the streams an entry program consumes.

    documents (demo | text | tfds | prepared shards)
      -> this host's share                     (document i belongs to host i % process_count)
      -> held-out split                         (a stable hash of each document: training never sees it)
      -> tokenizer                              (data.vocab_path, or learned once and cached in the workdir)
      -> TokenizedCorpus -> PretrainingStream   (train and eval; data.objective: nsp | sop | none;
                                                 data.packing: several examples per row)

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
    train: pt.PretrainingStream
    eval: pt.PretrainingStream
    vocab_path: str  # the tokenizer's file, recorded in checkpoints so bertjax.load finds it

    def train_batches(self, batch_size: int, start_step: int = 0) -> Iterator[dict]:
        """numpy batches of this host's examples, from step start_step on, without end."""
        return self.train.dataset(batch_size, start_step=start_step).as_numpy_iterator()

    def eval_batches(self, batch_size: int, num_batches: int) -> list[dict]:
        """The fixed held-out batches: the same examples and masks at every evaluation."""
        return list(self.eval.dataset(batch_size).take(num_batches).as_numpy_iterator())


def read_source_documents(data) -> Iterator[list[str]]:
    """The documents of the configured raw-text source (demo, text files, TFDS)."""
    return sources.read_documents(
        data.source,
        input_pattern=data.input_pattern,
        text_format=data.text_format,
        text_field=data.text_field,
        tfds_name=data.tfds_name,
        tfds_split=data.tfds_split,
        tfds_text_feature=data.tfds_text_feature,
        tfds_data_dir=data.tfds_data_dir,
        sentence_splitter=data.sentence_splitter,
    )


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
    if data.source == "prepared":
        if not data.prepared_dir:
            raise ValueError("data.source='prepared' needs data.prepared_dir (written by python -m bertjax.data.prepare)")
        meta = prepared.read_metadata(data.prepared_dir)
        vocab_path = prepared.vocab_file(data.prepared_dir, meta)
        tokenizer = tokenizers.load_tokenizer(meta["tokenizer"], vocab_path, lower_case=meta["lower_case"])
        train_corpus = prepared.load_corpus(data.prepared_dir, "train", process_index, process_count)
        eval_corpus = prepared.load_corpus(data.prepared_dir, "eval", process_index, process_count)
    else:
        documents = list(read_source_documents(data))
        held_out = [sources.is_eval_document(doc, data.eval_fraction) for doc in documents]
        logging.info("corpus: %d documents, %d held out for evaluation", len(documents), sum(held_out))
        if not any(held_out):
            raise ValueError(
                f"no document of the {len(documents)} fell into the held-out split: raise data.eval_fraction "
                f"(now {data.eval_fraction}) or give a larger corpus"
            )
        # Every host learns (or reads) the same vocabulary, from all training documents.
        train_documents = [d for d, e in zip(documents, held_out) if not e]
        tokenizer, vocab_path = load_or_learn_tokenizer(data, workdir, train_documents)
        # Split between hosts first, as prepare does with --num_shards=process_count, so that both paths
        # give a host the very same documents.
        mine = host_documents(zip(documents, held_out), process_index, process_count)
        for split, wanted in (("training", False), ("held-out", True)):
            if not any(e == wanted for _, e in mine):
                raise ValueError(
                    f"host {process_index} of {process_count} gets no {split} document of the {len(documents)}: "
                    f"give a larger corpus{' or raise data.eval_fraction' if wanted else ''}"
                )
        train_corpus = pt.tokenize_documents([d for d, e in mine if not e], tokenizer)
        eval_corpus = pt.tokenize_documents([d for d, e in mine if e], tokenizer)
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
    train_rate, eval_rate = mask_rates(data)
    return PretrainingInputs(
        tokenizer=tokenizer,
        vocab_path=vocab_path if files.is_remote(vocab_path) else os.path.abspath(vocab_path),
        train=make_stream(train_corpus, data, tokenizer, shard=process_index, mask_rate=train_rate),
        # Its own seed stream, so held-out examples share no random draws with training ones; its own
        # mask rate, so a recipe training at 30% can report at BERT's 15%.
        eval=make_stream(eval_corpus, data, tokenizer, shard=process_index, mask_rate=eval_rate,
                         seed_offset=1_000_003),
    )
