"""bertjax.data.demo: the built-in demo corpus."""

import re

from bertjax.data import demo
from bertjax.data.demo import demo_documents

# --------------------------------------------------------------------------------------------------
# Demo corpus
# --------------------------------------------------------------------------------------------------


def test_demo_corpus_is_deterministic_real_prose():
    documents = demo_documents()
    assert documents == demo_documents()
    assert demo_documents(max_documents=3) == documents[:3]

    sentences = [s for d in documents for s in d]
    characters = sum(map(len, sentences))
    assert len(documents) > 500 and len(sentences) > 10_000 and characters > 1_000_000
    assert all(d and all(s and s == " ".join(s.split()) for s in d) for d in documents)
    words = sum(len(s.split()) for s in sentences)
    assert words / len(sentences) > 8
    letters = sum(c.isalpha() for s in sentences for c in s)
    assert letters / characters > 0.7
    leftovers = re.compile(r">>>|``|:\w+:`|\*\*\w[^*]*\w\*\*")  # doctest prompts, reST markup
    assert not [s for s in sentences if leftovers.search(s)]

    documents[0].append("Mutating a returned list must not change the cached corpus.")
    assert demo_documents()[0] == documents[0][:-1]


# A docstring with everything the demo corpus must drop or unwrap.
DOCSTRING = """Return the :func:`~os.path.join` of *a* and ``b``, see :pep:`8` [1].

This is the second paragraph. It has **two** sentences
that are hard-wrapped.

Example::

    x = join(a, b)

>>> join("a", "b")
'a/b'

Args:
    a: the first part.
    b: the second part.

1. A list item that
   continues on an indented line.

join(a, b) -> str

Heading
=======

   An indented paragraph that reads as prose.

   if x:
       return y
"""


def test_demo_cleaning_keeps_only_prose():
    assert demo._prose_sentences(DOCSTRING) == [
        "Return the join of a and b, see PEP 8.",
        "This is the second paragraph.",
        "It has two sentences that are hard-wrapped.",
        "A list item that continues on an indented line.",
        "An indented paragraph that reads as prose.",
    ]


