"""Fine-tuning tasks: registry, readers, features, batches, scoring and metrics, one file per task kind."""
