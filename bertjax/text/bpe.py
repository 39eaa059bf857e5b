"""Byte-level BPE (RoBERTa's GPT-2 vocabulary, ModernBERT's OLMo one) from a Hugging Face tokenizer.json.

The engine is the `tokenizers` library, the one transformers' own tokenizers run, so the ids are
AutoTokenizer's. The file says everything bertjax needs: the special tokens' roles (cls and sep from its
post-processor, pad, mask and unk from its special added tokens by name: <pad> or [PAD]) and the
family's template (RoBERTa's <s> A </s></s> B </s>, ModernBERT's [CLS] A [SEP] B [SEP]).

As bertjax's other tokenizers, a special token written in the text stays plain text (a corpus never
injects one); fill_mask alone reads the written mask token. Inside tf.data the engine runs through
tf.numpy_function: it is a pure function of the text, so the stream stays deterministic.
"""

import itertools
import json

import numpy as np
import tokenizers as hf_tokenizers

from bertjax.text import templates, tf_cpu
from bertjax.text.templates import SPECIAL_ROLES
from bertjax.text.tokenizers import Tokenizer

tf = tf_cpu.import_tensorflow()

_BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": byte-level BPE's mark of a token that starts after a space
_PROCESSORS = ("TemplateProcessing", "RobertaProcessing", "BertProcessing")


def read_spec(path: str) -> dict:
    """A tokenizer.json as a dict; one line where it is not a byte-level BPE one."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer.json not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    model = (spec.get("model") or {}).get("type")
    if model != "BPE":
        raise ValueError(f"{path} is a {model} tokenizer: the bpe tokenizer reads a tokenizer.json whose model is BPE")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if not any((step or {}).get("type") == "ByteLevel" for step in steps):
        raise ValueError(f"{path}: its BPE has the pre-tokenizer {pre.get('type')}, not ByteLevel: bertjax reads "
                         "byte-level BPE (RoBERTa's, ModernBERT's)")
    return spec


def template_of(spec: dict, path: str) -> templates.Template:
    """The family's template from the post-processor (TemplateProcessing, RobertaProcessing or
    BertProcessing, alone or in a Sequence)."""
    post = spec.get("post_processor") or {}
    found = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    found = [p for p in found if (p or {}).get("type") in _PROCESSORS]
    if not found:
        raise ValueError(f"{path}: its post-processor ({post.get('type')}) adds no [CLS]/[SEP]: bertjax needs a "
                         f"tokenizer.json whose post-processor is one of {', '.join(_PROCESSORS)}")
    post = found[0]
    if post["type"] != "TemplateProcessing":
        cls, sep = int(post["cls"][1]), int(post["sep"][1])
        if post["type"] == "RobertaProcessing":  # every token in segment 0, as RoBERTa's tokenizer gives them
            return templates.Template((cls,), (sep, sep), (sep,), 0)
        return templates.bert_template(cls, sep)
    special = {name: [int(i) for i in entry["ids"]] for name, entry in (post.get("special_tokens") or {}).items()}
    single, pair = _parts(post.get("single"), special, path), _parts(post.get("pair"), special, path)
    if len(single) != 2 or len(pair) != 3 or single[0][0] != pair[0][0] or single[1][0] != pair[2][0]:
        raise ValueError(f"{path}: its TemplateProcessing has other special tokens around a pair's texts than around "
                         "one text's, which bertjax's template (prefix A (middle B) suffix) cannot say")
    (prefix, _), (middle, _), (suffix, second_segment) = pair
    return templates.Template(tuple(prefix), tuple(middle), tuple(suffix), second_segment)


def _parts(items, special: dict, path: str) -> list[tuple[list[int], int]]:
    """A TemplateProcessing template as the special ids before, between and after its sequences, each with
    the segment (type id) of the sequence before it (0 for the first part)."""
    parts, segment = [([], 0)], 0
    for item in items or []:
        if "Sequence" in item:
            segment = int(item["Sequence"].get("type_id", 0))
            parts.append(([], segment))
        else:
            name = item["SpecialToken"]["id"]
            if name not in special:
                raise ValueError(f"{path}: its template names the special token {name!r}, which it does not define")
            parts[-1][0].extend(special[name])
    return parts


def special_roles(spec: dict, template: templates.Template, vocab: list, path: str) -> tuple:
    """The tokens of SPECIAL_ROLES: cls and sep from the template, the others among the special added
    tokens by name (<pad>, [PAD], ...)."""
    specials = [t["content"] for t in spec.get("added_tokens") or [] if t.get("special")]
    if not template.prefix or not template.suffix:
        raise ValueError(f"{path}: its post-processor puts no token before or after a text (no [CLS] or [SEP])")
    names = {"cls": vocab[template.prefix[0]], "sep": vocab[template.suffix[-1]]}
    for role in ("pad", "unk", "mask"):
        named = [t for t in specials if role in t.lower()]
        exact = [t for t in named if t.lower().strip("<>[]") == role]
        if len(named) != 1 and len(exact) != 1:
            raise ValueError(f"{path}: {'no' if not named else 'more than one'} special token names the {role} role "
                             f"(such as <{role}> or [{role.upper()}]); its special tokens are {specials}")
        names[role] = named[0] if len(named) == 1 else exact[0]
    return tuple(names[role] for role in SPECIAL_ROLES)


class BPETokenizer(Tokenizer):
    """Byte-level BPE whose ids equal transformers' AutoTokenizer on the same tokenizer.json.

    Args:
      path: a tokenizer.json (model BPE, pre-tokenizer ByteLevel).
      lower_case: lower-case the text first (str.lower), as sentence-transformers does for a module with
        do_lower_case; the vocabulary itself is cased.
    """

    kind = "bpe"  # its name for load_tokenizer and in checkpoints

    def __init__(self, path: str, lower_case: bool = False):
        path = str(path)
        spec = read_spec(path)
        self.lower_case = bool(lower_case)
        self._masks = hf_tokenizers.Tokenizer.from_str(json.dumps(spec))
        # Ids only: the file's own truncation and padding (sentence-transformers saves them) would cut or pad.
        self._masks.no_truncation()
        self._masks.no_padding()
        self._engine = hf_tokenizers.Tokenizer.from_str(self._masks.to_str())
        self._engine.encode_special_tokens = True  # a written <mask> is text, not the mask token
        size = self._engine.get_vocab_size(with_added_tokens=True)
        self.vocab = [self._engine.id_to_token(i) or "" for i in range(size)]
        token_to_id = {t: i for i, t in enumerate(self.vocab) if t}
        self._template = template_of(spec, path)
        self.special_tokens = special_roles(spec, self._template, self.vocab, path)
        added = {t["id"] for t in spec.get("added_tokens") or [] if t.get("special")}
        self._set_ids(
            token_to_id,
            word_start=np.array([t.startswith(_BYTE_LEVEL_SPACE) for t in self.vocab]),
            never_in_text=np.array([i in added or not t for i, t in enumerate(self.vocab)]),
        )

    @property
    def template(self) -> templates.Template:
        return self._template

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self.lower_case:
            texts = [t.lower() for t in texts]
        return [e.ids for e in self._engine.encode_batch(list(texts), add_special_tokens=False)]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, np.int32) for ids in self.encode(texts)]

    def _tokenize_batch(self, texts: tf.Tensor) -> tf.RaggedTensor:
        def run(batch: np.ndarray):
            # Undecodable bytes become U+FFFD, as the other tokenizers make them.
            rows = self.encode([t.decode("utf-8", errors="replace") for t in batch.reshape(-1)])
            lengths = np.array([len(r) for r in rows], np.int64)
            return np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum())), lengths

        flat, lengths = tf.numpy_function(run, [texts], [tf.int32, tf.int64], stateful=False)
        return tf.RaggedTensor.from_row_lengths(tf.ensure_shape(flat, [None]), tf.ensure_shape(lengths, [None]))

    def encode_with_masks(self, text: str) -> tuple[list[int], list[int]]:
        """The written mask token as the mask id, its neighbours as AutoTokenizer reads them (where the
        tokenizer.json's mask token strips the space before it, that space too)."""
        text = text.lower().replace(self.mask_token.lower(), self.mask_token) if self.lower_case else text
        ids = self._masks.encode(text, add_special_tokens=False).ids
        return ids, [i for i, token in enumerate(ids) if token == self.mask_id]

    def decode(self, ids) -> str:
        """The text the ids stand for (byte-level BPE restores it exactly), special tokens written out."""
        return self._engine.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=False)
