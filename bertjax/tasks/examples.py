"""Plain task examples, as readers return them and featurisation takes them."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Example:
    """A sentence or sentence pair (classification, regression).

    idx:       the example's index in its set: TFDS's `idx` for GLUE (what a submission file names),
               the example's number in a JSON-lines file (from 0, blank lines not counted)
    text:      segment A
    text_pair: segment B, or None for single-sentence tasks
    label:     class index (int), score (float), or None where the set has no labels (test sets)
    """

    idx: int
    text: str
    text_pair: str | None
    label: int | float | None


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    """A multiple-choice example: the context is paired with each choice in turn.

    label: index of the right choice, or None where the set has no labels.
    """

    idx: int
    context: str
    choices: tuple[str, ...]
    label: int | None
