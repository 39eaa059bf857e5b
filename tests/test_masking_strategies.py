"""Masking strategies against their published algorithms, on text these tests write: span lengths
(SpanBERT's clipped geometric), n-gram shares (ALBERT's 1/n), lexicon units (longest match, case-folded),
the token budget, whole units with one 80/10/10 decision each, a rate schedule that resumes exactly, and
one line for each bad setting."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from bertjax.data import masking, spans, units
from bertjax.data.corpus import corpus_from_token_lists, tokenize_documents
from bertjax.data.masking import MaskingSpec, example_key, mask_tokens
from bertjax.data.settings import DataSettings
from bertjax.data.stream import PretrainingStream
from bertjax.text import tokenizers
from bertjax.text import vocab_learning as vocabularies

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUFFIXES = ["##ing", "##ed", "##er", "##s"]
PHRASES = ["new york city", "machine learning", "red river", "old stone bridge"]


def stems(count=300, seed=0):
    rng = np.random.default_rng(seed)
    letters = np.array(list("bcdfghklmnprstvz"))
    vowels = np.array(list("aeiou"))
    words = {"".join(rng.choice(letters, 1)) + "".join(rng.choice(vowels, 1)) + "".join(rng.choice(letters, 2))
             for _ in range(count)}
    return sorted(words)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A WordPiece vocabulary of stems, suffix pieces, the phrases' words and a few Chinese characters."""
    words = stems() + sorted({w for p in PHRASES for w in p.split()})
    vocab = SPECIALS + words + SUFFIXES + list("我爱北京天安门的大学生很好") + [".", ","]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return tokenizers.load_tokenizer("wordpiece", str(path))


def write_documents(num_docs=300, seed=1):
    """Sentences of stems (some with a suffix piece, so words of two tokens), a phrase now and then,
    capitalised as text is (the tokenizer folds case)."""
    rng = np.random.default_rng(seed)
    words = stems()
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.integers(2, 8)):
            parts = []
            for _ in range(rng.integers(6, 20)):
                if rng.random() < 0.08:
                    parts.append(PHRASES[rng.integers(len(PHRASES))].title())
                else:
                    w = words[rng.integers(len(words))]
                    parts.append(w + (SUFFIXES[rng.integers(4)][2:] if rng.random() < 0.4 else ""))
            sentences.append(" ".join(parts) + ".")
        docs.append(sentences)
    return docs


@pytest.fixture(scope="module")
def held_out(tokenizer):
    """[CLS] A [SEP] B [SEP] examples cut from the written text's tokens: a list of int32 arrays."""
    corpus = tokenize_documents(write_documents(), tokenizer)
    tokens = corpus.tokens.astype(np.int32)
    rng = np.random.default_rng(2)
    examples, at = [], 0
    while at + 130 < len(tokens) and len(examples) < 1500:
        n = int(rng.integers(60, 126))
        cut = int(rng.integers(10, n - 10))
        examples.append(np.concatenate([[tokenizer.cls_id], tokens[at:at + cut], [tokenizer.sep_id],
                                        tokens[at + cut:at + n], [tokenizer.sep_id]]).astype(np.int32))
        at += n
    return examples


def make_spec(tokenizer, name, **kw):
    return MaskingSpec.from_tokenizer(tokenizer, max_predictions_per_seq=40, masking=name, **kw)


def run_masking(examples, spec, seed=0):
    """Every example masked (inside tf.data) with its units: a list of numpy dicts."""
    lengths = [len(e) for e in examples]
    ds = tf.data.Dataset.from_tensor_slices((tf.RaggedTensor.from_row_lengths(np.concatenate(examples), lengths),
                                             tf.range(len(examples), dtype=tf.int64)))

    def one(ids, index):
        key = example_key(seed, 0, index)
        candidate = (ids != spec.cls_id) & (ids != spec.sep_id) & (ids != spec.pad_id)
        masked, positions, labels, weights = mask_tokens(ids, key, spec)
        starts = masking.GROUPINGS[spec.grouping](ids, candidate, key, spec)
        words = masking.whole_word_groups(ids, candidate, key, spec)
        return dict(ids=ids, masked=masked, positions=positions, weights=weights, starts=starts, words=words,
                    candidate=candidate)

    return list(ds.map(one).as_numpy_iterator())


def group_index(starts, candidate):
    return np.where(candidate, np.cumsum(starts) - 1, -1)


def decision(original, seen):
    """A unit's 80/10/10 outcome from its tokens: 'mask', 'keep', 'random', or 'mixed' (split)."""
    if (seen == 4).all():  # [MASK] is id 4 in this vocabulary
        return "mask"
    if (seen == original).all():
        return "keep"
    if not (seen == 4).any():
        return "random"
    return "mixed"


@pytest.fixture(scope="module", params=["span", "ngram", "units"])
def masked(request, tokenizer, held_out):
    extra = {}
    if request.param == "units":
        extra = dict(zip(("unit_hashes", "unit_max_words"), units.lexicon_units(
            tokenizer.encode_arrays([p.upper() for p in PHRASES]), np.asarray(tokenizer.word_start, bool), 8)))
    spec = make_spec(tokenizer, request.param, **extra)
    return request.param, spec, run_masking(held_out, spec)


def test_masked_share_is_the_rate(masked):
    _, _, results = masked
    chosen = sum(int(r["weights"].sum()) for r in results)
    tokens = sum(len(r["ids"]) for r in results)
    assert abs(chosen / tokens - 0.15) <= 0.005, chosen / tokens
    for r in results:
        where = r["positions"][r["weights"] > 0]
        assert r["candidate"][where].all()  # never a special token


def test_units_whole_with_one_decision_each(masked):
    """A unit is masked whole, with one 80/10/10 decision for all its tokens, or not at all."""
    _, _, results = masked
    outcomes = {"mask": 0, "keep": 0, "random": 0, "mixed": 0}
    multi_word_units = 0
    for r in results:
        chosen = np.zeros(len(r["ids"]), bool)
        chosen[r["positions"][r["weights"] > 0]] = True
        unit = group_index(r["starts"], r["candidate"])
        word = group_index(r["words"], r["candidate"])
        for u in np.unique(unit[chosen]):
            members = unit == u
            assert chosen[members].all(), "a unit was split"
            outcomes[decision(r["ids"][members], r["masked"][members])] += 1
            multi_word_units += len(np.unique(word[members])) > 1
    total = sum(outcomes.values())
    assert outcomes["mixed"] == 0
    assert multi_word_units > 0.05 * total  # the check sees units longer than a word
    assert abs(outcomes["mask"] / total - 0.8) < 0.03 and abs(outcomes["keep"] / total - 0.1) < 0.03
    assert abs(outcomes["random"] / total - 0.1) < 0.03


def test_whole_words_are_taken_whole_and_decide_token_by_token(tokenizer, held_out):
    """google-research/bert's whole-word masking: a word is chosen with all its pieces, and each piece then
    draws its own 80/10/10 (so a chosen word of several pieces is sometimes part [MASK], part not)."""
    results = run_masking(held_out[:600], make_spec(tokenizer, "whole_word"))
    outcomes, mixed, multi_piece = {"mask": 0, "keep": 0, "random": 0}, 0, 0
    for r in results:
        chosen = np.zeros(len(r["ids"]), bool)
        chosen[r["positions"][r["weights"] > 0]] = True
        word = group_index(r["words"], r["candidate"])
        for w in np.unique(word[chosen]):
            members = word == w
            assert chosen[members].all(), "a word was split"
            if members.sum() > 1:
                multi_piece += 1
                mixed += decision(r["ids"][members], r["masked"][members]) == "mixed"
        seen, original = r["masked"][chosen], r["ids"][chosen]
        outcomes["mask"] += int((seen == 4).sum())
        outcomes["keep"] += int((seen == original).sum())
        outcomes["random"] += int(((seen != 4) & (seen != original)).sum())
    total = sum(outcomes.values())
    assert multi_piece > 100 and mixed > 0.2 * multi_piece, (mixed, multi_piece)
    assert abs(outcomes["mask"] / total - 0.8) < 0.02 and abs(outcomes["keep"] / total - 0.1) < 0.02, outcomes


def drawn_lengths(spec, num_examples=40, words=2000):
    """Unit lengths in words drawn for long runs of words (two-piece words among them), the last unit of
    each run left out (cut short by the run's end)."""
    rng = np.random.default_rng(3)
    word_start = np.asarray(spec.word_start, bool)
    starts_ids, pieces = np.flatnonzero(word_start[10:300]) + 10, np.flatnonzero(~word_start)
    lengths = []
    for k in range(num_examples):
        ids = []
        for _ in range(words):
            ids.append(int(rng.choice(starts_ids)))
            if rng.random() < 0.4:
                ids.append(int(rng.choice(pieces)))
        ids = tf.constant([spec.cls_id] + ids + [spec.sep_id], tf.int32)
        candidate = (ids != spec.cls_id) & (ids != spec.sep_id)
        key = example_key(7, 0, k)
        starts = masking.GROUPINGS[spec.grouping](ids, candidate, key, spec).numpy()
        word_starts = masking.whole_word_groups(ids, candidate, key, spec).numpy()
        unit_words = np.diff(np.flatnonzero(starts[word_starts]))  # words between unit starts
        lengths.extend(unit_words.tolist())
    return np.array(lengths)


def histogram(lengths, size):
    return np.bincount(lengths, minlength=size + 1)[1:size + 1] / len(lengths)


def test_span_lengths_are_spanberts_clipped_geometric(tokenizer):
    lengths = drawn_lengths(make_spec(tokenizer, "span"))
    want = spans.span_length_probs(0.2, 10)
    mean = float(np.sum(np.arange(1, 11) * want))
    assert abs(mean - 3.8) < 0.05  # the paper's mean at p = 0.2, 10 words
    assert len(lengths) > 15_000 and lengths.max() == 10
    assert abs(lengths.mean() - mean) < 0.1, lengths.mean()
    assert np.abs(histogram(lengths, 10) - want).max() < 0.015
    # The same check tells another p apart.
    assert np.abs(histogram(lengths, 10) - spans.span_length_probs(0.3, 10)).max() > 0.05


def test_span_parameters_are_the_configs(tokenizer):
    lengths = drawn_lengths(make_spec(tokenizer, "span", span_p=0.5, span_max_words=4), num_examples=10)
    assert lengths.max() == 4
    assert np.abs(histogram(lengths, 4) - spans.span_length_probs(0.5, 4)).max() < 0.02


def test_ngram_shares_are_albert_s(tokenizer):
    lengths = drawn_lengths(make_spec(tokenizer, "ngram"), num_examples=20)
    assert len(lengths) > 15_000 and lengths.max() == 3
    np.testing.assert_allclose(histogram(lengths, 3), [6 / 11, 3 / 11, 2 / 11], atol=0.012)
    lengths = drawn_lengths(make_spec(tokenizer, "ngram", ngram_max_n=2), num_examples=5)
    np.testing.assert_allclose(histogram(lengths, 2), [2 / 3, 1 / 3], atol=0.02)


def test_lexicon_units_longest_match_from_the_left(tokenizer):
    hashes, longest = units.lexicon_units(tokenizer.encode_arrays(["New York", "new york city", "York City"]),
                                          np.asarray(tokenizer.word_start, bool), 8)
    assert longest == 3
    text = "red new york city new york york city."
    ids = np.array([tokenizer.cls_id] + tokenizer.encode([text])[0] + [tokenizer.sep_id], np.int32)
    spec = make_spec(tokenizer, "units", unit_hashes=hashes, unit_max_words=longest)
    candidate = tf.constant(~np.isin(ids, [tokenizer.cls_id, tokenizer.sep_id]))
    starts = masking.unit_groups(tf.constant(ids), candidate, None, spec).numpy()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    units_seen, current = [], []
    for token, start, cand in zip(tokens, starts, candidate.numpy()):
        if start and current:
            units_seen.append(" ".join(current))
            current = []
        if cand:
            current.append(token)
    units_seen.append(" ".join(current))
    # "new york city" wins over "new york" at the same start; "york city" after it is matched anew.
    assert units_seen == ["red", "new york city", "new york", "york city", "."]


def phrase_units(tokenizer):
    return units.lexicon_units(tokenizer.encode_arrays([p.upper() for p in PHRASES]),
                               np.asarray(tokenizer.word_start, bool), 8)


def test_units_found_once_per_corpus_are_the_examples(tokenizer):
    """The stream's units, found sentence by sentence over the corpus (in chunks of whole sentences), are
    the ones the example's own match finds in the same sentences."""
    corpus = tokenize_documents(write_documents(num_docs=50, seed=6), tokenizer)
    hashes, longest = phrase_units(tokenizer)
    marks = units.corpus_unit_starts(corpus, np.asarray(tokenizer.word_start, bool), hashes, longest,
                                     chunk_tokens=300)
    tokens, starts = corpus.tokens.astype(np.int32), corpus.sentence_starts
    ids, marked = [tokenizer.cls_id], [False]  # every sentence, each followed by [SEP]: one example
    for a, b in zip(starts[:-1], starts[1:]):
        ids += tokens[a:b].tolist() + [tokenizer.sep_id]
        marked += marks[a:b].tolist() + [False]
    assert len(ids) <= units.MAX_LENGTH
    ids = tf.constant(ids, tf.int32)
    candidate = ids != tokenizer.sep_id
    candidate &= ids != tokenizer.cls_id
    spec = make_spec(tokenizer, "units", unit_hashes=hashes, unit_max_words=longest)
    own = masking.unit_groups(ids, candidate, None, spec).numpy()
    np.testing.assert_array_equal(masking.marked_unit_starts(candidate, tf.constant(marked)).numpy(), own)
    words = masking.whole_word_groups(ids, candidate, None, spec).numpy()
    assert own.sum() < words.sum() - 100  # many multi-word units


@pytest.mark.parametrize("objective, packing", [("nsp", False), ("none", True)])
def test_stream_masks_the_corpus_units_whole(tokenizer, objective, packing):
    corpus = tokenize_documents(write_documents(num_docs=60), tokenizer)
    hashes, longest = phrase_units(tokenizer)
    spec = make_spec(tokenizer, "units", unit_hashes=hashes, unit_max_words=longest)
    stream = PretrainingStream(corpus, spec, seed=0, max_seq_length=128, objective=objective, packing=packing)
    batch = next(stream.dataset(32).as_numpy_iterator())
    weights = batch["masked_lm_weights"] > 0
    assert not np.isin(batch["masked_lm_ids"][weights], [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id]).any()
    assert abs(weights.sum() / batch["input_mask"].sum() - 0.15) < 0.01
    if packing:
        return
    multi_word, word_start = 0, np.asarray(tokenizer.word_start, bool)
    for row, example, w in zip(stream.plan(0), range(32), weights):  # the first batch: the plan's first rows
        a0, a1, b0, b1, _ = row
        marks = np.concatenate([[False], stream.unit_starts[a0:a1], [False], stream.unit_starts[b0:b1], [False]])
        begins_word = np.concatenate([[False], word_start[corpus.tokens[a0:a1]], [False],
                                      word_start[corpus.tokens[b0:b1]], [False]])
        candidate = np.zeros(len(marks), bool)
        candidate[1:a1 - a0 + 1] = candidate[a1 - a0 + 2:-1] = True
        after_candidate = np.concatenate([[False], candidate[:-1]])
        unit = group_index(candidate & (marks | ~after_candidate), candidate)
        chosen = np.zeros(len(marks), bool)
        chosen[batch["masked_lm_positions"][example][w]] = True
        for u in np.unique(unit[chosen]):
            assert chosen[unit == u].all(), "a unit was split"
            multi_word += begins_word[unit == u].sum() > 1
    assert multi_word > 0


def test_chinese_units_from_jieba(tokenizer, monkeypatch):
    pytest.importorskip("jieba")
    settings = DataSettings(masking="units", word_segmenter="jieba")
    documents = [["我爱北京天安门", "北京的大学生很好"]]
    hashes, longest = units.lexicon_for(settings, tokenizer, documents)
    assert longest >= 2
    ids = np.array([tokenizer.cls_id] + tokenizer.encode(["我爱北京天安门"])[0] + [tokenizer.sep_id], np.int32)
    spec = make_spec(tokenizer, "units", unit_hashes=hashes, unit_max_words=longest)
    candidate = tf.constant(~np.isin(ids, [tokenizer.cls_id, tokenizer.sep_id]))
    starts = masking.unit_groups(tf.constant(ids), candidate, None, spec).numpy()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert [t for t, s in zip(tokens, starts) if s] == ["我", "爱", "北", "天"]  # 北京 and 天安门 whole


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    """A SentencePiece model learned from the written text (a fraction of a second)."""
    path = str(tmp_path_factory.mktemp("sp") / "sp.model")
    vocabularies.learn_sentencepiece_model((s for d in write_documents(num_docs=150) for s in d), 400, path,
                                           lower_case=True)
    return tokenizers.load_tokenizer("sentencepiece", path)


def test_sentencepiece_words_start_at_the_word_mark(sentencepiece):
    """With SentencePiece a word is a "▁" piece and what follows it: spans and lexicon units are made of
    those, whole, and the budget is kept."""
    tok = sentencepiece
    corpus = tokenize_documents(write_documents(num_docs=40, seed=5), tok)
    tokens = corpus.tokens.astype(np.int32)
    examples = [np.concatenate([[tok.cls_id], tokens[i:i + 100], [tok.sep_id]]).astype(np.int32)
                for i in range(0, len(tokens) - 100, 100)]
    spec = make_spec(tok, "span")
    results = run_masking(examples, spec)
    pieces = 0
    for r in results:
        chosen = np.zeros(len(r["ids"]), bool)
        chosen[r["positions"][r["weights"] > 0]] = True
        marked = np.array([t.startswith("▁") for t in tok.convert_ids_to_tokens(r["ids"])])
        after_special = np.concatenate([[True], ~r["candidate"][:-1]])
        assert (marked | after_special)[r["starts"]].all()  # a unit begins a word
        unit = group_index(r["starts"], r["candidate"])
        for u in np.unique(unit[chosen]):
            assert chosen[unit == u].all()
            pieces += (~marked[unit == u]).any()
    assert pieces > 0  # words of several pieces were among the units
    share = sum(int(r["weights"].sum()) for r in results) / sum(len(r["ids"]) for r in results)
    assert abs(share - 0.15) <= 0.005, share
    hashes, longest = units.lexicon_units(tok.encode_arrays(["New York City"]), np.asarray(tok.word_start, bool), 8)
    ids = np.array([tok.cls_id] + tok.encode(["red new york city is big"])[0] + [tok.sep_id], np.int32)
    candidate = tf.constant(~np.isin(ids, [tok.cls_id, tok.sep_id]))
    starts = masking.unit_groups(tf.constant(ids), candidate, None,
                                 make_spec(tok, "units", unit_hashes=hashes, unit_max_words=longest)).numpy()
    words = masking.whole_word_groups(tf.constant(ids), candidate, None, make_spec(tok, "units")).numpy()
    assert longest == 3 and words.sum() == 6 and starts.sum() == 4  # red | new york city | is | big


def test_rate_schedule_by_step_resumes_exactly(tokenizer):
    rng = np.random.default_rng(4)
    docs = [[rng.integers(10, 300, size=rng.integers(8, 40)).tolist() for _ in range(rng.integers(2, 10))]
            for _ in range(200)]
    corpus = corpus_from_token_lists(docs, tokenizer.vocab_size)
    spec = make_spec(tokenizer, "span")

    def stream():
        return PretrainingStream(corpus, spec, seed=3, max_seq_length=128, packing=True,
                                 mask_rate_schedule=((0, 0.3), (3, 0.15)))

    full = list(stream().dataset(16).take(6).as_numpy_iterator())
    shares = [b["masked_lm_weights"].sum() / b["input_mask"].sum() for b in full]
    assert all(abs(s - 0.3) < 0.02 for s in shares[:3]) and all(abs(s - 0.15) < 0.02 for s in shares[3:]), shares
    for start in (2, 3, 4):
        resumed = list(stream().dataset(16, start_step=start).take(6 - start).as_numpy_iterator())
        for got, want in zip(resumed, full[start:]):
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"start {start} {key}")


@pytest.mark.parametrize("objective", ["nsp", "sop", "none"])
def test_every_objective_packed_with_units_longer_than_words(tokenizer, objective):
    corpus = tokenize_documents(write_documents(num_docs=60), tokenizer)
    stream = PretrainingStream(corpus, make_spec(tokenizer, "ngram"), seed=0, max_seq_length=128,
                               objective=objective, packing=True)
    batch = next(stream.dataset(32).as_numpy_iterator())
    weights = batch["masked_lm_weights"] > 0
    rows = np.nonzero(weights)[0]
    original = batch["masked_lm_ids"][weights]
    assert not np.isin(original, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id]).any()
    assert abs(weights.sum() / batch["input_mask"].sum() - 0.15) < 0.01
    assert (batch["sequence_ids"][rows, batch["masked_lm_positions"][weights]] > 0).all()


@pytest.mark.parametrize("change, message", [
    (dict(masking="spans"), "data.masking='spans' is not one of"),
    (dict(span_p=1.5), "data.span_p=1.5 must lie in (0, 1)"),
    (dict(span_max_words=0), "data.span_max_words=0: set a whole number of at least 1"),
    (dict(ngram_max_n=0), "data.ngram_max_n=0: set a whole number of at least 1"),
    (dict(masking="units"), "data.masking='units' needs its units"),
    (dict(masking="span", whole_word_masking=True), "disagree"),
    (dict(mask_rate_schedule=((5, 0.3),)), "the first phase must start at step 0"),
    (dict(mask_rate_schedule=((0, 0.3), (0, 0.1))), "the start steps must increase"),
    (dict(mask_rate_schedule=((0, 1.3),)), "rate=1.3 must lie in (0, 1)"),
])
def test_bad_masking_settings_are_one_line(change, message):
    with pytest.raises(ValueError, match=None) as error:
        DataSettings.from_config(change)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_held_out_batches_may_mask_by_another_strategy(tokenizer, tmp_path):
    """data.eval_masking: strategies compared on the same held-out masking (token)."""
    from bertjax.data import inputs

    (tmp_path / "vocab.txt").write_text("\n".join(tokenizer.vocab) + "\n", encoding="utf-8")
    lines = [s for d in write_documents(num_docs=60) for s in d + [""]]
    (tmp_path / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    data = dict(source="text", input_pattern=str(tmp_path / "corpus.txt"), vocab_path=str(tmp_path / "vocab.txt"),
                eval_fraction=0.2, masking="span")
    built = inputs.build_inputs({**data, "eval_masking": "token"}, workdir=None)
    assert (built.train.spec.grouping, built.eval.spec.grouping) == ("span", "token")
    assert inputs.build_inputs(data, workdir=None).eval.spec.grouping == "span"
    with pytest.raises(ValueError, match="needs its units"):
        DataSettings(eval_masking="units")


def test_whole_word_masking_is_the_older_form():
    assert DataSettings.from_config(dict(whole_word_masking=True)).masking == "whole_word"


def test_lexicon_and_segmenter_checked_before_anything_heavy(tmp_path, monkeypatch):
    missing = DataSettings(masking="units", units_lexicon=str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="does not exist"):
        units.check(missing)
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="is empty"):
        units.check(DataSettings(masking="units", units_lexicon=str(tmp_path / "empty.txt")))
    monkeypatch.setitem(sys.modules, "jieba", None)  # as if it were not installed
    with pytest.raises(ValueError, match="pip install jieba"):
        units.check(DataSettings(masking="units", word_segmenter="jieba"))
