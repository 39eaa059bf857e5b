"""BiLSTM-soft against BERT: the forward's latency of the BiLSTM student (bertjax/models/bilstm.py, Tang et al.
2019) beside BERT sequence classifiers; what `python -m bertjax.benchmark --student_speed=tiny,base` runs.

Every model is randomly initialised over BERT's vocabulary (30,522) with 2 labels: a BERT classifier
(models/heads.py's classification network) of each size asked for, and the student at the distill section's
default shape (configs/finetune/common.py: embeddings 300, 150 units each way, MLP 200), in its sentence form
and its pair form (which reads each row's two segments as two sentences: twice the rows). All read the same
random rows of S tokens, every token real, the first half segment 0 and the second segment 1 (a pair). Timed as
the compression report times (runs/compression_report.latencies_ms): the jitted forward, logits to the host,
after untimed warmup calls (the compile among them), then the median of `repeats` calls, the models taking
turns, one call each per round, so that a change in a shared machine's load falls on all of them alike.
Printed: one table, each BERT row with the speed-ups of both student forms over it (its ms / theirs, the
figures of this one run).
"""

import dataclasses
import os

import flax.linen as nn
import jax
import numpy as np

from bertjax.bench.timing import load_average, print_table
from bertjax.models import bilstm, heads
from bertjax.models.config import SIZES, BertConfig
from bertjax.runs import compression_report

VOCAB_SIZE = 30_522  # BERT's uncased WordPiece vocabulary: the student reads the teacher's ids
NUM_LABELS = 2
SEQ_LENGTH = 128
BATCH_SIZES = (1, 32)
REPEATS = 20
WARMUP = 2  # untimed calls per model and batch size; the first compiles
STUDENTS = {"BiLSTM-soft": False, "BiLSTM-soft pairs": True}  # row name -> BiLSTMConfig.pairs


@dataclasses.dataclass
class Model:
    """One row: a flax classifier and its params, with task_logits as bertjax.load's models have it (what
    compression_report.latencies_ms calls): the jitted forward, logits to the host."""

    name: str
    network: nn.Module
    params: dict

    def __post_init__(self):
        self._logits = jax.jit(lambda params, ids, segments, mask: self.network.apply(
            {"params": params}, ids, segments, mask, deterministic=True))

    def task_logits(self, features: dict, batch_size: int = 32) -> np.ndarray:
        del batch_size  # one call on the whole batch
        return np.asarray(self._logits(self.params, features["input_ids"], features["segment_ids"],
                                       features["input_mask"]), np.float32)

    @property
    def parameters(self) -> int:
        return sum(int(np.size(x)) for x in jax.tree.leaves(self.params))


def make_model(name: str, network: nn.Module, seq_length: int, seed: int = 0) -> Model:
    """The network with random params of its own shapes: every value drawn from N(0, 0.02^2) by numpy, which
    the forward's speed does not depend on. (Its initialisers, jitted, compile for several seconds a model.)"""
    dummy = heads.dummy_inputs("classification", seq_len=seq_length)
    shapes = nn.meta.unbox(jax.eval_shape(lambda: network.init(jax.random.key(0), **dummy, deterministic=True)))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: 0.02 * rng.standard_normal(x.shape, np.float32), shapes["params"])
    return Model(name, network, jax.device_put(params))


def token_rows(batch_size: int, seq_length: int, seed: int = 0) -> dict:
    """[B, S] random ids past the special tokens, every token real; segment 0 then 1 (a pair, for both forms)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, VOCAB_SIZE, (batch_size, seq_length), dtype=np.int32)
    segments = np.broadcast_to((np.arange(seq_length) >= seq_length // 2).astype(np.int32), ids.shape)
    return {"input_ids": ids, "segment_ids": np.ascontiguousarray(segments), "input_mask": np.ones_like(ids)}


def benchmark(sizes=("base",), seq_length: int = SEQ_LENGTH, repeats: int = REPEATS, warmup: int = WARMUP,
              batch_sizes=BATCH_SIZES) -> list[dict]:
    """Times the BERT classifiers of `sizes` and both student forms taking turns; prints the table and returns
    its rows: {"model", "parameters", "ms": {batch: median ms}, "speed_up": {(student, batch): BERT / student}}."""
    unknown = [s for s in sizes if s not in SIZES]
    if not sizes or unknown or seq_length < 2 or repeats < 1 or warmup < 1:
        raise ValueError(f"student speed: sizes {list(sizes)}, sequence length {seq_length}, {repeats} repeats, "
                         f"{warmup} warmup calls: give sizes of {list(SIZES)}, a length of at least 2, at least one "
                         f"repeat and one warmup call (the compile)")
    models = [make_model(f"BERT-{size}", heads.network("classification", BertConfig.from_size(
        size, vocab_size=VOCAB_SIZE), NUM_LABELS), seq_length) for size in sizes]
    models += [make_model(name, bilstm.BiLSTMClassifier(bilstm.BiLSTMConfig(VOCAB_SIZE, NUM_LABELS, pairs=pairs)),
                          seq_length) for name, pairs in STUDENTS.items()]
    print(f"BiLSTM-soft against BERT: forward to host logits at sequence length {seq_length}, median of {repeats} "
          f"calls after {warmup} (models taking turns); backend {jax.default_backend()}, {os.cpu_count()} CPUs, "
          f"load {load_average()}", flush=True)
    rows = token_rows(max(batch_sizes), seq_length)  # every model reads the same rows; batch b: the first b
    ms = {b: compression_report.latencies_ms(models, [{k: v[:b] for k, v in rows.items()}] * len(models),
                                             repeats=repeats, warmup=warmup) for b in batch_sizes}
    results = [dict(model=m.name, parameters=m.parameters, ms={b: ms[b][i] for b in batch_sizes}, speed_up={})
               for i, m in enumerate(models)]
    students = results[len(sizes):]
    for row in results[:len(sizes)]:
        row["speed_up"] = {(s["model"], b): row["ms"][b] / s["ms"][b] for s in students for b in batch_sizes}
    header = ["model", "parameters"] + [f"batch {b} ms" for b in batch_sizes]
    header += [f"{s['model']} speed-up {b}" for s in students for b in batch_sizes]
    print_table(header, [[r["model"], f"{r['parameters']:,}"] + [f"{r['ms'][b]:.2f}" for b in batch_sizes] +
                         [f"{r['speed_up'][s['model'], b]:.2f}x" if r["speed_up"] else "-"
                          for s in students for b in batch_sizes] for r in results])
    print(f"speed-up: the BERT row's ms / the student's, at each batch size (load now {load_average()})", flush=True)
    return results
