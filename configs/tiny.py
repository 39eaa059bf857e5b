"""BERT-Tiny (Turc et al. 2019): L=2, H=128, A=2, on the built-in demo corpus, in minutes on a CPU.

  python -m bertjax.train --config=configs/tiny.py --workdir=/tmp/bertjax-tiny

Learns an 8k WordPiece vocabulary from the demo corpus on first use (cached in the workdir), then
trains 600 steps of 32 sequences of 128 tokens. Expected on a 2-core CPU: see the README's results
table (held-out masked-LM accuracy far above the most-frequent-token baseline).
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 2
    config.model.hidden_size = 128
    config.model.num_heads = 2  # hidden / 64
    config.model.intermediate_size = 512  # 4 * hidden
    # A vocabulary learned from the corpus on first use; 8k suits the 1.4 MB demo corpus.
    config.model.vocab_size = 8192
    config.data.vocab_size = 8192
    # The demo corpus has about 1,000 documents: hold out about 50 of them.
    config.data.eval_fraction = 0.05

    # A small model on a small corpus takes a higher learning rate and a short warmup. 600 steps of
    # 32 x 128 tokens (about 2 passes over the corpus) take a few minutes on a 2-core CPU.
    config.optimizer.learning_rate = 1e-3
    # The original's uncorrected Adam is harmless after 10,000 warmup steps, but in a run this short it
    # makes the first updates several times too large and the model stays on the unigram plateau.
    config.optimizer.bias_correction = True
    config.schedule.warmup_steps = 60
    config.train.batch_size = 32
    config.train.num_steps = 600
    config.checkpoint.every_steps = 200
    config.logging.log_every = 50
    config.logging.eval_every = 200
    config.logging.eval_batches = 10
    return config
