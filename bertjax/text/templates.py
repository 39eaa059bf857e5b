"""Where a tokenizer's special tokens go around one text or a pair (the family's own template).

    BERT     [CLS] A [SEP]          [CLS] A [SEP] B [SEP]          B in segment 1
    RoBERTa  <s> A </s>             <s> A </s></s> B </s>          every token in segment 0

Free of TensorFlow, so that the task features and the embedders (which import none) build rows with it.
"""

import dataclasses

import numpy as np

# The roles of a tokenizer's special tokens, in the order its special_tokens lists them.
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")


@dataclasses.dataclass(frozen=True)
class Template:
    """prefix A suffix for one text; prefix A middle B suffix for a pair, with prefix, A and middle in
    segment 0 and B and suffix in `second_segment`."""

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    second_segment: int = 1

    def added(self, pair: bool = False) -> int:
        """How many special tokens the template adds to one text (pair=False) or a pair."""
        return len(self.prefix) + len(self.suffix) + (len(self.middle) if pair else 0)

    def single(self, ids) -> list[int]:
        return [*self.prefix, *(int(i) for i in ids), *self.suffix]

    def pair(self, ids_a, ids_b) -> tuple[np.ndarray, np.ndarray]:
        """The ids of prefix A middle B suffix and their segment ids, int32 [n] each."""
        first = [*self.prefix, *(int(i) for i in ids_a), *self.middle]
        second = [*(int(i) for i in ids_b), *self.suffix]
        segments = np.concatenate([np.zeros(len(first), np.int32), np.full(len(second), self.second_segment, np.int32)])
        return np.array(first + second, np.int32), segments


def bert_template(cls_id: int, sep_id: int) -> Template:
    """[CLS] A [SEP] (B [SEP]), B in segment 1: BERT's, ALBERT's and bertjax's own vocabularies'."""
    return Template((cls_id,), (sep_id,), (sep_id,), 1)
