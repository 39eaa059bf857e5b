"""TinyBERT's general distillation made small: a 2-layer, hidden-64 student of a 4-layer, hidden-128 teacher
on the built-in demo corpus, in a few minutes on a CPU.

  python -m bertjax.train --config=configs/tiny.py --config.model.num_layers=4 --workdir=/tmp/teacher4
  python -m bertjax.distill --config=configs/distill/tinybert_tiny.py --config.distill.teacher=/tmp/teacher4 \
      --workdir=/tmp/tinybert2

The student is fresh and narrower than the teacher (64 against 128), with the teacher's 2 heads: it learns
the teacher's embedding outputs and layers 2 and 4 (g(m) = m N / M) through learned projections to the
teacher's width, and each mapped layer's attention scores before softmax, with no prediction loss (the
published general distillation's recipe, configs/distill/tinybert.py). The workdir reads as a pretraining
workdir (the projections are saved beside the optimizer state): fine-tune it with train.init_from, where
task distillation (configs/finetune/*.py's distill section, with --config.distill.alpha_hidden=1 etc.: fresh
projections again) follows in TinyBERT's recipe (configs/distill/tinybert.py gives the commands).
"""

from configs.distill import common


def get_config():
    config = common.distill_config()
    config.distill.student_layers = ()  # a fresh student of the model section below
    # TinyBERT's general distillation: the intermediate layers only.
    config.distill.update(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0, alpha_embedding=1.0, alpha_hidden=1.0,
                          alpha_attention=1.0, layer_map="uniform")
    # The student: 2 layers, hidden 64, the teacher's 2 heads (attention is compared head by head).
    config.model.update(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=256, vocab_size=8192,
                        attention_impl="xla")  # the scores before softmax exist only in XLA's attention
    config.data.update(vocab_size=8192, eval_fraction=0.05, max_seq_length=64, max_predictions_per_seq=10)
    # A short run from scratch takes a higher learning rate than DistilBERT's and a short warmup.
    config.optimizer.learning_rate = 1e-3
    config.schedule.warmup_steps = 30
    config.train.update(batch_size=32, num_steps=400)
    config.checkpoint.every_steps = 200
    config.logging.update(log_every=50, eval_every=200, eval_batches=10)
    return config
