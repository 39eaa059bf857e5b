"""Word segmenters for scripts written without spaces (data.word_segmenter), each an optional package.

`words(name, sentences)` yields the words a segmenter finds, which become masking units
(bertjax/data/units.py). jieba (Chinese): `pip install jieba`, or the `chinese` extra.
"""

from collections.abc import Iterable, Iterator

SEGMENTERS = ("jieba",)


def _jieba():
    try:
        import jieba  # an optional dependency (the chinese extra): only this segmenter needs it
    except ImportError:
        # A ValueError, as for any other setting the programs report in one line.
        raise ValueError("data.word_segmenter='jieba' needs the jieba package: pip install jieba") from None
    jieba.setLogLevel(60)  # its dictionary-loading notice is not the user's concern
    return jieba


def check_installed(name: str) -> None:
    """One line naming what to install when the segmenter's package is missing."""
    _jieba()


def words(name: str, sentences: Iterable[str]) -> Iterator[str]:
    """The words of more than one character the segmenter finds in the sentences (spaces dropped)."""
    jieba = _jieba()
    for sentence in sentences:
        for word in jieba.lcut(sentence):
            word = word.strip()
            if len(word) > 1 and not any(c.isspace() for c in word):
                yield word
