"""Fine-tuning tasks made from the built-in demo corpus (bertjax/data/demo.py), for trying fine-tuning and
compression end to end without a download:

    python -m bertjax.demo_task --task=word_order --out=/tmp/word_order
    python -m bertjax.demo_task --task=recall --out=/tmp/recall
    python -m bertjax.finetune --config=configs/finetune/classification.py --config.train.init_from=RUN \\
        --config.data.train=/tmp/word_order/train.jsonl --config.data.validation=/tmp/word_order/dev.jsonl \\
        --config.data.labels="('shuffled', 'original')"

- word_order: is the sentence as written, or have its words been shuffled? The plain lower-case words
  (no punctuation attached, not the first word) trade places among themselves; the rest stay where they
  are, so no full stop moves and no capital letter turns up inside the sentence. The two classes have the
  same words and the same characters: only their order tells them apart, which a bag of words cannot
  see and an encoder that learned the language can. Labels ("shuffled", "original").
  The dev sentences come from the documents pretraining holds out (splits.is_eval_document at
  `eval_fraction`, configs/tiny.py's 0.05), less any sentence that the other documents have too: a
  model pretrained on the demo corpus has not read them. Each dev sentence appears twice, as written
  and shuffled; each training sentence once, either way.
- keyword: does the sentence speak of what something returns (the word "return" in it)? One word
  decides the label: a task any model learns, for checking that the machinery works.

- retrieval: find the passage a sentence was taken from (the inverse cloze task, Lee et al. 2019). The
  documents are cut into passages of up to PASSAGE_SENTENCES consecutive sentences; from each passage of
  three or more, one sentence of MIN_QUERY_WORDS words or more is taken out as the query and the rest is
  its passage. train.jsonl and dev.jsonl are {"query", "positive"} pairs for contrastive fine-tuning,
  from the documents pretraining reads (dev: those whose hash lies in [eval_fraction, 2 x eval_fraction),
  which training on the pairs does not read). The documents pretraining holds out make the test set, in
  BEIR's layout: OUT/demo-test/ (corpus.jsonl: every such passage; queries.jsonl; qrels/test.tsv), a set that
  neither pretraining nor the contrastive training nor its choice of checkpoint has seen.

- recall: a long-context check (a needle in a haystack). Each document is demo sentences in order from a
  random start, with one fact, "The box is blue.", put between two of them at a random place, and ends with
  the question "What colour is the box?": the label is the box's colour. Training documents run a tenth of
  `train_length` to `train_length` words (300: within 512 tokens); dev documents `length` words (4,000:
  about 5,600 tokens), so a dev document's fact sits up to thousands of tokens from its question and from
  [CLS]. Each example also says how many words come before the fact ("depth"). A model fine-tuned on the
  short documents and evaluated on the long ones (data.eval_max_seq_length=8192) answers only if it uses
  positions farther apart than any it was fine-tuned on; one that reads only the first 1,024 tokens sees
  the fact in about one dev document in five, and is at chance (a quarter) on the rest. Filler sentences
  naming a colour, a box or "colour" are left out; dev documents are made from the documents pretraining
  holds out.

- next_sentence: a pair task, BERT's next-sentence prediction as a fine-tuning task. Does the second
  sentence follow the first in its document, or was it drawn from another document? Dev pairs come from
  the documents pretraining holds out, two per first sentence (its successor and one drawn from another
  held-out document, the classes exactly balanced); training pairs one per first sentence, either way,
  at most NEXT_SENTENCE_TRAIN. Labels ("random", "next").

word_order, keyword, recall and next_sentence are JSON lines of the generic classification task
({"text", "label"}, and "text_pair" for next_sentence; bertjax/tasks/readers.py).
"""

import json
import os
import re

import numpy as np

from bertjax.data import demo
from bertjax.data.splits import is_eval_document

TASKS = ("word_order", "keyword", "retrieval", "recall", "next_sentence")
RECALL_COLOURS = ("red", "green", "blue", "yellow")
RECALL_WORDS = frozenset({*RECALL_COLOURS, "box", "colour", "color"})  # no filler sentence names one
LABELS = {"word_order": ("shuffled", "original"), "keyword": ("no", "yes"), "recall": RECALL_COLOURS,
          "next_sentence": ("random", "next")}
RECALL_LENGTH = 4000  # words of filler in a dev document
RECALL_TRAIN_LENGTH = 300  # the most words of filler in a training document: it fits 512 tokens
RECALL_SIZES = {"train": 6000, "dev": 200}
KEYWORD = "return"
NEXT_SENTENCE_TRAIN = 6000  # training pairs: enough to learn the task in minutes on a CPU
_PLAIN_WORD = re.compile(r"[a-z]+")
# A sentence with fewer movable words than this has too few orders to tell apart from its own.
MIN_MOVABLE_WORDS = 3
PASSAGE_SENTENCES = 5
MIN_QUERY_WORDS = 6


def movable_positions(words: list[str]) -> list[int]:
    """The positions (after the first) of plain lower-case words: shuffling them among themselves moves
    no punctuation and no capital."""
    return [i for i in range(1, len(words)) if _PLAIN_WORD.fullmatch(words[i])]


def shufflable(words: list[str]) -> bool:
    """At least MIN_MOVABLE_WORDS movable words, not all the same word: another order exists."""
    movable = [words[i] for i in movable_positions(words)]
    return len(movable) >= MIN_MOVABLE_WORDS and len(set(movable)) > 1


def shuffle_words(sentence: str, rng: np.random.Generator) -> str | None:
    """The sentence with its movable words in a random other order; None where it is not shufflable."""
    words = sentence.split()
    if not shufflable(words):
        return None
    positions = movable_positions(words)
    movable = [words[i] for i in positions]
    order = rng.permutation(len(positions))
    while [movable[j] for j in order] == movable:  # at least two distinct words: another order exists
        order = rng.permutation(len(positions))
    for i, j in zip(positions, order):
        words[i] = movable[j]
    return " ".join(words)


def _sentences(documents, min_words: int, max_words: int) -> list[str]:
    return [" ".join(s.split()) for doc in documents for s in doc if min_words <= len(s.split()) <= max_words]


def word_order_examples(seed: int = 0, eval_fraction: float = 0.05, max_train: int | None = None,
                        min_words: int = 6, max_words: int = 30) -> dict[str, list[dict]]:
    """{"train": [...], "dev": [...]} examples {"text", "label"} of the word_order task (see above)."""
    documents = demo.demo_documents()
    held_out = [is_eval_document(doc, eval_fraction) for doc in documents]
    rng = np.random.default_rng(seed)
    splits = {"train": [], "dev": []}
    seen = set()  # a sentence is in one split, once (boilerplate recurs across documents)
    for split, keep in (("train", False), ("dev", True)):
        candidates = _sentences([d for d, h in zip(documents, held_out) if h == keep], min_words, max_words)
        candidates = [s for s in dict.fromkeys(candidates)
                      if s not in seen and shufflable(s.split())]
        seen.update(candidates)
        rng.shuffle(candidates)
        if split == "train" and max_train is not None:
            candidates = candidates[:max_train]
        for n, sentence in enumerate(candidates):
            shuffled = shuffle_words(sentence, rng)
            if split == "dev":  # both versions of every dev sentence: the classes exactly balanced
                splits[split] += [{"text": sentence, "label": "original"}, {"text": shuffled, "label": "shuffled"}]
            else:  # alternately: half of the training sentences shuffled
                splits[split].append({"text": shuffled, "label": "shuffled"} if n % 2 else
                                     {"text": sentence, "label": "original"})
        if not splits[split]:
            raise ValueError(f"the demo corpus gave no {split} sentences for word_order: raise eval_fraction "
                             f"(now {eval_fraction})")
    rng.shuffle(splits["train"])
    rng.shuffle(splits["dev"])
    return splits


def next_sentence_pairs(documents, rng: np.random.Generator, both: bool, min_words: int = 4) -> list[dict]:
    """{"text", "text_pair", "label"} pairs of the next_sentence task from `documents` (see above): per
    sentence with a successor, the successor and a sentence of another document (both) or one of the two
    at random."""
    documents = [[" ".join(s.split()) for s in doc] for doc in documents]
    holders = {}  # sentence -> the documents that hold it (boilerplate recurs)
    for d, sentences in enumerate(documents):
        for sentence in sentences:
            holders.setdefault(sentence, set()).add(d)
    pool = list(holders)
    pairs = []
    for sentences in documents:
        for first, second in zip(sentences, sentences[1:]):
            if min(len(first.split()), len(second.split())) < min_words:
                continue
            next_pair = {"text": first, "text_pair": second, "label": "next"}
            other = {"text": first, "text_pair": sentence_elsewhere(pool, holders, first, rng), "label": "random"}
            pairs += [next_pair, other] if both else [next_pair if rng.random() < 0.5 else other]
    return pairs


def sentence_elsewhere(pool: list, holders: dict, first: str, rng: np.random.Generator, draws: int = 100) -> str:
    """A sentence of the pool, at random, that no document holding `first` holds. Random draws first (on a
    corpus of many documents the first one nearly always serves); then the sentences that qualify, so
    that a corpus without any is an error rather than an endless loop."""
    for _ in range(draws):
        candidate = pool[int(rng.integers(len(pool)))]
        if not holders[candidate] & holders[first]:
            return candidate
    others = [sentence for sentence in pool if not holders[sentence] & holders[first]]
    if not others:
        raise ValueError(f"no sentence outside the documents holding {first[:60]!r}: the next_sentence task needs "
                         "at least two documents with sentences of their own")
    return others[int(rng.integers(len(others)))]


def next_sentence_examples(seed: int = 0, eval_fraction: float = 0.05,
                           max_train: int = NEXT_SENTENCE_TRAIN) -> dict[str, list[dict]]:
    """{"train", "dev"} pairs of the next_sentence task: dev from the documents pretraining holds out."""
    documents = demo.demo_documents()
    held_out = [is_eval_document(doc, eval_fraction) for doc in documents]
    rng = np.random.default_rng(seed)
    dev = next_sentence_pairs([d for d, h in zip(documents, held_out) if h], rng, both=True)
    train = next_sentence_pairs([d for d, h in zip(documents, held_out) if not h], rng, both=False)
    if not dev or not train:
        raise ValueError(f"the demo corpus gave no {'dev' if not dev else 'training'} pairs for next_sentence: "
                         f"raise eval_fraction (now {eval_fraction})")
    rng.shuffle(train)
    rng.shuffle(dev)
    return {"train": train[:max_train], "dev": dev}


def keyword_examples(seed: int = 0, per_class: int = 330) -> list[tuple[str, str]]:
    """(sentence, "yes" | "no") pairs of the keyword task, balanced, shuffled: sentences of 30 to 160
    characters, "yes" where "return" is in them."""
    sentences = [s for doc in demo.demo_documents() for s in doc if 30 <= len(s) <= 160]
    positive = [s for s in sentences if KEYWORD in s.lower()]
    negative = [s for s in sentences if KEYWORD not in s.lower()]
    rng = np.random.default_rng(seed)
    n = min(len(positive), len(negative), per_class)
    chosen = [(s, "yes") for s in rng.choice(positive, n, replace=False)] + \
             [(s, "no") for s in rng.choice(negative, n, replace=False)]
    rng.shuffle(chosen)
    return chosen


def cloze_pairs(documents, rng: np.random.Generator) -> list[dict]:
    """{"id", "query", "positive"} per passage of three or more sentences that has a sentence of
    MIN_QUERY_WORDS words or more to take out (see above)."""
    pairs = []
    for d, doc in enumerate(documents):
        for start in range(0, len(doc), PASSAGE_SENTENCES):
            passage = [" ".join(s.split()) for s in doc[start:start + PASSAGE_SENTENCES]]
            long_enough = [i for i, s in enumerate(passage) if len(s.split()) >= MIN_QUERY_WORDS]
            if len(passage) < 3 or not long_enough:
                continue
            taken = int(rng.choice(long_enough))
            rest = " ".join(s for s in passage if s != passage[taken])  # a repeat of it goes too
            pairs.append({"id": f"d{d}p{start // PASSAGE_SENTENCES}", "query": passage[taken], "positive": rest})
    return pairs


def retrieval_examples(seed: int = 0, eval_fraction: float = 0.05) -> dict[str, list[dict]]:
    """{"train", "dev", "test"} pairs (see above): test from the documents pretraining holds out."""
    documents = demo.demo_documents()
    side = ["test" if is_eval_document(doc, eval_fraction) else
            "dev" if is_eval_document(doc, 2 * eval_fraction) else "train" for doc in documents]
    rng = np.random.default_rng(seed)
    splits = {split: cloze_pairs([d for d, s in zip(documents, side) if s == split], rng)
              for split in ("train", "dev", "test")}
    rng.shuffle(splits["train"])
    return splits


def write_beir(pairs: list[dict], out: str) -> str:
    """Pairs as a BEIR directory: each pair's passage in the corpus, its query judged relevant to it."""
    os.makedirs(os.path.join(out, "qrels"), exist_ok=True)
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": p["id"], "title": "", "text": p["positive"]}) + "\n" for p in pairs)
    with open(os.path.join(out, "queries.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"_id": "q" + p["id"], "text": p["query"]}) + "\n" for p in pairs)
    with open(os.path.join(out, "qrels", "test.tsv"), "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"q{p['id']}\t{p['id']}\t1\n" for p in pairs)
    return out


def recall_document(filler: list[str], rng: np.random.Generator, length: int) -> dict:
    """One recall example (see above): {"text", "label", "depth"}, its filler drawn from `filler` sentences
    from a random start on, in order, until `length` words, the fact put before a random one of them (or
    last)."""
    colour = RECALL_COLOURS[int(rng.integers(len(RECALL_COLOURS)))]
    words, body, at = 0, [], int(rng.integers(len(filler)))
    while words < length:
        body.append(filler[at % len(filler)])
        words += len(body[-1].split())
        at += 1
    place = int(rng.integers(len(body) + 1))
    depth = sum(len(sentence.split()) for sentence in body[:place])
    body.insert(place, f"The box is {colour}.")
    return {"text": " ".join([*body, "What colour is the box?"]), "label": colour, "depth": depth}


def recall_examples(seed: int = 0, length: int = RECALL_LENGTH, train_length: int = RECALL_TRAIN_LENGTH,
                    eval_fraction: float = 0.05, sizes: dict | None = None) -> dict[str, list[dict]]:
    """{"train": [...], "dev": [...]} examples {"text", "label", "depth"} of the recall task (see above):
    training documents of train_length // 10 to train_length words of filler, dev documents of `length`."""
    for flag, value in (("length", length), ("train_length", train_length)):
        if value < 1:
            raise ValueError(f"--{flag}={value} must be a positive number of words")
    documents = demo.demo_documents()
    held_out = [is_eval_document(doc, eval_fraction) for doc in documents]
    rng = np.random.default_rng(seed)
    splits = {}
    for split, keep in (("train", False), ("dev", True)):
        filler = [" ".join(s.split()) for d, h in zip(documents, held_out) if h == keep for s in d
                  if not RECALL_WORDS & set(re.findall(r"[a-z]+", s.lower()))]
        count = (sizes or RECALL_SIZES)[split]
        lengths = (rng.integers(max(1, train_length // 10), train_length + 1, size=count) if split == "train"
                   else [length] * count)
        splits[split] = [recall_document(filler, rng, int(n)) for n in lengths]
    return splits


def task_examples(task: str, seed: int = 0, dev_fraction: float = 0.25, length: int = RECALL_LENGTH,
                  train_length: int = RECALL_TRAIN_LENGTH) -> dict[str, list[dict]]:
    """{"train", "dev"} examples of a demo task; the keyword task's last dev_fraction is its dev set;
    `length` and `train_length`: the recall task's words of filler in its dev and training documents."""
    if task == "word_order":
        return word_order_examples(seed)
    if task == "keyword":
        rows = [{"text": s, "label": label} for s, label in keyword_examples(seed)]
        cut = int(round(len(rows) * (1 - dev_fraction)))
        return {"train": rows[:cut], "dev": rows[cut:]}
    if task == "retrieval":
        return retrieval_examples(seed)
    if task == "recall":
        return recall_examples(seed, length, train_length)
    if task == "next_sentence":
        return next_sentence_examples(seed)
    raise ValueError(f"unknown demo task {task!r}: choose one of {TASKS}")


def write_task(task: str, out: str, seed: int = 0, length: int = RECALL_LENGTH,
               train_length: int = RECALL_TRAIN_LENGTH) -> dict[str, str]:
    """Writes OUT/train.jsonl and OUT/dev.jsonl (retrieval: and the test pairs as OUT/demo-test/); returns
    {split: path}."""
    os.makedirs(out, exist_ok=True)
    paths = {}
    examples = task_examples(task, seed, length=length, train_length=train_length)
    test = examples.pop("test", None)
    for split, rows in examples.items():
        paths[split] = os.path.join(out, f"{split}.jsonl")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps({k: v for k, v in row.items() if k != "id"}) + "\n" for row in rows)
    if task == "retrieval":
        paths["beir"] = write_beir(test, os.path.join(out, "demo-test"))
    return paths
