"""A demo task's files, written and described: python -m bertjax.demo_task's run. The tasks themselves
are bertjax/tasks/demo_tasks.py's."""

from bertjax.tasks import demo_tasks


def write(task: str, out: str, *, seed: int = 0, length: int = demo_tasks.RECALL_LENGTH,
          train_length: int = demo_tasks.RECALL_TRAIN_LENGTH) -> dict[str, str]:
    """Write the task's splits into `out` and print how many examples each holds, and the labels to fine-tune
    with. -> {split: path}, as demo_tasks.write_task."""
    paths = demo_tasks.write_task(task, out, seed, length, train_length)
    for split, path in paths.items():
        if split == "beir":
            print(f"test set (BEIR layout) from the documents pretraining holds out: {path}")
            continue
        with open(path, encoding="utf-8") as f:
            print(f"{split}: {sum(1 for _ in f)} examples in {path}")
    if task in demo_tasks.LABELS:
        print(f"labels: {demo_tasks.LABELS[task]} (--config.data.labels=\"{demo_tasks.LABELS[task]}\")")
    return paths
