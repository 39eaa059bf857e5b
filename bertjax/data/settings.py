"""The config's data section read once into a typed record: `DataSettings.from_config(config.data)`.

Every key of configs/common.py's data section is a field here, with its type, its check and the default
common.py gives it (tests/test_configs.py holds the two equal), so the data package reads settings that
cannot disagree with the configs and never falls back on a default of its own. Checks run once, here:
choices by name (a source, a text format, an objective, a tokenizer, a sentence splitter), whole
numbers, rates; a bad value is one line naming the key. Older keys the configs still accept are
resolved here too (data.masked_lm_prob, where a config sets it, wins over data.mask_rate).

No TensorFlow here: the synthetic path reads these settings too.
"""

import dataclasses
import numbers
from collections.abc import Callable, Mapping

import numpy as np

from bertjax.data import backends, objectives
from bertjax.data.backends import text_files
from bertjax.text import files, word_segmentation
from bertjax.text.sentences import SPLITTERS

# data.masking: which positions are masked together (bertjax/data/masking.py's GROUPINGS).
MASKINGS = ("token", "whole_word", "span", "ngram", "units")
# data.word_segmenter, for data.masking="units" in scripts written without spaces (an optional package).
SEGMENTERS = ("none",) + word_segmentation.SEGMENTERS

# Keys configs written before a rename still set, and the field each stands for (it wins over it).
OLDER_KEYS = {"masked_lm_prob": "mask_rate"}


# ---------------------------------------------------------------------------------------------------
# Checks: (what to call the key in a message, value) -> the value, or one line saying what to set
# ---------------------------------------------------------------------------------------------------


def _string(name: str, value):
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: set a string")
    return value


def _optional_string(name: str, value):
    return None if value is None else _string(name, value)


def _one_of(choices: tuple[str, ...]) -> Callable:
    def check(name: str, value):
        if value not in choices:
            raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")
        return value

    return check


def _optional_one_of(choices: tuple[str, ...]) -> Callable:
    def check(name: str, value):
        return None if value is None else _one_of(choices)(name, value)

    return check


def _whole(minimum: int, why: str = "") -> Callable:
    def check(name: str, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            raise ValueError(f"{name}={value!r}: set a whole number of at least {minimum}{f' ({why})' if why else ''}")
        return int(value)

    return check


def _flag(name: str, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r}: set True or False")
    return bool(value)


def _rate(*, open_interval: bool = False, optional: bool = False, why: str = "") -> Callable:
    """A share: a number in [0, 1], or in (0, 1) where neither end makes sense (a mask rate)."""
    def check(name: str, value):
        if optional and value is None:
            return None
        number = not isinstance(value, bool) and isinstance(value, numbers.Real)
        inside = number and (0 < value < 1 if open_interval else 0 <= value <= 1)
        if not inside:
            interval = "(0, 1)" if open_interval else "[0, 1]"
            raise ValueError(f"{name}={value!r} must lie in {interval}{f' ({why})' if why else ''}")
        return float(value)

    return check


def _schedule(name: str, value):
    """A mask-rate schedule: ((start_step, rate), ...), the first phase at step 0, starts increasing."""
    example = "e.g. ((0, 0.3), (10000, 0.15), (20000, 0.05))"
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name}={value!r}: give a tuple of (start_step, rate) pairs, {example}, or () for "
                         f"the constant data.mask_rate")
    phases = []
    for k, phase in enumerate(value):
        if not isinstance(phase, (tuple, list)) or len(phase) != 2:
            raise ValueError(f"{name}[{k}]={phase!r}: give a (start_step, rate) pair, {example}")
        start = _whole(0)(f"{name}[{k}] start_step", phase[0])
        rate = _rate(open_interval=True)(f"{name}[{k}] rate", phase[1])
        phases.append((start, rate))
    if phases and phases[0][0] != 0:
        raise ValueError(f"{name}: the first phase must start at step 0 (it starts at {phases[0][0]}), {example}")
    if any(b[0] <= a[0] for a, b in zip(phases, phases[1:])):
        raise ValueError(f"{name}={value!r}: the start steps must increase, {example}")
    return tuple(phases)


def _setting(default, check: Callable):
    """A field of DataSettings: its default (configs/common.py's) and its check."""
    return dataclasses.field(default=default, metadata={"check": check})


# ---------------------------------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MixtureSource:
    """One entry of data.mixture: the data section as this source sees it (the entry's keys over the
    section's, no mixture of its own), and its relative weight."""

    settings: "DataSettings"
    weight: float


def _sources(name: str, value):
    if not isinstance(value, tuple) or not all(isinstance(entry, MixtureSource) for entry in value):
        raise ValueError(f"{name}={value!r}: give MixtureSource records (DataSettings.from_config makes them from "
                         f"a config's dicts)")
    return value


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """configs/common.py's data section, typed; the comments there say what each key means. Every field is
    checked when the record is made, however it is made."""

    source: str = _setting("demo", _one_of(tuple(backends.BACKENDS)))
    input_pattern: str | None = _setting(None, _optional_string)
    text_format: str = _setting("sentences", _one_of(text_files.TEXT_FORMATS))
    text_field: str = _setting("text", _string)
    sentence_splitter: str = _setting("default", _one_of(SPLITTERS))
    tfds_name: str | None = _setting(None, _optional_string)
    tfds_split: str = _setting("train", _string)
    tfds_text_feature: str = _setting("text", _string)
    tfds_data_dir: str | None = _setting(None, _optional_string)
    text_column: str = _setting("text", _string)
    sentences_column: str | None = _setting(None, _optional_string)
    hf_dataset_path: str | None = _setting(None, _optional_string)
    hf_dataset_name: str | None = _setting(None, _optional_string)
    hf_dataset_split: str = _setting("train", _string)
    mixture: tuple[MixtureSource, ...] = _setting((), _sources)
    mixture_block_size: int = _setting(100, _whole(1))
    prepared_dir: str | None = _setting(None, _optional_string)
    eval_fraction: float = _setting(0.01, _rate())
    tokenizer: str = _setting("wordpiece", _one_of(tuple(files.VOCAB_FILES)))
    vocab_path: str | None = _setting(None, _optional_string)
    vocab_size: int = _setting(30522, _whole(1))
    lower_case: bool = _setting(True, _flag)
    max_seq_length: int = _setting(128, _whole(1))
    max_predictions_per_seq: int = _setting(20, _whole(1, "20 at seq 128, 80 at seq 512"))
    objective: str = _setting("nsp", _one_of(tuple(objectives.OBJECTIVES)))
    mask_rate: float = _setting(0.15, _rate(open_interval=True, why="BERT 0.15, ModernBERT 0.3"))
    eval_mask_rate: float | None = _setting(None, _rate(open_interval=True, optional=True, why="unset: mask_rate"))
    mask_token_fraction: float = _setting(0.8, _rate(why="BERT 0.8"))
    random_token_fraction: float = _setting(0.1, _rate(why="BERT 0.1"))
    short_seq_prob: float = _setting(0.1, _rate())
    whole_word_masking: bool = _setting(False, _flag)
    masking: str = _setting("token", _one_of(MASKINGS))
    eval_masking: str | None = _setting(None, _optional_one_of(MASKINGS))
    mask_rate_schedule: tuple = _setting((), _schedule)
    span_p: float = _setting(0.2, _rate(open_interval=True, why="SpanBERT 0.2: mean span 3.8 words at 10 words"))
    span_max_words: int = _setting(10, _whole(1, "SpanBERT 10"))
    ngram_max_n: int = _setting(3, _whole(1, "ALBERT 3"))
    units_lexicon: str | None = _setting(None, _optional_string)
    word_segmenter: str = _setting("none", _one_of(SEGMENTERS))
    packing: bool = _setting(True, _flag)
    max_sequences_per_row: int = _setting(8, _whole(1, "sequences sharing a packed row; 8 at seq 128, 16 at seq 512"))
    packing_window: int = _setting(1000, _whole(1, "examples the packer sees at once; 1000 packs the demo corpus "
                                                   "to 99% real tokens at seq 128"))
    seed: int = _setting(0, _whole(0))

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = field.metadata["check"](f"data.{field.name}", getattr(self, field.name))
            object.__setattr__(self, field.name, value)  # frozen: the checked value, as plain Python, set this way
        m, r = self.mask_token_fraction, self.random_token_fraction
        if m + r > 1.0:
            raise ValueError(f"data.mask_token_fraction={m} and data.random_token_fraction={r} must be >= 0 and add "
                             f"up to at most 1 (BERT: 0.8 and 0.1)")
        if self.whole_word_masking:  # the older key: the same as masking="whole_word"
            if self.masking not in ("token", "whole_word"):
                raise ValueError(f"data.whole_word_masking=True and data.masking={self.masking!r} disagree: set "
                                 f"data.masking alone (whole_word_masking=True is masking='whole_word')")
            object.__setattr__(self, "masking", "whole_word")
        if "units" in (self.masking, self.eval_masking) and not self.units_lexicon and self.word_segmenter == "none":
            raise ValueError("data.masking='units' needs its units: set data.units_lexicon=FILE (one unit a line) "
                             "and/or data.word_segmenter='jieba'")
        if self.mixture and self.mask_rate_schedule:
            raise ValueError("data.mask_rate_schedule with data.mixture is not supported yet: set a constant "
                             "data.mask_rate, or train on one source")

    def train_mask_rate(self, step: int) -> float:
        """The training rate at a step: data.mask_rate_schedule's phase, else data.mask_rate."""
        rates = [rate for start, rate in self.mask_rate_schedule if start <= step]
        return rates[-1] if rates else self.mask_rate

    @property
    def held_out_masking(self) -> str:
        """The held-out batches' strategy: data.eval_masking, or the training one when it is unset."""
        return self.masking if self.eval_masking is None else self.eval_masking

    @property
    def held_out_mask_rate(self) -> float:
        """The held-out batches' mask rate: data.eval_mask_rate, or the training rate when it is unset."""
        return self.mask_rate if self.eval_mask_rate is None else self.eval_mask_rate

    @classmethod
    def from_config(cls, data) -> "DataSettings":
        """The record of a data section (an ml_collections ConfigDict, or any mapping of its keys). A key the
        section does not set takes configs/common.py's default; a key it has no field for is an error, but
        for OLDER_KEYS; data.mixture's dicts become MixtureSource records."""
        values = _plain(data)
        unknown = sorted(set(values) - set(FIELDS) - set(OLDER_KEYS))
        if unknown:
            raise ValueError(f"data.{unknown[0]} is not a key of the data section (configs/common.py): remove it or "
                             f"correct its spelling")
        for old, new in OLDER_KEYS.items():
            if (value := values.pop(old, None)) is not None:
                values[new] = FIELDS[new].metadata["check"](f"data.{old}", value)
        entries = values.pop("mixture", None) or ()
        settings = cls(**values)
        return dataclasses.replace(settings, mixture=_mixture(settings, entries)) if entries else settings


FIELDS: dict[str, dataclasses.Field] = {field.name: field for field in dataclasses.fields(DataSettings)}
# What a data.mixture entry may set besides its weight: where and how its documents are read. The recipe
# (tokenizer, lengths, masking, objective, packing, seed, held-out share) is the section's, shared by
# all sources: their elements are interleaved into the same batches.
MIXTURE_KEYS = ("source",) + tuple(key for key in FIELDS if any(
    key in backends.BACKENDS[name].keys for name in backends.DOCUMENT_SOURCES))


def _plain(data) -> dict:
    """The section's keys and values as a dict (a ConfigDict's references resolved)."""
    if hasattr(data, "copy_and_resolve_references"):
        data = data.copy_and_resolve_references()
    if not isinstance(data, Mapping) and not hasattr(data, "keys"):
        raise ValueError(f"the data section is a {type(data).__name__}: give a ConfigDict or a dict of its keys")
    return {key: data[key] for key in data.keys()}


def _mixture(settings: DataSettings, entries) -> tuple[MixtureSource, ...]:
    """data.mixture's entries, each a dict with `source`, `weight` and any of MIXTURE_KEYS, as records."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"data.mixture={entries!r}: give a tuple of dicts, each with source= and weight=")
    return tuple(_mixture_source(settings, k, entry) for k, entry in enumerate(entries))


def _mixture_source(settings: DataSettings, k: int, entry) -> MixtureSource:
    entry = dict(entry) if hasattr(entry, "keys") else entry
    if not isinstance(entry, dict):
        raise ValueError(f"data.mixture[{k}]={entry!r}: give a dict with source and weight, e.g. "
                         f"{{'source': 'text', 'input_pattern': 'books/*.txt', 'weight': 0.2}}")
    if "source" not in entry or "weight" not in entry:
        raise ValueError(f"data.mixture[{k}]={entry!r} needs both source= and weight=")
    if entry["source"] not in backends.DOCUMENT_SOURCES:
        raise ValueError(f"data.mixture[{k}] source={entry['source']!r}: choose one of "
                         f"{', '.join(backends.DOCUMENT_SOURCES)}")
    weight = entry.pop("weight")
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not 0 < weight < float("inf"):
        raise ValueError(f"data.mixture[{k}] weight={weight!r}: set a number above 0 (weights are relative: "
                         f"0.8 and 0.2, or 4 and 1)")
    unknown = sorted(set(entry) - set(MIXTURE_KEYS))
    if unknown:
        shared = [key for key in unknown if key in FIELDS or key in OLDER_KEYS]
        why = (f"{', '.join(shared)} belong{'s' * (len(shared) == 1)} to the recipe the sources share: set "
               f"them in data" if shared else f"it may set {', '.join(MIXTURE_KEYS)}")
        raise ValueError(f"data.mixture[{k}] sets {', '.join(unknown)}: {why}")
    keys = {key: FIELDS[key].metadata["check"](f"data.mixture[{k}] {key}", value) for key, value in entry.items()}
    return MixtureSource(dataclasses.replace(settings, mixture=(), **keys), float(weight))
