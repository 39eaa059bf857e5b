"""Fine-tuning data: the task table, readers (TFDS, JSON lines), features, batches, submission files."""
