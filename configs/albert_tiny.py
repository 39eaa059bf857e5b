"""ALBERT-Tiny: 4 layers sharing one group of H=128 parameters (A=2), embeddings E=64, sentence-order
prediction, on the demo corpus in minutes on a CPU.

  python -m bertjax.train --config=configs/albert_tiny.py --workdir=/tmp/bertjax-albert-tiny

ALBERT's choices at this size (factorised embeddings, sharing, tanh GELU, SOP, n-gram masking); the
recipe (Adam with bias correction, lr 1e-3, 60 warmup steps, 600 steps of 32 x 128 tokens, an 8k
WordPiece vocabulary) is configs/tiny.py's, so the runs compare.
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 4
    config.model.hidden_size = 128
    config.model.num_heads = 2  # hidden / 64
    config.model.intermediate_size = 512  # 4 * hidden
    config.model.embedding_size = 64
    config.model.num_hidden_groups = 1
    config.model.activation = "gelu_tanh"
    config.model.vocab_size = 8192

    config.data.objective = "sop"
    config.data.vocab_size = 8192
    config.data.eval_fraction = 0.05
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15
    # ALBERT's n-gram masking: n-grams of whole words, n <= 3 with p(n) proportional to 1/n.
    config.data.masking = "ngram"
    config.data.ngram_max_n = 3

    config.optimizer.learning_rate = 1e-3
    config.optimizer.bias_correction = True
    config.schedule.warmup_steps = 60
    config.train.batch_size = 32
    config.train.num_steps = 600
    config.checkpoint.every_steps = 200
    config.logging.log_every = 50
    config.logging.eval_every = 200
    config.logging.eval_batches = 10
    return config
