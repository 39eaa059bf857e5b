"""ColBERT's texts as token rows, as sentence-transformers 6.3's MultiVectorEncoder makes them (its
Transformer's query_length / document_length / query_expansion, its prompts, its MultiVectorMask).

    query     [CLS] marker text... [SEP] [MASK] [MASK] ...    exactly query_length tokens (cut, or expanded)
    document  [CLS] marker text... [SEP] [PAD] ...            at most document_length real tokens

Markers (MultiVectorTexts.markers):
  prompt  sentence-transformers 6.x's way: "[Q] " / "[D] " written before the text (its prompts) and
          tokenized with it, so with a vocabulary that lacks them "[Q]" is the three tokens "[", "q", "]"
  token   one vocabulary token right after [CLS], Stanford ColBERT's and PyLate's way ([unused0] /
          [unused1]); an export registers it as a special token, so that the same prompt text gives that id
  none    no marker
The text (with its prompt) is cut to the length less the template's special tokens, from the end.
Query expansion (ColBERT's query augmentation): the positions after [SEP] up to query_length hold [MASK]
and are scored; attend_expansion=False leaves them out of attention (input_mask 0), as classic ColBERT and
sentence-transformers' attend=False do; their outputs are computed and scored all the same.
Score mask: every real token ([CLS], [SEP] and the markers included) and a query's expansion; a document's
tokens that are a skiplist word (a vocabulary token equal to one, string.punctuation by default) are out.

Shape legend: N texts, L the kind's length (query_length or document_length).
"""

import dataclasses
import string

import numpy as np

KINDS = ("query", "document")
MARKERS = ("prompt", "token", "none")
# (query, document) markers where none are given, by MultiVectorTexts.markers.
DEFAULT_MARKERS = {"prompt": ("[Q] ", "[D] "), "token": ("[unused0]", "[unused1]"), "none": ("", "")}
PUNCTUATION = tuple(string.punctuation)  # ColBERT's document skiplist (Stanford's mask_punctuation, PyLate's)


@dataclasses.dataclass(frozen=True)
class MultiVectorTexts:
    """How a ColBERT model's queries and documents become rows: one record that the featurizer and the
    sentence-transformers export both read, so the two cannot disagree."""

    markers: str = "prompt"  # MARKERS
    query_marker: str | None = None  # None: DEFAULT_MARKERS[markers]
    document_marker: str | None = None
    query_length: int = 32  # ColBERT's query_maxlen: the queries' width
    document_length: int = 180  # ColBERT's doc_maxlen: a document's most tokens
    query_expansion: bool = True  # queries padded with scored [MASK] to query_length
    attend_expansion: bool = False  # the encoder attends to the [MASK] positions (PyLate's attend_to_expansion)
    skiplist: tuple = PUNCTUATION  # words whose tokens a document does not score

    def __post_init__(self):
        if self.markers not in MARKERS:
            raise ValueError(f"multi-vector markers={self.markers!r}: choose prompt (\"[Q] \" and \"[D] \" written "
                             "before the text, sentence-transformers 6.x), token (one vocabulary token after [CLS], "
                             "Stanford ColBERT's [unused0] and [unused1]) or none")
        if self.markers == "none" and (self.query_marker or self.document_marker):
            raise ValueError("multi-vector markers=none writes no marker: set markers=prompt or token to use "
                             f"{self.query_marker or self.document_marker!r}")
        for name in ("query_length", "document_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 3:
                raise ValueError(f"multi-vector {name}={value!r}: a whole number of tokens, at least 3")
        object.__setattr__(self, "skiplist", tuple(str(word) for word in self.skiplist))

    def marker(self, kind: str) -> str:
        """The query's or the document's marker as written (a prompt, or a token's name)."""
        given = self.query_marker if kind == "query" else self.document_marker
        return DEFAULT_MARKERS[self.markers][KINDS.index(kind)] if given is None else given

    def length(self, kind: str) -> int:
        return self.query_length if kind == "query" else self.document_length


def _marker_ids(tokenizer, settings: MultiVectorTexts, kind: str) -> list[int]:
    """The ids a "token" marker puts after [CLS]: the one vocabulary token it names."""
    if settings.markers != "token":
        return []
    name = settings.marker(kind)
    ids = [i for i, token in enumerate(tokenizer.vocab) if token == name]
    if not ids:
        raise ValueError(f"the {kind} marker {name!r} is not in the vocabulary: name one of its tokens (e.g. "
                         "[unused0] of BERT's), or set markers=prompt")
    return ids[:1]


def skiplist_ids(tokenizer, words) -> np.ndarray:
    """int32 ids of the vocabulary tokens equal to a skiplist word; words that are no single token are
    left out, as sentence-transformers leaves them out (they would otherwise skip [UNK])."""
    index = {token: i for i, token in enumerate(tokenizer.vocab)}
    return np.array(sorted({index[w] for w in words if w in index}), np.int32)


def featurize(tokenizer, texts: list[str], kind: str, settings: MultiVectorTexts) -> dict[str, np.ndarray]:
    """The rows of `texts` as queries or documents (kind): int32 [N, L] input_ids, segment_ids, input_mask
    (what the encoder attends to) and score_mask (the tokens MaxSim scores), L = settings.length(kind).
    tokenizer: a bertjax tokenizer (bertjax/text/tokenizers.py)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: featurize texts as one of {', '.join(KINDS)}")
    length, template = settings.length(kind), tokenizer.template
    marker_ids = _marker_ids(tokenizer, settings, kind)
    room = length - template.added() - len(marker_ids)  # the text's tokens at most
    if room < 1:
        raise ValueError(f"multi-vector {kind}_length={length} leaves no token for the text beside "
                         f"{template.added() + len(marker_ids)} special and marker tokens: raise it")
    # A prompt is written before the text; a token marker's text follows a special token, whose space stays.
    prefix = settings.marker(kind) if settings.markers == "prompt" else " " if marker_ids else ""
    ids = np.full((len(texts), length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((len(texts), length), np.int32)
    for row, body in enumerate(tokenizer.encode([prefix + text for text in texts])):
        tokens = template.single((marker_ids + list(body))[:len(marker_ids) + room])
        ids[row, :len(tokens)] = tokens
        input_mask[row, :len(tokens)] = 1
    score_mask = input_mask.copy()
    if kind == "query" and settings.query_expansion:
        ids[input_mask == 0] = tokenizer.mask_id
        score_mask[:] = 1
        if settings.attend_expansion:
            input_mask[:] = 1
    if kind == "document" and settings.skiplist:
        score_mask[np.isin(ids, skiplist_ids(tokenizer, settings.skiplist))] = 0
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": input_mask, "score_mask": score_mask}
