"""Weighted mixtures of sources (data.mixture): counts per block, each element its source's element at the
closed-form position, the same batch for the same (seed, step), exact resume, and bad mixtures in one line."""

import pathlib
import runpy

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import demo
from bertjax.data import inputs
from bertjax.data import mixture
from bertjax.text import vocab_learning as vocabularies

REPO = pathlib.Path(__file__).resolve().parents[1]
WEIGHTS = (0.7, 0.3)
BLOCK = 10  # 7 elements of the Parquet source and 3 of the text source in every block


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two corpora of different documents: demo documents 0-149 as Parquet, 150-239 as text files."""
    documents = demo.demo_documents(240)
    root = tmp_path_factory.mktemp("mixture")
    pq.write_table(pa.table({"sentences": documents[:150]}), root / "web.parquet", row_group_size=50)
    (root / "books.txt").write_text("\n\n".join("\n".join(d) for d in documents[150:]) + "\n")
    vocabularies.learn_wordpiece_vocab((s for d in documents for s in d), 600, True, str(root / "vocab.txt"))
    return root


def data_config(corpus, **overrides):
    config = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    config.data.update(vocab_path=str(corpus / "vocab.txt"), eval_fraction=0.1, max_seq_length=32,
                       max_predictions_per_seq=5, **overrides)
    return config.data


def entries(corpus, weights=WEIGHTS):
    return (dict(source="parquet", input_pattern=str(corpus / "web.parquet"), sentences_column="sentences",
                 weight=weights[0]),
            dict(source="text", input_pattern=str(corpus / "books.txt"), text_format="sentences", weight=weights[1]))


@pytest.fixture(scope="module")
def mixed(corpus):
    return inputs.build_inputs(data_config(corpus, mixture=entries(corpus), mixture_block_size=BLOCK), workdir=None)


def test_block_counts_round_by_largest_remainder():
    # 7 x (0.5, 0.3, 0.2) = 3.5, 2.1, 1.4: floors 3, 2, 1, and the one left goes to the largest remainder.
    np.testing.assert_array_equal(mixture.block_counts([0.5, 0.3, 0.2], 7), [4, 2, 1])
    np.testing.assert_array_equal(mixture.block_counts([4, 1], 100), [80, 20])  # weights are relative
    np.testing.assert_array_equal(mixture.block_counts([1, 1, 1], 10), [4, 3, 3])  # a tie: the earlier source
    assert mixture.block_counts([0.37, 0.21, 0.42], 1000).tolist() == [370, 210, 420]


def test_counts_follow_the_weights_and_positions_are_closed_form(mixed):
    stream = mixed.train
    np.testing.assert_array_equal(stream.counts, [7, 3])
    counts = np.zeros(2, np.int64)
    for i in range(50 * BLOCK):  # the positions counted one element at a time
        np.testing.assert_array_equal(stream.positions(i), counts)
        counts[stream.source_of(i)] += 1
        assert np.all(np.abs(counts - np.array(WEIGHTS) * (i + 1)) <= BLOCK)  # within a block of the weights
    np.testing.assert_array_equal(counts, [350, 150])  # whole blocks hold the weights exactly
    orders = {tuple(stream.block_order(b)) for b in range(50)}
    assert len(orders) > 40  # each block draws its own order


def test_each_element_is_its_sources_element_at_the_closed_form_position(corpus, mixed):
    """Against each source built on its own (the seed of source k is data.seed + k * MIXTURE_SEED_OFFSET)."""
    alone = []
    for k, entry in enumerate(entries(corpus)):
        keys = {key: value for key, value in entry.items() if key != "weight"}
        data = data_config(corpus, seed=k * inputs.MIXTURE_SEED_OFFSET, **keys)
        alone.append(list(inputs.build_inputs(data, workdir=None).train.elements(0).take(70).as_numpy_iterator()))
    for start in (0, 43):
        got = list(mixed.train.elements(start).take(40).as_numpy_iterator())
        for i, element in enumerate(got, start):
            s, p = mixed.train.source_of(i), mixed.train.positions(i)[mixed.train.source_of(i)]
            for key in element:
                np.testing.assert_array_equal(element[key], alone[s][p][key], err_msg=f"element {i} {key}")


def test_the_same_step_gives_the_same_batch_and_resumes_exactly(corpus, mixed):
    batch_size, step = 8, 5
    from_zero = list(mixed.train.dataset(batch_size).take(step + 1).as_numpy_iterator())
    again = inputs.build_inputs(data_config(corpus, mixture=entries(corpus), mixture_block_size=BLOCK), workdir=None)
    resumed = next(again.train.dataset(batch_size, start_step=step).as_numpy_iterator())
    for key in resumed:
        np.testing.assert_array_equal(resumed[key], from_zero[step][key], err_msg=key)
    # The real-token share the stream reports from its sources' plans is that of its batches.
    rows = np.concatenate([b["input_mask"] for b in from_zero])
    assert mixed.train.real_token_share(len(rows)) == pytest.approx(rows.mean())
    # Another seed draws other block orders.
    other = mixture.MixtureStream(mixed.train.streams, WEIGHTS, seed=1, block_size=BLOCK)
    assert any(other.source_of(i) != mixed.train.source_of(i) for i in range(BLOCK))


def documents_of(corpus):
    return {np.concatenate(corpus.document(d)).tobytes() for d in range(corpus.num_documents)}


def test_held_out_batches_mix_the_sources_held_out_streams_by_the_same_weights(mixed):
    assert isinstance(mixed.eval, mixture.MixtureStream)
    np.testing.assert_array_equal(mixed.eval.counts, mixed.train.counts)
    for train, held_out in zip(mixed.train.streams, mixed.eval.streams):
        assert held_out.corpus.num_documents > 0
        assert not documents_of(train.corpus) & documents_of(held_out.corpus)
    assert len(mixed.eval_batches(8, 2)) == 2


@pytest.mark.parametrize("mix, message", [
    (lambda e: (dict(e[0], weight=0), e[1]), "data.mixture[0] weight=0: set a number above 0"),
    (lambda e: (e[0], dict(e[1], weight=-1.0)), "data.mixture[1] weight=-1.0"),
    (lambda e: (dict(e[0], source="webdataset"), e[1]), "data.mixture[0] source='webdataset': choose one of"),
    (lambda e: ({k: v for k, v in e[0].items() if k != "weight"}, e[1]), "needs both source= and weight="),
    (lambda e: (dict(e[0], max_seq_length=64), e[1]), "max_seq_length belongs to the recipe"),
    (lambda e: (e[0], dict(e[1], weight=0.001)), "data.mixture[1] gets no element of a block"),
    (lambda e: (e[0], dict(e[1], input_pattern="/nonexistent/*.txt")), "data.mixture[1] (source='text'): no files"),
])
def test_bad_mixtures_are_one_line(corpus, mix, message):
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        inputs.build_inputs(data_config(corpus, mixture=mix(entries(corpus)), mixture_block_size=BLOCK), workdir=None)
    assert message in str(e.value) and "\n" not in str(e.value)
