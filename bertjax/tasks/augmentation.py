"""Tang et al. 2019's data augmentation for task distillation (section 3.2): copies of each training example,
some words masked or swapped and some copies cut to an n-gram, which the teacher labels (its logits inside the
step, as task distillation reads every row) and the student learns from as from the originals.

Each copy goes through the example's words in turn, each drawing X ~ U[0, 1):
  X < p_mask                    the word becomes the mask token (one token for the whole word)
  p_mask <= X < p_mask + p_pos  the word becomes another word of its class, drawn from the training set's
                                unigram distribution renormalised within the class (never the word itself)
then, with probability p_ng, the copy becomes one of its n-grams (n uniform in 1..max_ngram, cut to its length;
its start uniform). Copies equal to the example or to one of its earlier copies are discarded (the paper's), so
with every probability 0 nothing is added. A pair's copies cycle through augmenting its first sentence only,
its second only, and both (the paper's); a copy cut to n-grams cuts each sentence it augments.

The class. The paper draws the new word from those of the same part-of-speech tag. There is no tagger here;
the class is the word's frequency band instead: the training set's distinct words ranked by count, `band` of
them to a class (a last band under half that joins the one before). Why this fallback and not another: the
paper renormalises by POS to keep the training distribution and the sentence's shape, and the most frequent
words are the closed classes (determiners, prepositions, pronouns, auxiliaries) while content words share the
long tail, so a frequent word is swapped for another frequent one and a rare content word for another rare
one, each in proportion to its count (the unigram distribution kept). Nearest-word replacement would need word
vectors, which a student trained from scratch does not have before training; a uniform draw from the
vocabulary would bring in words, and piece sequences, the task's text never has.

Words are the tokenizer's: a word-start token and the continuation tokens after it (Tokenizer.word_start, what
whole-word masking groups), the student's vocabulary being the teacher's tokens. Deterministic: example i's
copies are drawn from numpy's generator keyed by (seed, SALT, i), whatever the other examples.
"""

import dataclasses

import numpy as np

from bertjax.tasks import features as task_features

TASK_KINDS = ("classification", "regression")  # the kinds of sentences and pairs, one label per example
SALT = 0xA06  # keeps these draws apart from the run's other uses of train.seed
INPUT_KEYS = ("input_ids", "segment_ids", "input_mask")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The distill section's augment_* settings (the paper's p_mask, p_pos, p_ng and n_iter)."""

    copies: int  # n_iter: copies drawn per example (duplicates then discarded); 0: none
    p_mask: float = 0.1
    p_pos: float = 0.1
    p_ng: float = 0.25
    max_ngram: int = 5
    band: int = 100  # distinct words per frequency band (the class a swapped word is drawn from)

    def __post_init__(self):
        if not isinstance(self.copies, int) or isinstance(self.copies, bool) or self.copies < 0:
            raise ValueError(f"distill.augment_copies={self.copies!r}: a whole number of copies per example (0: none; "
                             "the paper: up to 20)")
        for name in ("p_mask", "p_pos", "p_ng"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"distill.augment_{name}={value!r}: a probability in [0, 1]")
        if self.p_mask + self.p_pos > 1.0:
            raise ValueError(f"distill.augment_p_mask + augment_p_pos = {self.p_mask + self.p_pos:g}: at most 1 (a "
                             "word is masked or swapped, not both)")
        for name, least in (("max_ngram", 1), ("band", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"distill.augment_{name}={value!r}: a whole number, at least {least}")


def split_words(ids: np.ndarray, word_start: np.ndarray) -> list[np.ndarray]:
    """A sentence's token ids [n] -> its words, each the ids of a word-start token and the continuation tokens
    after it (a sentence's first token starts a word, whatever it is)."""
    ids = np.asarray(ids, np.int64)
    if not len(ids):
        return []
    starts = np.asarray(word_start, bool)[ids]  # [n]
    starts[0] = True
    return np.split(ids, np.flatnonzero(starts)[1:])


@dataclasses.dataclass
class Words:
    """The training set's distinct words (word ids by first appearance), their counts and frequency bands, and
    the mask token as one more word (id `mask`), laid out for drawing swaps in proportion to count."""

    flat: np.ndarray  # int32: every word's tokens, word after word
    offsets: np.ndarray  # int64 [W + 2]: word w's tokens are flat[offsets[w]:offsets[w + 1]] (W: the mask word)
    counts: np.ndarray  # int64 [W]
    order: np.ndarray  # int64 [W]: the word ids by rank (count, most first; ties by first appearance)
    cumulative: np.ndarray  # int64 [W]: counts summed along `order`
    class_base: np.ndarray  # int64 [W]: per word, the cumulative count before its band begins
    class_total: np.ndarray  # int64 [W]: per word, its band's count
    before: np.ndarray  # int64 [W]: per word, its band's count before it (along `order`)
    band_of: np.ndarray  # int64 [W]: per word, its band (0: the most frequent words)

    @property
    def mask(self) -> int:
        return len(self.counts)

    @classmethod
    def of(cls, sentences: list[list[np.ndarray]], band: int, mask_id: int) -> tuple["Words", list[np.ndarray]]:
        """The table of the words of `sentences` (each a list of words' ids), and each sentence as word ids."""
        index, tokens, counts, encoded = {}, [], [], []
        for words in sentences:
            row = np.empty(len(words), np.int64)
            for i, word in enumerate(words):
                key = word.tobytes()
                w = index.get(key)
                if w is None:
                    w = index[key] = len(tokens)
                    tokens.append(word)
                    counts.append(0)
                counts[w] += 1
                row[i] = w
            encoded.append(row)
        counts = np.asarray(counts, np.int64)
        n = len(counts)
        order = np.argsort(-counts, kind="stable")  # rank -> word
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        bands = rank // band
        last = (n - 1) // band
        if last > 0 and n % band and n % band < band / 2:  # a short last band joins the one before
            bands = np.minimum(bands, last - 1)
        cumulative = np.cumsum(counts[order])
        band_starts = np.searchsorted(bands[order], np.arange(int(bands.max(initial=0)) + 1))  # first rank of each
        base = np.concatenate([[0], cumulative])[band_starts]  # [bands]: the count before each band
        ends = np.concatenate([band_starts[1:], [n]])
        totals = np.concatenate([[0], cumulative])[ends] - base
        lengths = np.array([len(t) for t in tokens] + [1], np.int64)
        flat = np.concatenate([*tokens, [mask_id]]).astype(np.int32)
        return cls(flat, np.concatenate([[0], np.cumsum(lengths)]), counts, order, cumulative, base[bands],
                   totals[bands], np.concatenate([[0], cumulative])[rank] - base[bands], bands), encoded

    def tokens(self, words: np.ndarray) -> np.ndarray:
        """Word ids [w] -> their tokens, in order: int32 [n]."""
        lengths = self.offsets[words + 1] - self.offsets[words]
        firsts = np.repeat(self.offsets[words] - (np.cumsum(lengths) - lengths), lengths)
        return self.flat[firsts + np.arange(int(np.sum(lengths)))]

    def swaps(self, words: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """For each word of `words` [m] (one of a band of at least two), another word of its band, drawn with
        probability count / (the band's count less the word's) from draws [m] ~ U[0, 1): word ids [m]."""
        target = draws * (self.class_total[words] - self.counts[words])  # along the band, the word left out
        target = np.where(target >= self.before[words], target + self.counts[words], target)
        positions = np.searchsorted(self.cumulative, self.class_base[words] + target, side="right")
        return self.order[np.minimum(positions, len(self.order) - 1)]

    def swappable(self, words: np.ndarray) -> np.ndarray:
        """Whether each word's band holds another word to swap it for: bool [m]."""
        return self.class_total[words] > self.counts[words]


def _cut(length: int, rng, max_ngram: int) -> tuple[int, int]:
    """(start, n) of an n-gram of a sentence of `length` words: n uniform in 1..max_ngram (at most length)."""
    n = min(int(rng.integers(1, max_ngram + 1)), length)
    return int(rng.integers(0, length - n + 1)), n


def _words_of_copies(words: np.ndarray, augmented: np.ndarray, rng, settings: Settings, table: Words, stats: dict):
    """One sentence's words [n] in each of C copies: word ids [C, n], masked and swapped where the copy
    augments the sentence (augmented [C] bool); the counts added to stats."""
    copies = len(augmented)
    draws = rng.random((copies, len(words)))  # X per copy and word
    masked = (draws < settings.p_mask) & augmented[:, None]
    swap = ((draws >= settings.p_mask) & (draws < settings.p_mask + settings.p_pos) & augmented[:, None]
            & table.swappable(words)[None, :])
    out = np.broadcast_to(words, (copies, len(words))).copy()
    out[masked] = table.mask
    chosen = np.nonzero(swap)
    out[chosen] = table.swaps(words[chosen[1]], rng.random(len(chosen[0])))
    stats["words"] += int(np.sum(augmented)) * len(words)
    stats["masked"] += int(np.sum(masked))
    stats["swapped"] += int(np.sum(swap))
    return out


def augment(sentences: list, settings: Settings, *, word_start: np.ndarray, mask_id: int, seed: int,
            keep_duplicates: bool = False) -> tuple[list, dict]:
    """The copies of every example, in example order: [(example index, ids_a, ids_b or None)], and the counts
    of what was drawn: {examples, copies (drawn), kept, words (those of the sentences augmented), masked,
    swapped, ngrams (copies cut)}.

    input        meaning
    sentences    [(ids_a, ids_b or None)]: each example's token ids (no special tokens), its second sentence
    word_start   bool [vocab_size]: the tokens that begin a word (Tokenizer.word_start)
    mask_id      the mask token (a masked word becomes this one token)
    keep_duplicates  True keeps copies equal to the example or an earlier copy (the statistics' tests)
    Example: copies, stats = augment([(ids, None)], Settings(copies=20), word_start=tok.word_start,
                                     mask_id=tok.mask_id, seed=0)
    """
    split = [[split_words(a, word_start), split_words(b, word_start) if b is not None else None]
             for a, b in sentences]
    table, encoded = Words.of([w for pair in split for w in pair if w is not None], settings.band, mask_id)
    stats = dict(examples=len(sentences), copies=0, kept=0, words=0, masked=0, swapped=0, ngrams=0)
    out, encoded = [], iter(encoded)
    for i, (_, b) in enumerate(split):
        rng = np.random.default_rng([seed, SALT, i])
        first = next(encoded)
        second = next(encoded) if b is not None else None
        cycle = np.arange(settings.copies) % 3  # a pair: 0 the first sentence, 1 the second, 2 both
        parts = [(first, cycle != 1 if second is not None else np.ones(settings.copies, bool))]
        if second is not None:
            parts.append((second, cycle != 0))
        drawn = [_words_of_copies(words, augmented, rng, settings, table, stats) for words, augmented in parts]
        cut = rng.random(settings.copies) < settings.p_ng
        seen = {tuple(w.tobytes() for w, _ in parts)}
        for c in range(settings.copies):
            copy = []
            for (_, augmented), rows in zip(parts, drawn):
                row = rows[c]
                if cut[c] and augmented[c] and len(row):
                    start, n = _cut(len(row), rng, settings.max_ngram)
                    row = row[start:start + n]
                copy.append(row)
            stats["copies"] += 1
            stats["ngrams"] += int(cut[c])
            key = tuple(row.tobytes() for row in copy)
            if key in seen and not keep_duplicates:
                continue
            seen.add(key)
            stats["kept"] += 1
            out.append((i, table.tokens(copy[0]), table.tokens(copy[1]) if second is not None else None))
    return out, stats


def augmented_features(features: dict, examples: list, tokenizer, max_seq_length: int, settings: Settings,
                       seed: int) -> tuple[dict, dict]:
    """A training split's features (bertjax/tasks/features.py's, row i = examples[i]) with every example's kept
    copies after them, as the split's rows are made (the tokenizer's template, cut at max_seq_length): each
    copy carries its example's label and idx, and gold_weight float32 [N] is 1 for the originals, 0 for the
    copies (which have no gold label of their own: task distillation's gold loss leaves them out). Returns
    (features, augment's counts); the features unchanged, without gold_weight, where no copy is kept."""
    texts = tokenizer.encode_arrays([e.text for e in examples])
    pair_at = [i for i, e in enumerate(examples) if e.text_pair is not None]
    pairs = dict(zip(pair_at, tokenizer.encode_arrays([examples[i].text_pair for i in pair_at])))
    copies, stats = augment([(a, pairs.get(i)) for i, a in enumerate(texts)], settings,
                            word_start=tokenizer.word_start, mask_id=tokenizer.mask_id, seed=seed)
    if not copies:
        return features, stats
    special = dict(template=tokenizer.template, pad_id=tokenizer.pad_id)
    rows = [task_features.encode_pair(a, b, max_seq_length, **special) for _, a, b in copies]
    source = np.array([i for i, _, _ in copies], np.int64)
    out = {key: np.concatenate([value, np.stack([r[key] for r in rows]) if key in INPUT_KEYS else value[source]])
           for key, value in features.items()}
    out["gold_weight"] = np.concatenate([np.ones(len(examples), np.float32), np.zeros(len(copies), np.float32)])
    return out, stats
