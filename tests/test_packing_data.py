"""Packed rows against the unpacked stream: the same examples exactly, both budgets, the batch contract,
exact resume, the packer's best-fit property, efficiency, synthetic packed batches, bad settings."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import packing
from bertjax.data import stream as streams
from bertjax.data.corpus import corpus_from_token_lists
from bertjax.data.masking import MaskingSpec, example_key, mask_tokens
from bertjax.data.objectives import example_lengths
from bertjax.data.stream import PretrainingStream
from bertjax.data import synthetic

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 1000
CLS, SEP, PAD, MASK = 2, 3, 0, 4
WORD_START = np.arange(VOCAB) < 500  # ids 500 and up are "##" pieces
REPLACEMENT_IDS = np.arange(10, VOCAB, dtype=np.int32)
UNPACKED_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                 "masked_lm_weights", "next_sentence_labels")


def make_documents(num_docs, seed=0, max_sentences=8, max_words=10):
    """Documents of 1 to max_sentences sentences of 2 to max_words words of 1-3 pieces: short documents,
    so that at seq 128 rows hold one to four pairs."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.integers(1, max_sentences + 1)):
            words = [[int(rng.integers(10, 500))] + rng.integers(500, VOCAB, size=rng.integers(0, 3)).tolist()
                     for _ in range(rng.integers(2, max_words + 1))]
            sentences.append([t for w in words for t in w])
        docs.append(sentences)
    return docs


@pytest.fixture(scope="module")
def corpus():
    return corpus_from_token_lists(make_documents(150), VOCAB)


def spec(max_predictions=20, whole_word=True):
    return MaskingSpec(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, replacement_ids=REPLACEMENT_IDS,
                       word_start=WORD_START, max_predictions_per_seq=max_predictions, whole_word_masking=whole_word)


def stream(corpus, *, packing=True, objective="nsp", max_seq_length=128, max_predictions=20, k=4, window=50, seed=3):
    return PretrainingStream(corpus, spec(max_predictions), seed=seed, max_seq_length=max_seq_length,
                             objective=objective, packing=packing, max_sequences_per_row=k, packing_window=window)


def one_epoch(s):
    """Epoch 0 of a stream as one batch (examples, or packed rows)."""
    return next(s.dataset(s.rows_per_epoch).as_numpy_iterator())


def batches(s, batch_size, num_batches, start_step=0):
    return list(s.dataset(batch_size, start_step=start_step).take(num_batches).as_numpy_iterator())


def check_contract(batch, *, max_seq_length, max_predictions, k, cls_id=CLS, pad_id=PAD):
    """Every packed row's keys, shapes and internal consistency (docs/data.md, "Packing")."""
    b = len(batch["input_ids"])
    s, p = max_seq_length, max_predictions
    shapes = dict(input_ids=(b, s), input_mask=(b, s), segment_ids=(b, s), sequence_ids=(b, s),
                  position_ids=(b, s), masked_lm_positions=(b, p), masked_lm_ids=(b, p), masked_lm_weights=(b, p),
                  next_sentence_labels=(b, k), sentence_positions=(b, k), sentence_weights=(b, k))
    assert {key: batch[key].shape for key in shapes} == shapes
    assert set(batch) == set(shapes)
    for key in shapes:
        assert batch[key].dtype == (np.float32 if key.endswith("weights") else np.int32), key
    for r in range(b):
        row = {key: value[r] for key, value in batch.items()}
        count = int(row["sentence_weights"].sum())
        assert 1 <= count <= k
        np.testing.assert_array_equal(row["sentence_weights"], np.arange(k) < count)  # real slots first
        n = int(row["input_mask"].sum())
        np.testing.assert_array_equal(row["input_mask"], np.arange(s) < n)  # padding only at the end
        np.testing.assert_array_equal(row["input_mask"], row["sequence_ids"] > 0)
        starts = row["sentence_positions"][:count]
        ends = np.append(starts[1:], n)
        assert starts[0] == 0 and (ends > starts).all()
        for j, (start, end) in enumerate(zip(starts, ends)):
            assert (row["sequence_ids"][start:end] == j + 1).all()
            np.testing.assert_array_equal(row["position_ids"][start:end], np.arange(end - start))
            assert cls_id is None or row["input_ids"][start] == cls_id
            segments = row["segment_ids"][start:end]
            assert segments[0] == 0 and (np.diff(segments) >= 0).all()  # A then B
        assert (row["input_ids"][n:] == pad_id).all()
        for key in ("segment_ids", "position_ids"):
            assert (row[key][n:] == 0).all(), key
        assert (row["sentence_positions"][count:] == 0).all() and (row["next_sentence_labels"][count:] == 0).all()
        c = int(row["masked_lm_weights"].sum())
        np.testing.assert_array_equal(row["masked_lm_weights"], np.arange(p) < c)
        positions = row["masked_lm_positions"][:c]
        assert (np.diff(positions) > 0).all() and (positions < n).all()
        assert not np.isin(positions, starts).any()  # never a [CLS]
        assert (row["masked_lm_positions"][c:] == 0).all() and (row["masked_lm_ids"][c:] == 0).all()


def canonical(example):
    return tuple(np.asarray(example[key]).tobytes() for key in UNPACKED_KEYS)


# --------------------------------------------------------------------------------------------------
# The packed stream against the unpacked one
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_packed_rows_are_the_unpacked_examples_each_once(corpus, objective):
    unpacked, packed = stream(corpus, packing=False, objective=objective), stream(corpus, objective=objective)
    assert packed.examples_per_epoch == unpacked.examples_per_epoch > 100
    examples, rows = one_epoch(unpacked), one_epoch(packed)
    assert set(examples) == set(UNPACKED_KEYS) and examples["next_sentence_labels"].ndim == 1
    check_contract(rows, max_seq_length=128, max_predictions=20, k=4)
    got = packing.unpack_batch(rows, pad_id=PAD)
    # Independent of the row plan: the same examples, as a multiset, each exactly once.
    want = [{key: examples[key][i] for key in UNPACKED_KEYS} for i in range(len(examples["input_ids"]))]
    assert sorted(map(canonical, got)) == sorted(map(canonical, want))
    assert len(set(map(canonical, want))) == len(want)
    # And in the row plan's order: each row holds the plan's examples it lists, in its order.
    members = packed.row_plan(0)
    order = members[members >= 0]
    np.testing.assert_array_equal(np.sort(order), np.arange(packed.examples_per_epoch))
    for example, index in zip(got, order):
        for key in UNPACKED_KEYS:
            np.testing.assert_array_equal(example[key], want[index][key], err_msg=key)
    # Both budgets, counted as masking spends them.
    lengths = example_lengths(packed.plan(0), objective)
    asked = packing.num_predictions(lengths, 0.15, 20)
    filled = np.where(members >= 0, lengths[np.maximum(members, 0)], 0).sum(1)
    np.testing.assert_array_equal(filled, rows["input_mask"].sum(1))
    assert filled.max() <= 128 and np.where(members >= 0, asked[np.maximum(members, 0)], 0).sum(1).max() <= 20
    assert (rows["masked_lm_weights"].sum(1) <= 20).all() and (members >= 0).sum(1).max() == 4  # K binds
    assert rows["input_mask"].mean() > examples["input_mask"].mean() + 0.3
    assert packed.real_token_share(packed.rows_per_epoch) == pytest.approx(rows["input_mask"].mean())


def test_later_epochs_pack_all_their_pairs_into_the_rows_of_epoch_0(corpus):
    s = stream(corpus)
    for epoch in (1, 2, 3):
        own = s._build_row_plan(epoch)
        np.testing.assert_array_equal(np.sort(own[own >= 0]), np.arange(len(s.uncut_plan(epoch))))  # once each
        rows = s.row_plan(epoch)
        assert len(rows) == s.rows_per_epoch and abs(len(own) - s.rows_per_epoch) <= 0.1 * s.rows_per_epoch
        np.testing.assert_array_equal(rows, own[np.arange(s.rows_per_epoch) % len(own)])  # cut or wrapped
    # Epoch 1's packed examples are the unpacked stream's epoch 1 wherever that has them (it cuts or wraps
    # pairs to the count of epoch 0; the packed stream, rows).
    unpacked = stream(corpus, packing=False)
    examples = next(unpacked.dataset(unpacked.examples_per_epoch, start_step=1).as_numpy_iterator())
    rows = next(s.dataset(s.rows_per_epoch, start_step=1).as_numpy_iterator())
    members = s.row_plan(1)
    shared = 0
    for example, index in zip(packing.unpack_batch(rows, pad_id=PAD), members[members >= 0]):
        if index < min(len(s.uncut_plan(1)), unpacked.examples_per_epoch):
            shared += 1
            for key in UNPACKED_KEYS:
                np.testing.assert_array_equal(example[key], examples[key][index], err_msg=key)
    assert shared >= 0.9 * unpacked.examples_per_epoch


def test_resume_and_rebuild_give_the_same_packed_batches(corpus):
    small = corpus_from_token_lists(make_documents(40, seed=1), VOCAB)
    s = stream(small)
    batch_size = 4
    steps_per_epoch = s.rows_per_epoch / batch_size
    total = int(2.5 * steps_per_epoch)  # crosses two epoch boundaries, mid-batch
    full = batches(s, batch_size, total)
    again = batches(stream(small), batch_size, total)
    for got, want in zip(again, full):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    for start in (int(steps_per_epoch) + 1, total - 2):
        resumed = batches(stream(small), batch_size, total - start, start_step=start)
        assert len(resumed) == total - start
        for got, want in zip(resumed, full[start:]):
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"start {start} {key}")
    # Masks change with the epoch; the packing too.
    assert not np.array_equal(full[0]["input_ids"], full[int(steps_per_epoch) + 1]["input_ids"])


def test_full_sentences_rows_keep_one_sequence_in_the_packed_format(corpus, monkeypatch):
    unpacked = stream(corpus, packing=False, objective="none")
    # The log line, recorded at absl's call (caplog misses it once a program has set absl's handler up).
    said = []
    monkeypatch.setattr(streams.logging, "info", lambda message, *args: said.append(message % args))
    packed = stream(corpus, objective="none")
    assert any("rows are full already" in line for line in said), said
    assert packed.rows_per_epoch == unpacked.examples_per_epoch
    rows = one_epoch(packed)
    check_contract(rows, max_seq_length=128, max_predictions=20, k=4)
    assert (rows["sentence_weights"].sum(1) == 1).all()
    examples = one_epoch(unpacked)
    for got, i in zip(packing.unpack_batch(rows, pad_id=PAD), range(unpacked.examples_per_epoch)):
        for key in UNPACKED_KEYS:
            np.testing.assert_array_equal(got[key], examples[key][i], err_msg=key)


# --------------------------------------------------------------------------------------------------
# The packer
# --------------------------------------------------------------------------------------------------


def reference_best_fit(lengths, predictions, max_tokens, max_predictions, max_sequences, window):
    """Best-fit decreasing written plainly: lists of rows, every row searched for every example."""
    result = []
    for w0 in range(0, len(lengths), window):
        items = sorted(range(w0, min(len(lengths), w0 + window)), key=lambda i: (-lengths[i], i))
        rows = []  # [tokens, predictions, members]
        for i in items:
            fitting = [r for r in rows if r[0] + lengths[i] <= max_tokens and r[1] + predictions[i] <= max_predictions
                       and len(r[2]) < max_sequences]
            if fitting:
                best = min(fitting, key=lambda r: max_tokens - r[0])  # min() keeps the first of equals
                best[0] += lengths[i]
                best[1] += predictions[i]
                best[2].append(i)
            else:
                rows.append([lengths[i], predictions[i], [i]])
        result += sorted(sorted(r[2]) for r in rows)
    return result


@pytest.mark.parametrize("max_tokens,max_predictions,max_sequences,window",
                         [(64, 10, 4, 50), (128, 20, 8, 400), (128, 19, 3, 7), (512, 80, 16, 300), (64, 9, 1, 40)])
def test_packer_is_best_fit_decreasing(max_tokens, max_predictions, max_sequences, window):
    rng = np.random.default_rng(max_tokens + window)
    lengths = np.where(rng.random(1500) < 0.4, max_tokens, rng.integers(5, max_tokens + 1, 1500))
    predictions = packing.num_predictions(lengths, 0.15, max_predictions)
    rows = packing.pack_rows(lengths, predictions, max_tokens=max_tokens, max_predictions=max_predictions,
                             max_sequences=max_sequences, window=window)
    want = reference_best_fit(lengths.tolist(), predictions.tolist(), max_tokens, max_predictions,
                              max_sequences, window)
    assert [r[r >= 0].tolist() for r in rows] == want
    # The any-fit property, from the result alone: an example opens a row only when no row of its window
    # opened before it could take it, given what that row held at that moment (examples go longest first).
    rank = np.empty(len(lengths), np.int64)
    for w0 in range(0, len(lengths), window):
        order = w0 + np.argsort(-lengths[w0:w0 + window], kind="stable")
        rank[order] = np.arange(len(order))
    for w0 in range(0, len(lengths), window):
        window_rows = [r[r >= 0] for r in rows if w0 <= r[0] < w0 + window]
        openers = [m[np.argmin(rank[m])] for m in window_rows]
        for opener in openers:
            for other in window_rows:
                held = other[rank[other] < rank[opener]]
                if len(held) == 0:
                    continue
                assert (lengths[held].sum() + lengths[opener] > max_tokens
                        or predictions[held].sum() + predictions[opener] > max_predictions
                        or len(held) >= max_sequences)
    # Nothing lost or repeated, rows in the plan's order.
    covered = rows[rows >= 0]
    np.testing.assert_array_equal(np.sort(covered), np.arange(len(lengths)))
    assert (np.diff(rows[:, 0]) > 0).all()


def test_num_predictions_is_what_masking_asks_for():
    import tensorflow as tf

    # Lengths whose rate x n falls on .5 (rounded half to even), at and beyond the caps.
    lengths = np.array([5, 6, 10, 15, 25, 30, 50, 70, 90, 127, 128, 133, 250, 300, 512])
    for rate, cap in ((0.15, 20), (0.3, 38), (0.15, 80)):
        masking = MaskingSpec(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, replacement_ids=REPLACEMENT_IDS,
                              word_start=WORD_START, max_predictions_per_seq=cap, mask_rate=rate)
        got = [int(mask_tokens(tf.fill([n], 100), example_key(0, 0, n), masking)[3].numpy().sum())
               for n in lengths]
        np.testing.assert_array_equal(packing.num_predictions(lengths, rate, cap), got)


# --------------------------------------------------------------------------------------------------
# Efficiency, synthetic batches, preview, settings
# --------------------------------------------------------------------------------------------------


def test_packing_efficiency_on_the_demo_corpus():
    """The demo corpus, one token per word or punctuation mark (WordPiece gives a few more tokens)."""
    from bertjax.data import demo

    documents = demo.demo_documents()
    word = re.compile(r"\w+|[^\w\s]")
    token_docs = [[[10 + hash(w) % (VOCAB - 10) for w in word.findall(sentence.lower())] for sentence in doc]
                  for doc in documents]
    corpus = corpus_from_token_lists(token_docs, VOCAB)
    shares = {}
    for seq, predictions, k in ((128, 20, 8), (512, 80, 16)):
        for packed in (False, True):
            s = stream(corpus, packing=packed, max_seq_length=seq, max_predictions=predictions, k=k, window=1000)
            shares[seq, packed] = s.real_token_share(min(s.rows_per_epoch, 100 * 256))
    assert shares[128, True] >= 0.95 and shares[512, True] >= 0.95, shares
    assert shares[128, False] < 0.85 and shares[512, False] < 0.6, shares


def test_synthetic_packed_batches_follow_the_contract():
    for seq, predictions, k in ((128, 20, 8), (512, 80, 16)):
        kwargs = dict(batch_size=32, max_seq_length=seq, max_predictions_per_seq=predictions, vocab_size=VOCAB,
                      packed=True, max_sequences_per_row=k)
        batch = synthetic.synthetic_batch(3, **kwargs)
        check_contract(batch, max_seq_length=seq, max_predictions=predictions, k=k, cls_id=None, pad_id=0)
        assert batch["input_mask"].mean() > 0.95 and batch["sentence_weights"].sum(1).mean() > 1.2
        again = synthetic.synthetic_batch(3, **kwargs)
        for key in batch:
            np.testing.assert_array_equal(batch[key], again[key])
        assert not np.array_equal(synthetic.synthetic_batch(4, **kwargs)["input_ids"], batch["input_ids"])
        # Each sequence predicts what masking would ask of its length.
        for row in range(32):
            lengths = np.bincount(batch["sequence_ids"][row])[1:]
            assert batch["masked_lm_weights"][row].sum() == packing.num_predictions(lengths, 0.15, predictions).sum()
    unpacked = synthetic.synthetic_batch(0, batch_size=4, max_seq_length=128, max_predictions_per_seq=20,
                                         vocab_size=VOCAB)
    assert set(unpacked) == set(UNPACKED_KEYS) and unpacked["next_sentence_labels"].shape == (4,)
    code = "import sys, bertjax.data.synthetic\nassert 'tensorflow' not in sys.modules\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_synthetic_batches_from_the_data_settings():
    """synthetic.from_settings: the batches synthetic_batch makes of the settings' shape, offered as the
    input pipeline offers a corpus's (train_batches from a step, fixed eval_batches, no tokenizer)."""
    from bertjax.data.settings import DataSettings

    settings = DataSettings(source="synthetic", max_seq_length=128, max_predictions_per_seq=40, mask_rate=0.3,
                            max_sequences_per_row=6, seed=5)
    inputs = synthetic.from_settings(settings, vocab_size=VOCAB, shard=1)
    kwargs = dict(batch_size=8, max_seq_length=128, max_predictions_per_seq=40, vocab_size=VOCAB, seed=5, shard=1,
                  packed=True, max_sequences_per_row=6, mask_rate=0.3)
    expected = {"train": synthetic.synthetic_batch(7, **kwargs),
                "eval": synthetic.synthetic_batch(1, split=1, **kwargs)}
    got = {"train": next(inputs.train_batches(8, start_step=7)), "eval": inputs.eval_batches(8, 2)[1]}
    for split in expected:
        for key in expected[split]:
            np.testing.assert_array_equal(got[split][key], expected[split][key], err_msg=f"{split} {key}")
    assert inputs.tokenizer is None and inputs.vocab_path is None


def test_preview_shows_each_sequence_of_a_row(corpus):
    from bertjax.runs import data_preview as preview

    class Tokenizer:
        pad_id = PAD

        def convert_ids_to_tokens(self, ids):
            return [{CLS: "[CLS]", SEP: "[SEP]", MASK: "[MASK]", PAD: "[PAD]"}.get(i, f"t{i}") for i in ids]

    rows = next(stream(corpus).dataset(16).as_numpy_iterator())
    r = int(np.argmax(rows["sentence_weights"].sum(1)))  # a row of several sequences
    row = {key: value[r] for key, value in rows.items()}
    text = preview.format_packed_text(Tokenizer(), row, 7)
    count = int(row["sentence_weights"].sum())
    assert count >= 2 and text.startswith(f"--- row 7: {count} sequences, {row['input_mask'].sum()} of 128")
    for j in range(count):
        assert f"  [{j + 1}] positions {row['sentence_positions'][j]}-" in text
    assert text.count("A: [CLS]") == count and text.count("⟦[MASK]→") >= 1


def test_a_row_plan_needs_a_packed_stream(corpus):
    with pytest.raises(ValueError, match="needs a packed stream"):
        stream(corpus, packing=False).row_plan(0)
