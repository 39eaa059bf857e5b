"""From the config's data section to streams: held-out split, prepared shards, the CLIs, bad input."""

import json
import os
import pathlib
import runpy
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from bertjax.data import inputs, preparing, splits
from bertjax.data.settings import DataSettings
from bertjax.text import vocab_learning as vocabularies
from conftest import run_command  # tests/ is on sys.path under pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
WORDS = ("the river city north old museum built century king village church music long bridge water "
         "school road first new large small known several people many early later during because "
         "however although famous station market island mountain forest garden library tower").split()


def write_corpus(path, num_docs=160, seed=0):
    """A sentence-per-line corpus, blank line between documents, of varied English-like sentences."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.integers(1, 12)):
            words = rng.choice(WORDS, size=rng.integers(4, 18))
            lines.append(" ".join(words).capitalize() + rng.choice([".", ".", "!", "?"]))
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root / "part-0.txt", seed=0)
    write_corpus(root / "part-1.txt", seed=1)
    sentences = (line for p in sorted(root.glob("*.txt")) for line in p.read_text().splitlines() if line)
    vocabularies.learn_wordpiece_vocab(sentences, 400, True, str(root / "vocab.txt"))
    return root


def data_config(corpus_dir, **overrides):
    return full_config(corpus_dir, **overrides).data


def full_config(corpus_dir, **overrides):
    config = runpy.run_path(str(REPO / "configs" / "tiny.py"))["get_config"]()
    config.data.source = "text"
    config.data.input_pattern = str(corpus_dir / "*.txt")
    config.data.vocab_path = str(corpus_dir / "vocab.txt")
    config.data.eval_fraction = 0.1
    config.data.max_seq_length = 64
    config.data.max_predictions_per_seq = 10
    for key, value in overrides.items():
        setattr(config.data, key, value)
    return config


def documents_of(corpus):
    return {tuple(tuple(s.tolist()) for s in corpus.document(d)) for d in range(corpus.num_documents)}


def test_held_out_documents_are_never_trained_on(corpus_dir):
    data = inputs.build_inputs(data_config(corpus_dir), workdir=None)
    train, held_out = documents_of(data.train.corpus), documents_of(data.eval.corpus)
    assert held_out and train and not (train & held_out)
    assert 0.04 < len(held_out) / (len(train) + len(held_out)) < 0.2
    # The evaluation batches are fixed: the same examples and masks every time.
    a, b = data.eval_batches(8, 2), data.eval_batches(8, 2)
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_host_shares_are_disjoint_and_complete_from_the_config(corpus_dir):
    data = data_config(corpus_dir)
    whole = inputs.build_inputs(data, workdir=None)
    parts = [inputs.build_inputs(data, workdir=None, process_index=p, process_count=3) for p in range(3)]
    for split in ("train", "eval"):
        shares = [documents_of(getattr(part, split).corpus) for part in parts]
        assert sum(len(s) for s in shares) == len(set().union(*shares))  # disjoint
        assert set().union(*shares) == documents_of(getattr(whole, split).corpus)  # complete


def run_module(module, *args, cwd=REPO):
    return run_command([sys.executable, "-m", module, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)})


def config_flags(corpus_dir, **overrides):
    values = dict(source="text", input_pattern=str(corpus_dir / "*.txt"), vocab_path=str(corpus_dir / "vocab.txt"),
                  eval_fraction=0.1, max_seq_length=64, max_predictions_per_seq=10)
    values.update(overrides)
    return ["--config=configs/tiny.py"] + [f"--config.data.{k}={v}" for k, v in values.items()]


def prepare(corpus_dir, out, input_pattern, num_shards=2):
    """python -m bertjax.prepare, as a user runs it (its pool of worker processes)."""
    result = run_module("bertjax.prepare", *config_flags(corpus_dir, input_pattern=input_pattern),
                        f"--output_dir={out}", f"--num_shards={num_shards}", "--num_workers=2")
    assert result.returncode == 0, result.stderr[-2000:]
    check_prepared(out, num_shards)
    assert "train:" in result.stdout and "MB/s per worker process" in result.stdout
    return data_config(corpus_dir, source="prepared", prepared_dir=str(out), input_pattern=None, vocab_path=None)


def prepare_here(corpus_dir, out, input_pattern, num_shards=2):
    """The same shards, prepared in this process (the program's work without its worker pool)."""
    preparing.run(DataSettings.from_config(data_config(corpus_dir, input_pattern=input_pattern)), str(out),
                        num_shards=num_shards, num_workers=0)
    check_prepared(out, num_shards)
    return data_config(corpus_dir, source="prepared", prepared_dir=str(out), input_pattern=None, vocab_path=None)


def check_prepared(out, num_shards):
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_shards"] == num_shards and meta["format_version"] == 2 and meta["dtype"] == "uint16"
    assert len(list(out.glob("*.npy"))) == 6 * num_shards  # tokens, sentence and document offsets, 2 splits


@pytest.mark.slow
def test_prepared_shards_give_each_host_the_in_memory_stream(corpus_dir, tmp_path):
    # One input file, two shards: documents are dealt to shards as the in-memory path deals them to hosts.
    one_file = str(corpus_dir / "part-0.txt")
    shards = prepare_here(corpus_dir, tmp_path / "one", one_file)
    for host in range(2):
        in_memory = inputs.build_inputs(data_config(corpus_dir, input_pattern=one_file), workdir=None,
                                        process_index=host, process_count=2)
        from_shards = inputs.build_inputs(shards, workdir=None, process_index=host, process_count=2)
        for split in ("train", "eval"):
            a, b = getattr(in_memory, split).corpus, getattr(from_shards, split).corpus
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.sentence_starts, b.sentence_starts)
            np.testing.assert_array_equal(a.doc_starts, b.doc_starts)
        for x, y in zip(in_memory.train.dataset(16, start_step=5).take(2),
                        from_shards.train.dataset(16, start_step=5).take(2)):
            for key in x:
                np.testing.assert_array_equal(x[key].numpy(), y[key].numpy())
    # More hosts than shards cannot be served.
    with pytest.raises(ValueError, match="2 shards for 3 processes"):
        inputs.build_inputs(shards, workdir=None, process_index=0, process_count=3)


@pytest.mark.slow
def test_prepared_file_shards_are_disjoint_and_complete(corpus_dir, tmp_path):
    # As many files as shards: each shard is written from whole files, read in parallel.
    shards = prepare(corpus_dir, tmp_path / "two", str(corpus_dir / "*.txt"))
    whole = inputs.build_inputs(data_config(corpus_dir), workdir=None)
    for split in ("train", "eval"):
        parts = [documents_of(getattr(inputs.build_inputs(shards, workdir=None, process_index=p, process_count=2),
                                      split).corpus) for p in range(2)]
        assert not (parts[0] & parts[1]) and parts[0] | parts[1] == documents_of(getattr(whole, split).corpus)


def preview_here(config, **flags):
    """python -m bertjax.preview's run, in this process, with these flag values (the rest its defaults)."""
    from bertjax import preview

    args = dict(config=config, workdir=None, split="train", start_step=0, num_examples=5, format="text")
    preview.main(["preview"], SimpleNamespace(**{**args, **flags}))


@pytest.mark.slow
def test_preview_text_and_jsonl(corpus_dir, tmp_path, capsys):
    # One example a row (packed rows: tests/test_packing_data.py).
    preview_here(full_config(corpus_dir, packing=False), num_examples=3, workdir=str(tmp_path))
    text = capsys.readouterr().out
    assert text.startswith("legend: ⟦seen→original⟧") and "=== step 0: 32 examples of 64" in text
    assert text.count("--- example") == 3 and "⟦[MASK]→" in text and "A: [CLS]" in text
    # The program, as a tool reads it.
    jsonl = run_module("bertjax.preview", *config_flags(corpus_dir), "--num_examples=4", "--format=jsonl",
                       "--start_step=7", "--config.train.batch_size=4")
    assert jsonl.returncode == 0, jsonl.stderr[-2000:]
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert len(records) == 4
    for r in records:
        assert set(r) >= {"input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                          "masked_lm_weights", "next_sentence_labels", "tokens"}
        n = sum(r["input_mask"])
        assert len(r["input_ids"]) == 64 and r["tokens"][0] == "[CLS]" and len(r["tokens"]) == n
    # --start_step shows what a run resumed at that step is fed: with batches of 4, step 7's batch,
    # the stream's examples 28 to 31.
    data = inputs.build_inputs(data_config(corpus_dir), workdir=None)
    batch = next(data.train.dataset(4, start_step=7).as_numpy_iterator())
    assert [r["input_ids"] for r in records] == batch["input_ids"].tolist()


@pytest.mark.slow
def test_preview_shows_packing_from_its_first_lines_and_keeps_its_vocabulary(corpus_dir, tmp_path):
    # No vocab_path and no workdir: the vocabulary is learned once into the cache directory, under a digest
    # of the corpus, and read from there the next time; nothing is left in the temporary directory.
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTJAX_CACHE_DIR": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    flags = [f for f in config_flags(corpus_dir, vocab_size=400) if "vocab_path" not in f] + ["--num_examples=2"]
    runs = [run_command([sys.executable, "-m", "bertjax.preview", *flags], env=env) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    learned = list((tmp_path / "cache" / "vocabularies").glob("*/vocab.txt"))
    assert len(learned) == 1 and f"vocabulary: {learned[0]}" in runs[1].stderr
    assert runs[0].stdout == runs[1].stdout and not list((tmp_path / "tmp").iterdir())
    # Before any row, the batch line says how its rows are packed.
    first = runs[0].stdout.split("--- row 0")[0]
    assert "=== step 0: 32 rows of 64 positions hold" in first and "rows by sequences held: " in first
    assert "[k] the row's k-th sequence" in first


def test_a_predicted_position_is_one_mark_a_literal_token_is_not():
    from bertjax.runs import data_preview

    record = {"tokens": ["[CLS]", "=", "[MASK]", "cat", "=", "[SEP]"], "masked_lm_positions": [1, 3],
              "masked_lm_tokens": ["=", "dog"]}
    assert data_preview.marked_tokens(record) == ["[CLS]", "⟦=→=⟧", "[MASK]", "⟦cat→dog⟧", "=", "[SEP]"]


def test_units_masked_together_are_one_mark_with_their_statistics():
    from bertjax.runs import data_preview

    record = {"tokens": ["[CLS]", "new", "york", "city", "is", "big", "[SEP]"], "masked_lm_positions": [1, 2, 3, 5],
              "masked_lm_tokens": ["new", "york", "city", "big"]}
    record["tokens"][1:4] = ["[MASK]"] * 3
    assert data_preview.marked_tokens(record) == ["[CLS]", "⟦[MASK] [MASK] [MASK]→new york city⟧", "is",
                                                  "⟦big→big⟧", "[SEP]"]
    runs = [len(run) for run in data_preview.predicted_runs(record)]
    assert runs == [3, 1]
    line = data_preview.masking_line(4, 7, runs, "span")
    assert line.startswith("masking (span): 57.1% of the real tokens shown are predicted") and "average 2.00" in line


def expect_cli_error(result, *fragments):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "error:" in last, last
    for fragment in fragments:
        assert fragment in last, (fragment, last)


@pytest.mark.slow
def test_bad_input_gets_one_clear_line(corpus_dir, tmp_path, capsys):
    def preview_error(*fragments, **overrides):
        """The preview's run on these settings: exit 2, its error one line (naming the fragments), no traceback."""
        with pytest.raises(SystemExit) as stopped:
            preview_here(full_config(corpus_dir, **overrides), workdir=str(tmp_path))
        err = capsys.readouterr().err
        expect_cli_error(subprocess.CompletedProcess([], stopped.value.code, "", err), *fragments)
        assert len([line for line in err.splitlines() if "error:" in line]) == 1, err  # after "reading ..."

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    preview_error("no documents", input_pattern=str(empty))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A fine sentence.\nAnother one \xff\xfe here.\n")
    # The program itself, for one of them (and for a flag it does not have, below).
    expect_cli_error(run_module("bertjax.preview", *config_flags(corpus_dir, input_pattern=bad)),
                     "bad.txt", "line 2", "UTF-8")
    preview_error("bad.txt", "line 2", "UTF-8", input_pattern=str(bad))
    preview_error("nope", input_pattern=str(tmp_path / "nope*.txt"))
    no_mask = tmp_path / "vocab.txt"
    no_mask.write_text("\n".join(t for t in (corpus_dir / "vocab.txt").read_text().splitlines() if t != "[MASK]"))
    preview_error("[MASK]", vocab_path=str(no_mask))
    preview_error("data.max_predictions_per_seq=3", max_predictions_per_seq=3)
    preview_error("data.masking='spans' is not one of", masking="spans")
    preview_error("data.units_lexicon=", "does not exist", masking="units", units_lexicon=str(tmp_path / "nope.txt"))
    preview_error("data.span_p=0", "must lie in (0, 1)", masking="span", span_p=0.0)
    expect_cli_error(run_module("bertjax.preview", *config_flags(corpus_dir), "--config.data.bogus=1"),
                     "bogus")


def test_one_sentence_documents_pair_with_random_next(corpus_dir, tmp_path):
    single = tmp_path / "single.txt"
    single.write_text("\n\n".join(f"The {w} was built early in the century." for w in WORDS) + "\n")
    data = inputs.build_inputs(data_config(corpus_dir, input_pattern=str(single), eval_fraction=0.2), workdir=None)
    batch = next(data.train.dataset(32).as_numpy_iterator())
    # A lone sentence has no real continuation (packed rows: every sequence's label, at its slot).
    assert (batch["next_sentence_labels"][batch["sentence_weights"] > 0] == 1).all()


def test_a_training_split_of_one_document_is_refused(corpus_dir, tmp_path):
    """NotNext pairs take their second segment from another document: one document cannot give them."""
    candidates = [f"Document {i} talks about the {w}.\nIts second sentence is here." for i, w in enumerate(WORDS * 3)]
    train = [d for d in candidates if not splits.is_eval_document(d.split("\n"), 0.5)]
    held_out = [d for d in candidates if splits.is_eval_document(d.split("\n"), 0.5)]
    assert train and held_out
    one = tmp_path / "one.txt"
    one.write_text("\n\n".join([train[0]] + held_out[:3]) + "\n")
    with pytest.raises(ValueError, match="has 1 training document: next-sentence pairs need at least 2"):
        inputs.build_inputs(data_config(corpus_dir, input_pattern=str(one), eval_fraction=0.5), workdir=None)


def settings(corpus_dir, **overrides):
    return DataSettings.from_config(data_config(corpus_dir, **overrides))


def test_a_cached_vocabulary_must_match_the_config(corpus_dir, tmp_path):
    documents = [[f"The {w} was built early in the century.", f"Many people visited the {w}."] for w in WORDS]
    data = settings(corpus_dir, vocab_path=None, vocab_size=120)
    tokenizer, path = inputs.load_or_learn_tokenizer(data, str(tmp_path), documents)
    again, same = inputs.load_or_learn_tokenizer(data, str(tmp_path), documents)  # read back, not relearned
    assert same == path and again.vocab_size == tokenizer.vocab_size
    with pytest.raises(ValueError, match=r"learned with data.vocab_size=120, which the config changes"):
        inputs.load_or_learn_tokenizer(settings(corpus_dir, vocab_path=None, vocab_size=240), str(tmp_path),
                                       documents)


def test_mask_rates_from_the_config(corpus_dir):
    """ModernBERT trains at 30% and reports at 15%: the held-out batches take data.eval_mask_rate."""
    def rates(**overrides):
        data = settings(corpus_dir, **overrides)
        return data.mask_rate, data.held_out_mask_rate

    assert rates() == (0.15, 0.15)
    assert rates(mask_rate=0.3) == (0.3, 0.3)
    # The older name, where a config still sets it, wins over data.mask_rate.
    assert rates(mask_rate=0.3, masked_lm_prob=0.2) == (0.2, 0.2)
    data = inputs.build_inputs(data_config(corpus_dir, objective="none", mask_rate=0.3, eval_mask_rate=0.15,
                                           max_predictions_per_seq=20), workdir=None)
    for batch, rate in ((next(data.train.dataset(32).as_numpy_iterator()), 0.3), (data.eval_batches(32, 1)[0], 0.15)):
        lengths = batch["input_mask"].sum(1)
        expected = np.minimum(20, np.maximum(1, np.round(lengths * rate)))
        np.testing.assert_array_equal(batch["masked_lm_weights"].sum(1), expected)


@pytest.mark.parametrize("objective", ["sop", "none"])
def test_objectives_from_the_config(corpus_dir, objective):
    data = inputs.build_inputs(data_config(corpus_dir, objective=objective), workdir=None)
    assert data.train.objective == data.eval.objective == objective
    batch = next(data.train.dataset(64).as_numpy_iterator())
    if objective == "none":
        assert (batch["segment_ids"] == 0).all() and (batch["input_mask"].sum(1) == 64).mean() > 0.9
    else:
        labels = batch["next_sentence_labels"][batch["sentence_weights"] > 0]  # each packed sequence's
        assert (batch["segment_ids"].max(1) == 1).all() and 0.3 < labels.mean() < 0.7
    with pytest.raises(ValueError, match="data.objective='bogus' is not one of 'nsp', 'sop', 'none'"):
        inputs.build_inputs(data_config(corpus_dir, objective="bogus"), workdir=None)


def test_one_sentence_documents_cannot_give_sop_pairs(corpus_dir, tmp_path):
    single = tmp_path / "single.txt"
    single.write_text("\n\n".join(f"The {w} was built early in the century." for w in WORDS) + "\n")
    with pytest.raises(ValueError, match="data.objective='sop' .* every document here has one sentence"):
        inputs.build_inputs(data_config(corpus_dir, input_pattern=str(single), eval_fraction=0.2, objective="sop"),
                            workdir=None)
