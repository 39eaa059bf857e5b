"""A 2-layer student of a 4-layer, hidden-128 teacher on the built-in demo corpus, in minutes on a CPU.

  python -m bertjax.train --config=configs/tiny.py --config.model.num_layers=4 --workdir=/tmp/teacher4
  python -m bertjax.distill --config=configs/distill/tiny.py --config.distill.teacher=/tmp/teacher4 \
      --workdir=/tmp/student2

The student starts from the teacher's first and last layers (0, 3), with its embeddings and heads, and
learns from its masked-LM distribution and hidden states on the demo corpus, read with the teacher's
vocabulary. README's "Compression" section has the measured results (held-out masked LM, fine-tuned dev
accuracy against the teacher and an undistilled student, inference speed).
"""

from configs.distill import common


def get_config():
    config = common.distill_config()
    config.distill.student_layers = (0, 3)
    # The teacher's shape (configs/tiny.py with 4 layers): written out for the reader, read from the teacher.
    config.model.update(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, vocab_size=8192)
    config.data.update(vocab_size=8192, eval_fraction=0.05)  # configs/tiny.py's held-out documents
    # A short run takes a higher learning rate than DistilBERT's and a short warmup.
    config.optimizer.learning_rate = 1e-3
    config.schedule.warmup_steps = 30
    config.train.update(batch_size=32, num_steps=600)
    config.checkpoint.every_steps = 200
    config.logging.update(log_every=50, eval_every=200, eval_batches=10)
    return config
