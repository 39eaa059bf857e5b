"""Word segmenters for scripts written without spaces (data.word_segmenter), behind one table.

Each is an optional package: `words(sentences)` yields the words it finds, which become masking units
(bertjax/data/units.py). jieba (Chinese): `pip install jieba`, or the `chinese` extra.
"""

import importlib.util
from collections.abc import Iterable, Iterator

# name -> the package it needs
SEGMENTERS = {"jieba": "jieba"}


def check_installed(name: str) -> None:
    """One line naming what to install when the segmenter's package is missing."""
    package = SEGMENTERS[name]
    if importlib.util.find_spec(package) is None:
        raise ValueError(f"data.word_segmenter={name!r} needs the {package} package: pip install {package}")


def words(name: str, sentences: Iterable[str]) -> Iterator[str]:
    """The words of more than one character the segmenter finds in the sentences (spaces dropped)."""
    check_installed(name)
    import jieba  # optional: imported only when asked for

    jieba.setLogLevel(60)  # its dictionary-loading notice is not the user's concern
    for sentence in sentences:
        for word in jieba.lcut(sentence):
            word = word.strip()
            if len(word) > 1 and not any(c.isspace() for c in word):
                yield word
