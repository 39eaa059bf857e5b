"""A Hugging Face tokenizer.json of byte-level BPE (RoBERTa's GPT-2 vocabulary, ModernBERT's OLMo one), read
for bertjax.text.tokenizers.BPETokenizer: the file says everything bertjax needs besides the vocabulary,
the special tokens' roles (cls and sep from its post-processor; pad, mask and unk from its special added
tokens by name: <pad> or [PAD]) and the family's template (RoBERTa's <s> A </s></s> B </s>, ModernBERT's
[CLS] A [SEP] B [SEP]).
"""

import json

from bertjax.text import templates
from bertjax.text.templates import SPECIAL_ROLES

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
