"""Sentence splitting: prose -> sentences, the unit next-sentence prediction pairs are made of.

Two splitters, chosen by name (config key data.sentence_splitter):
  - "default": a rule-based splitter for English encyclopedic prose, predictable and fast enough to
    run on the fly (its rules are in the comments below).
  - "multilingual": the optional `blingfire` package's sentence breaker, which knows many scripts,
    plus a split at the terminators it can leave inside a sentence: 。！？ and the danda ।.
"""

import re
from typing import Callable

SPLITTERS = ("default", "multilingual")

# A sentence ends at . ! ? (or an ellipsis), optionally followed by closing quotes or brackets, when
# whitespace and a plausible sentence start (capital letter, digit, opening quote or bracket) come
# next. A lower-case continuation never starts a sentence, which alone handles "e.g. the",
# "... and", "vs. lower". Decimals, versions, URLs and e-mail addresses have no space after their
# dots, so they are never candidates. What remains is the period after an abbreviation or an
# initial; the three word lists below decide those.

# Titles, honorifics and Latin/reference words: they always qualify what follows ("Dr. Watson",
# "St. Louis", "cf. Smith", "Roe v. Wade"), so a period after them never ends a sentence.
_ALWAYS_CONTINUE = frozenset(
    """
    mr mrs ms messrs mme mlle dr prof rev hon gen col lt maj capt cmdr adm sgt cpl gov sen rep pres
    supt fr st mt ft e.g i.e cf vs v viz al ibid approx
    """.split()
)
# Words abbreviated before a number ("No. 5", "Fig. 3", "pp. 12", "c. 1500", "Sept. 11"). Before a
# digit the sentence goes on; otherwise the period is an ordinary one ("The answer was no. Then").
_NUMBER_PREFIXES = frozenset(
    """
    no nos vol vols fig figs p pp ch chap sec sect art eq eqs op nr c ca est
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)
# Abbreviations that end sentences as often as not ("... for Apple Inc. The company ...", "U.S."),
# and initials ("Malcolm X. He"). After them a period ends a sentence only when the next word is one
# that typically opens a sentence (below): "Apple Inc. The company" splits, "Apple Inc. CEO Tim Cook",
# "J. R. R. Tolkien" and "U.S. President" do not.
_MAY_END = frozenset("etc inc ltd co corp jr sr bros llc plc dept univ assn esp ph.d".split())
_INITIALISM = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # "U.S", "a.m" (the final period excluded)
_SENTENCE_OPENERS = frozenset(
    """
    The A An This That These Those There Here It Its He She They We I You His Her Their Our My
    In On At By For From To With As After Before During Since Until When While Where Although
    Though However But And Or So Yet Thus Therefore Also Then Later Today Some Many Most Several
    Each Both One Two Such Other Another Despite Following According Unlike If Because Between
    Among Under Over Once Only
    """.split()
)

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# Terminator run, then closing quotes/brackets, then the single space of normalized text.
_CANDIDATE = re.compile(r"([.!?\u2026]+)[\"'\u201d\u2019\u00bb)\]]* ")
_OPENING = "\"'\u201c\u2018\u00ab([\u00bf\u00a1"


def split_sentences(text: str) -> list[str]:
    """Splits prose into sentences; blank lines are paragraph breaks, single line breaks are spaces.

    Single line breaks are joined because text files are often hard-wrapped (one paragraph spread
    over many 72-column lines). Whitespace runs inside a sentence become one space.
    """
    sentences = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        if paragraph:
            sentences.extend(_split_paragraph(paragraph))
    return sentences


def _split_paragraph(paragraph: str) -> list[str]:
    """Sentences of one paragraph whose whitespace is already single spaces."""
    sentences, start = [], 0
    for match in _CANDIDATE.finditer(paragraph):
        if _ends_sentence(paragraph, match):
            sentences.append(paragraph[start : match.end() - 1])
            start = match.end()
    sentences.append(paragraph[start:])
    return [s for s in sentences if s]


def _ends_sentence(paragraph: str, match: re.Match) -> bool:
    """Whether the candidate terminator `match` (followed by a space) ends a sentence."""
    following = paragraph[match.end()]
    if not (following.isupper() or following.isdigit() or following in _OPENING):
        return False
    terminator = match.group(1)
    if terminator != ".":  # "?", "!", "?!", "...", "…" before a sentence start
        return True
    word_start = paragraph.rfind(" ", 0, match.start()) + 1
    word = paragraph[word_start : match.start()].lstrip(_OPENING)
    key = word.lower()
    if key in _ALWAYS_CONTINUE:
        return False
    if key in _NUMBER_PREFIXES and following.isdigit():
        return False
    if key in _MAY_END or _is_initial(word):
        return _next_word(paragraph, match.end()) in _SENTENCE_OPENERS
    return True


def _is_initial(word: str) -> bool:
    """An initial ("J" of "J. R. R. Tolkien") or initialism ("U.S"), without its final period.

    "I" does not count: it is far more often the pronoun ending a sentence ("So did I. Nobody").
    """
    return (len(word) == 1 and word.isupper() and word != "I") or bool(_INITIALISM.fullmatch(word))


def _next_word(paragraph: str, start: int) -> str:
    """The word starting at `start`, without opening quotes/brackets or trailing punctuation."""
    end = paragraph.find(" ", start)
    word = paragraph[start : end if end >= 0 else len(paragraph)]
    return word.lstrip(_OPENING).rstrip(".,;:!?\"'\u201d\u2019)]")


# --------------------------------------------------------------------------------------------------
# Multilingual
# --------------------------------------------------------------------------------------------------

# Terminators of scripts that need no space after a sentence: full-width (Chinese, Japanese) and
# half-width ideographic stops, and the Devanagari danda and double danda (Hindi, Marathi, Nepali).
_SCRIPT_END = re.compile(r"[\u3002\uff01\uff1f\uff61\u0964\u0965]+"
                         r"[\"'\u201d\u2019\u00bb)\]\u300d\u300f\uff09\u3011\u300b]* ?")
# Closing quotes and brackets: a piece that starts with them continues the previous sentence. Straight
# quotes are left out: they open sentences as often as they close them.
_CLOSING = "\u201d\u2019\u00bb)]\u300d\u300f\uff09\u3011\u300b"


def split_sentences_multilingual(text: str) -> list[str]:
    """Like split_sentences, in any script: blingfire's sentence breaker, then the terminators
    。！？ and । wherever blingfire left them inside a sentence. Needs the blingfire package."""
    text_to_sentences = _blingfire()
    sentences = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        if not paragraph:
            continue
        first = len(sentences)
        for piece in text_to_sentences(paragraph).split("\n"):
            for sentence in _split_at_script_ends(piece):
                # blingfire starts the next sentence with the quote closing this one: 。” -> 。\n”
                closing = len(sentence) - len(sentence.lstrip(_CLOSING))
                if closing and len(sentences) > first:
                    sentences[-1] += sentence[:closing]
                    sentence = sentence[closing:].lstrip()
                if sentence:
                    sentences.append(sentence)
    return sentences


def _split_at_script_ends(piece: str) -> list[str]:
    pieces, start = [], 0
    for match in _SCRIPT_END.finditer(piece):
        if match.end() < len(piece):
            pieces.append(piece[start : match.end()].rstrip())
            start = match.end()
    pieces.append(piece[start:].strip())
    return [p for p in pieces if p]


def _blingfire():
    try:
        import blingfire  # an optional dependency (the multilingual extra): only this splitter needs it
    except ImportError:
        # A ValueError, as for any other setting the programs report in one line.
        raise ValueError(
            "data.sentence_splitter='multilingual' needs the blingfire package: pip install blingfire"
        ) from None
    return blingfire.text_to_sentences


def get_splitter(name: str) -> Callable[[str], list[str]]:
    """The splitter called `name` (one of SPLITTERS). A missing package or an unknown name is an
    error now, before any text is read."""
    if name == "default":
        return split_sentences
    if name == "multilingual":
        _blingfire()
        return split_sentences_multilingual
    raise ValueError(f"data.sentence_splitter={name!r} is not one of {', '.join(map(repr, SPLITTERS))}")
