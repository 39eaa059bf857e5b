"""A 3-layer student of a 6-layer ModernBERT-Tiny teacher on the built-in demo corpus, in minutes on a CPU.

  python -m bertjax.train --config=configs/modernbert_tiny.py --config.model.num_layers=6 \
      --config.train.num_steps=1200 --config.schedule.decay_steps=240 --workdir=/tmp/teacher6
  python -m bertjax.distill --config=configs/distill/modernbert_tiny.py \
      --config.distill.teacher=/tmp/teacher6 --workdir=/tmp/student3

The student starts from the teacher's layers 0, 4 and 5: the first and the last two, each keeping its
kind of attention (the teacher's layer j is global when j % 3 == 0, as the student's layer i is when
i % 3 == 0), with the embeddings and the masked-LM head; it learns the teacher's masked-LM distribution,
the labels and the teacher's last hidden states at ModernBERT's 30% masking. README's "Compression"
section has the measured results (the word_order demo task: the teacher, this student, the same
student undistilled, pruned and int8 variants).
"""

from configs.distill import common


def get_config():
    config = common.distill_config()
    config.distill.student_layers = (0, 4, 5)
    # The student's shape, written out for the reader (the teacher's architecture with three layers).
    config.model.update(num_layers=3, hidden_size=128, num_heads=2, intermediate_size=192, vocab_size=8192)
    # How the student computes: ModernBERT trains without dropout.
    config.model.update(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    # ModernBERT's masking: 30% in training, held-out batches at BERT's 15%.
    config.data.update(vocab_size=8192, eval_fraction=0.05, mask_rate=0.3, eval_mask_rate=0.15,
                       max_predictions_per_seq=40)
    # A short run takes a higher learning rate than DistilBERT's and a short warmup.
    config.optimizer.learning_rate = 1e-3
    config.schedule.warmup_steps = 30
    config.train.update(batch_size=32, num_steps=600)
    config.checkpoint.every_steps = 200
    config.logging.update(log_every=50, eval_every=200, eval_batches=10)
    return config
