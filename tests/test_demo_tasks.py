"""The demo corpus's fine-tuning tasks (bertjax/tasks/demo_tasks.py): word_order's shuffles move the plain
words among themselves and nothing else, so a bag of words scores exactly chance on its dev pairs; its dev sentences
come from the documents pretraining holds out; the files read as the generic classification task; the
program's output and its one-line error."""

import collections
import json
import pathlib
import re
import sys

import numpy as np
import pytest

from bertjax.data import demo, splits
from bertjax.tasks import demo_tasks
from bertjax.tasks import readers, registry, retrieval_data
from conftest import run_command  # tests/ is on sys.path under pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def word_order():
    return demo_tasks.word_order_examples(seed=0)


def test_a_shuffle_moves_the_plain_words_only():
    rng = np.random.default_rng(0)
    sentence = "The value is then returned to the caller, unchanged."
    words = sentence.split()
    # "value is then returned to the" move; "The", "caller," and "unchanged." stay.
    assert demo_tasks.movable_positions(words) == [1, 2, 3, 4, 5, 6]
    for _ in range(20):
        shuffled = demo_tasks.shuffle_words(sentence, rng).split()
        assert shuffled != words and sorted(shuffled) == sorted(words)
        fixed = [i for i in range(len(words)) if i not in demo_tasks.movable_positions(words)]
        assert [shuffled[i] for i in fixed] == [words[i] for i in fixed]
    assert not demo_tasks.shufflable("Yes, Python 3 is here.".split())  # "is" alone moves
    assert demo_tasks.shuffle_words("Yes, Python 3 is here.", rng) is None
    assert demo_tasks.shuffle_words("Yes the the the 3.", rng) is None  # one word three times: no other order


def test_word_order_dev_pairs_are_balanced_and_a_bag_of_words_is_at_chance(word_order):
    dev = word_order["dev"]
    labels = collections.Counter(row["label"] for row in dev)
    assert labels["original"] == labels["shuffled"] > 300
    bags = collections.defaultdict(list)  # the multiset of words -> the labels of the dev rows with it
    for row in dev:
        bags[tuple(sorted(row["text"].split()))].append(row["label"])
    # Every original has its shuffled twin with the same words: any classifier of word counts (or of
    # characters) gives both the same answer, so it is right on exactly half of the dev set.
    assert all(sorted(group) == ["original", "shuffled"] for group in bags.values()), "a dev pair without its twin"
    train_labels = collections.Counter(row["label"] for row in word_order["train"])
    assert abs(train_labels["original"] - train_labels["shuffled"]) <= 1 and sum(train_labels.values()) > 10_000


def test_word_order_dev_comes_from_the_held_out_documents_only(word_order):
    documents = demo.demo_documents()
    held_out = {" ".join(s.split()) for d in documents if splits.is_eval_document(d, 0.05) for s in d}
    trained_on = {" ".join(s.split()) for d in documents if not splits.is_eval_document(d, 0.05) for s in d}
    originals = {row["text"] for row in word_order["dev"] if row["label"] == "original"}
    assert originals <= held_out and not originals & trained_on
    train_originals = {row["text"] for row in word_order["train"] if row["label"] == "original"}
    assert train_originals <= trained_on


def test_the_program_writes_files_the_classification_task_reads(tmp_path):
    out = run_command([sys.executable, "-m", "bertjax.demo_task", "--task=keyword", f"--out={tmp_path}"])
    assert out.returncode == 0, out.stderr
    assert "labels: ('no', 'yes')" in out.stdout
    task = registry.get_task("classification", labels=demo_tasks.LABELS["keyword"])
    train = readers.read_jsonl(str(tmp_path / "train.jsonl"), task)
    dev = readers.read_jsonl(str(tmp_path / "dev.jsonl"), task)
    assert len(train) + len(dev) == 660 and len(dev) == 165
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert all((demo_tasks.KEYWORD in row["text"].lower()) == (row["label"] == "yes") for row in rows)

    bad = run_command([sys.executable, "-m", "bertjax.demo_task", "--task=sentiment", f"--out={tmp_path}"])
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "word_order" in bad.stderr


def test_retrieval_pairs_are_inverse_cloze_and_the_test_set_reads_as_beir(tmp_path):
    """Each query is a sentence taken out of its passage (not left in it); train, dev and test pairs come
    from disjoint documents, test from those pretraining holds out; the BEIR directory reads back as the
    test pairs, each query judged relevant to its own passage only."""
    documents = demo.demo_documents()
    side = {split: [doc for doc in documents if (splits.is_eval_document(doc, 0.05), splits.is_eval_document(
        doc, 0.10)) == where] for split, where in (("train", (False, False)), ("dev", (False, True)),
                                                   ("test", (True, True)))}
    sentences = {split: {" ".join(s.split()) for doc in docs for s in doc} for split, docs in side.items()}
    examples = demo_tasks.retrieval_examples(seed=0)
    assert len(examples["train"]) > 1000 and len(examples["dev"]) > 50 and len(examples["test"]) > 50
    for split, pairs in examples.items():
        for pair in pairs[:300]:
            assert len(pair["query"].split()) >= demo_tasks.MIN_QUERY_WORDS
            assert pair["query"] not in pair["positive"]
            assert pair["query"] in sentences[split], (split, pair)
    paths = demo_tasks.write_task("retrieval", str(tmp_path), seed=0)
    assert [json.loads(line) for line in pathlib.Path(paths["dev"]).read_text().splitlines()] == [
        {"query": p["query"], "positive": p["positive"]} for p in examples["dev"]]
    beir = retrieval_data.read_retrieval(paths["beir"])
    assert beir.queries == [p["query"] for p in examples["test"]]
    assert beir.passages == [p["positive"] for p in examples["test"]]
    assert all(beir.qrels[q] == {c: 1} for q, c in zip(beir.query_ids, beir.corpus_ids))


def test_recall_hides_one_fact_in_a_run_of_filler_and_asks_for_it_last(tmp_path):
    """recall: one fact, "The box is <colour>.", after `depth` words of a run of consecutive filler
    sentences naming no colour, box or "colour"; the question last; the label the box's colour. Training
    documents of a tenth of train_length to train_length words, their filler from the documents pretraining
    reads; dev documents of `length` words from those it holds out."""
    examples = demo_tasks.recall_examples(seed=0, length=300, train_length=100, sizes={"train": 40, "dev": 8})
    assert (len(examples["train"]), len(examples["dev"])) == (40, 8)
    documents = demo.demo_documents()
    runs = {}  # split -> every filler sentence of its documents, in order, twice (a run may wrap around)
    for split, keep in (("train", False), ("dev", True)):
        sentences = [" ".join(s.split()) for d in documents if splits.is_eval_document(d, 0.05) == keep for s in d
                     if not demo_tasks.RECALL_WORDS & set(re.findall(r"[a-z]+", s.lower()))]
        runs[split] = " ".join(sentences * 2)
    lengths = collections.defaultdict(list)
    for split in ("train", "dev"):
        for row in examples[split]:
            before, after = row["text"].split("The box is ")  # the fact once
            colour, after = after.split(".", 1)
            assert colour == row["label"] and colour in demo_tasks.RECALL_COLOURS
            assert after.endswith(" What colour is the box?") and "What colour" not in before
            filler = " ".join([before, after.removesuffix("What colour is the box?")]).split()
            assert len(before.split()) == row["depth"]
            assert (" ".join(filler) in runs[split]
                    and " ".join(filler) not in runs["dev" if split == "train" else "train"])
            assert not demo_tasks.RECALL_WORDS & {w.lower() for w in re.findall(r"[A-Za-z]+", " ".join(filler))}
            lengths[split].append(len(filler))
    assert min(lengths["train"]) >= 10 and max(lengths["train"]) < 100 + 60 and len(set(lengths["train"])) > 10
    assert all(n >= 300 for n in lengths["dev"])
    depths = [row["depth"] for row in examples["dev"]]
    assert len(set(depths)) > 4 and max(depths) > 150
    assert len({row["label"] for row in examples["train"]}) > 1

    out = run_command([sys.executable, "-m", "bertjax.demo_task", "--task=recall", "--length=50",
                       "--train_length=30", f"--out={tmp_path}"])
    assert out.returncode == 0, out.stderr
    assert "labels: ('red', 'green', 'blue', 'yellow')" in out.stdout
    task = registry.get_task("classification", labels=demo_tasks.LABELS["recall"])
    assert len(readers.read_jsonl(str(tmp_path / "dev.jsonl"), task)) == demo_tasks.RECALL_SIZES["dev"]


def test_next_sentence_pairs_follow_or_come_from_another_document(tmp_path):
    """Each "next" pair is a sentence and its successor, each "random" pair a sentence and one of another
    document of the same split; dev from the held-out documents, two pairs per first sentence, the classes
    balanced; the files read as a pair classification task."""
    examples = demo_tasks.next_sentence_examples(seed=0)
    documents = [[" ".join(s.split()) for s in d] for d in demo.demo_documents()]
    held_out = [splits.is_eval_document(d, 0.05) for d in demo.demo_documents()]
    successors, documents_of = collections.defaultdict(set), collections.defaultdict(set)
    for n, (doc, h) in enumerate(zip(documents, held_out)):
        for first, second in zip(doc, doc[1:]):
            successors[first, h].add(second)
        for sentence in doc:
            documents_of[sentence, h].add(n)
    for split, h in (("train", False), ("dev", True)):
        for row in examples[split]:
            first, second = row["text"], row["text_pair"]
            if row["label"] == "next":
                assert second in successors[first, h], row
            else:  # from a document that does not hold the first sentence
                assert not documents_of[second, h] & documents_of[first, h], row
    dev = examples["dev"]
    assert collections.Counter(row["label"] for row in dev) == {"next": len(dev) // 2, "random": len(dev) // 2}
    assert len(examples["train"]) == demo_tasks.NEXT_SENTENCE_TRAIN
    assert 0.4 < np.mean([row["label"] == "next" for row in examples["train"]]) < 0.6

    # A sentence of another document is found however few there are, and a corpus with none is an error,
    # not an endless draw.
    words = [f"word{i} of the long first document here" for i in range(500)]
    rng = np.random.default_rng(0)
    pairs = demo_tasks.next_sentence_pairs([words, ["the one sentence of the other document"]], rng, both=True)
    assert {row["text_pair"] for row in pairs if row["label"] == "random"} == {"the one sentence of the other document"}
    with pytest.raises(ValueError, match="needs at least two documents"):
        demo_tasks.next_sentence_pairs([words], rng, both=True)

    out = run_command([sys.executable, "-m", "bertjax.demo_task", "--task=next_sentence", f"--out={tmp_path}"])
    assert out.returncode == 0, out.stderr
    task = registry.get_task("classification", labels=demo_tasks.LABELS["next_sentence"])
    read = readers.read_jsonl(str(tmp_path / "dev.jsonl"), task)
    assert len(read) == len(dev) and all(example.text_pair for example in read)
