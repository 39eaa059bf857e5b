"""A corpus tokenized and indexed once, into memory-mappable shards: python -m bertjax.prepare's run. The
work is bertjax/data/preparing.py's; this reads the config's data section and says what was written."""

from bertjax.data import preparing
from bertjax.data.settings import DataSettings


def prepare(config, output_dir: str, *, num_shards: int, num_workers: int, process_index: int = 0,
            process_count: int = 1, progress_seconds: float = 5.0) -> dict:
    """Prepare this host's shards of config.data's corpus into output_dir and print what they hold.
    -> preparing.run's totals."""
    try:
        summary = preparing.run(DataSettings.from_config(config.data), output_dir, num_shards=num_shards,
                                num_workers=num_workers, process_index=process_index, process_count=process_count,
                                progress_seconds=progress_seconds)
    except (ValueError, OSError) as e:  # pyarrow's and TFDS's run to several lines: the first says it
        raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    for split in ("train", "eval"):
        documents, sentence_count, tokens = summary[split]
        print(f"{split}: {documents} documents, {sentence_count} sentences, {tokens} tokens in {summary['shards']} "
              f"shards")
    if summary["bad_rows"].count:
        print(summary["bad_rows"].summary())
    if summary["skipped"]:
        print(f"{summary['skipped']} of {summary['shards']} shards were complete already and kept")
    megabytes, workers = summary["bytes"] / 1e6, summary["worker_seconds"]
    print(f"prepared {output_dir} in {summary['seconds']:.1f}s: {megabytes:.1f} MB of raw text, "
          f"{megabytes / workers if workers else 0:.2f} MB/s per worker process")
    return summary
