"""What the model is fed, read from the stream training reads: python -m bertjax.preview's run.

The text form starts with a legend, then gives each batch a line saying what its rows hold (packed: how
many rows hold one, two, ... sequences) before its rows, so packing shows from the first lines even
where the first rows hold one sequence each. They often do: BERT's pair algorithm fills nine pairs in
ten up to max_seq_length, so about half of them fill a row alone, and packing fills the other rows
with the short ones (docs/data.md, "Seeing the data"). The jsonl form is one record per example or
packed row, every model input plus the decoded tokens, and nothing else on stdout.

Without a workdir, a vocabulary learned from the corpus is kept in bertjax's cache directory under a
digest of the documents and the tokenizer settings (text/files.cache_dir), so a second preview of the
same corpus reads it instead of learning it again, and nothing is left in /tmp.
"""

import json
import sys
from collections import Counter

from bertjax.data import inputs, objectives, packing
from bertjax.text import files
from bertjax.training.batch_warmup import BatchWarmup, batches_by_step

# Every predicted position, written as one unit. ⟦ is punctuation, which WordPiece always splits into a
# token of its own, so a literal one never looks like a mark.
MARK = "⟦{seen}→{original}⟧"  # a run of consecutive predicted positions: one mark, its tokens spaced


def legend(objective: str, packed: bool) -> str:
    """The notation of the text form, printed once above it."""
    lines = [f"legend: {MARK.format(seen='seen', original='original')} is a position the model predicts: "
             f"{MARK.format(seen='[MASK]', original='x')} masked, {MARK.format(seen='y', original='x')} a random "
             f"token in x's place, {MARK.format(seen='x', original='x')} x left as it was"]
    labels = objectives.get(objective).labels
    if labels is not None:
        lines.append(f"        A: and B: the two segments (segment_ids 0 and 1), then the label: {' / '.join(labels)}")
    if packed:
        lines.append("        [k] the row's k-th sequence (its tokens have sequence_ids k; 0 is padding), with the "
                     "row positions it takes")
    return "\n".join(lines)


def example_record(tokenizer, ex: dict) -> dict:
    """One example (or packed row) as plain lists, with its decoded tokens, for the jsonl form."""
    record = {key: value.tolist() for key, value in ex.items()}
    n = int(sum(record["input_mask"]))
    record["tokens"] = tokenizer.convert_ids_to_tokens(record["input_ids"][:n])
    k = int(sum(record["masked_lm_weights"]))
    record["masked_lm_tokens"] = tokenizer.convert_ids_to_tokens(record["masked_lm_ids"][:k])
    return record


def predicted_runs(record: dict) -> list[list[int]]:
    """The predicted positions in runs of consecutive ones: the units masked together (span, ngram, units
    and whole-word masking; two units side by side read as one run)."""
    runs = []
    for position in record["masked_lm_positions"][:len(record["masked_lm_tokens"])]:
        if runs and position == runs[-1][-1] + 1:
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


def marked_tokens(record: dict) -> list[str]:
    """The record's tokens with every run of predicted positions marked as one unit (MARK)."""
    tokens = list(record["tokens"])
    original = dict(zip(record["masked_lm_positions"], record["masked_lm_tokens"]))
    for run in reversed(predicted_runs(record)):
        seen = " ".join(tokens[p] for p in run)
        tokens[run[0]:run[-1] + 1] = [MARK.format(seen=seen, original=" ".join(original[p] for p in run))]
    return tokens


def masking_line(predicted: int, real: int, runs: list[int], masking: str) -> str:
    """The statistics of the examples shown: the masked share of their tokens, the mean unit length."""
    mean = sum(runs) / len(runs) if runs else 0.0
    return (f"masking ({masking}): {predicted / max(real, 1):.1%} of the real tokens shown are predicted; units "
            f"masked together average {mean:.2f} tokens ({len(runs)} runs of consecutive predicted positions)")


def format_text(tokenizer, ex: dict, number: int, objective: str = "nsp") -> str:
    """One unpacked example: a header, then its segments A and B (objective none: its one segment)."""
    record = example_record(tokenizer, ex)
    tokens = marked_tokens(record)
    n, predicted = len(tokens), len(record["masked_lm_tokens"])
    labels = objectives.get(objective).labels
    if labels is None:  # FULL-SENTENCES: one segment, documents separated by [SEP]
        return f"--- example {number}: {n} tokens, {predicted} to predict\n" + " ".join(tokens)
    segments = record["segment_ids"][:n]
    return "\n".join([
        f"--- example {number}: {n} tokens, {predicted} to predict, {labels[int(record['next_sentence_labels'])]}",
        "A: " + " ".join(t for t, s in zip(tokens, segments) if s == 0),
        "B: " + " ".join(t for t, s in zip(tokens, segments) if s == 1),
    ])


def format_packed_text(tokenizer, row: dict, number: int, objective: str = "nsp") -> str:
    """One packed row: a header, then each sequence with its row positions (tokens marked as format_text's)."""
    record = example_record(tokenizer, row)
    n, s = len(record["tokens"]), len(record["input_ids"])
    count = int(sum(record["sentence_weights"]))
    lines = [f"--- row {number}: {count} sequence{'s' * (count != 1)}, {n} of {s} positions real "
             f"({n / s:.1%}), {len(record['masked_lm_tokens'])} to predict"]
    labels = objectives.get(objective).labels
    for k, example in enumerate(packing.unpack_row(row, pad_id=tokenizer.pad_id)):
        start = int(row["sentence_positions"][k])
        length = int(example["input_mask"].sum())
        text = format_text(tokenizer, example, number, objective).split("\n")[1:]  # without its header
        label = "" if labels is None else ", " + labels[int(example["next_sentence_labels"])]
        lines.append(f"  [{k + 1}] positions {start}-{start + length - 1}{label}")
        lines += ["      " + line for line in text]
    return "\n".join(lines)


def batch_line(batch: dict, step: int, packed: bool, split: str = "train") -> str:
    """What one batch holds: rows by their number of sequences (packed), and the real share."""
    rows, positions = batch["input_mask"].shape
    real = batch["input_mask"].mean()
    step = f"step {step}" if split == "train" else f"held-out batch {step}"
    if not packed:
        return (f"=== {step}: {rows} examples of {positions} positions, {real:.1%} of them real tokens "
                f"(the rest padding; data.packing=True packs them)")
    per_row = Counter(batch["sentence_weights"].sum(1).astype(int).tolist())
    spread = ", ".join(f"{per_row[k]} of {k}" for k in sorted(per_row))
    return (f"=== {step}: {rows} rows of {positions} positions hold {int(batch['sentence_weights'].sum())} "
            f"sequences (rows by sequences held: {spread}); {real:.1%} of the positions are real tokens")


def efficiency_line(real: int, positions: int, stream, rows: int) -> str:
    """The packing efficiency of the rows shown and of the stream's first `rows` rows (from its plans)."""
    return (f"packing: {real / positions:.1%} of the positions shown are real tokens; the stream's first {rows:,} "
            f"rows: {stream.real_token_share(rows):.1%} (data.packing={stream.packing})")


def preview(config, *, num_examples: int, output_format: str = "text", split: str = "train", start_step: int = 0,
            workdir: str | None = None) -> None:
    """Print the first num_examples examples (packed: rows) of the training batches from start_step on,
    or of the held-out stream, as text or as JSON lines."""
    source = config.data.source
    print(f"reading the {source} corpus" + (f" ({config.data.input_pattern})" if config.data.get("input_pattern")
                                            else ""), file=sys.stderr, flush=True)
    data = inputs.build_inputs(config.data, workdir=workdir,
                               vocab_cache=None if workdir else files.cache_dir("vocabularies"))
    if not config.data.vocab_path and source != "prepared":
        print(f"vocabulary: {data.vocab_path} (learned from the corpus on first use and kept there; --workdir=DIR "
              f"or data.vocab_path=FILE names another)", file=sys.stderr, flush=True)
    stream = data.train if split == "train" else data.eval
    text = output_format == "text"
    if text:
        print(legend(stream.objective, stream.packing), end="\n\n")
    # The stream batched as training batches it, so that step N means the examples training sees at step N.
    batch_size = config.train.batch_size
    shown = real = positions = predicted = 0
    runs = []
    warmup = BatchWarmup.from_config(config.train) if split == "train" else None
    for step, (first, batch) in enumerate(batches_by_step(stream, batch_size, warmup, start_step), start_step):
        if shown == num_examples:
            break
        if text:
            print(batch_line(batch, step, stream.packing, split), end="\n\n")
        for i in range(min(len(batch["input_mask"]), num_examples - shown)):
            ex = {key: value[i] for key, value in batch.items()}
            real, positions = real + int(ex["input_mask"].sum()), positions + ex["input_mask"].size
            predicted += int(ex["masked_lm_weights"].sum())
            runs += [len(run) for run in predicted_runs(example_record(data.tokenizer, ex))]
            if text:
                show = format_packed_text if stream.packing else format_text
                print(show(data.tokenizer, ex, first + i, objective=stream.objective), end="\n\n")
            else:
                print(json.dumps(example_record(data.tokenizer, ex)))
            shown += 1
    if positions:
        line = efficiency_line(real, positions, stream, min(stream.rows_per_epoch, 100 * batch_size))
        print(line, file=sys.stdout if text else sys.stderr)
        print(masking_line(predicted, real, runs, stream.spec.grouping), file=sys.stdout if text else sys.stderr)
    sys.stdout.flush()

