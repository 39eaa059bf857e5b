"""RoBERTa-Tiny: BERT-Tiny's shape (L=2, H=128, A=2) with RoBERTa's recipe, on the demo corpus in
minutes on a CPU.

  python -m bertjax.train --config=configs/roberta_tiny.py --workdir=/tmp/bertjax-roberta-tiny

RoBERTa's choices at this size: no next-sentence prediction (data.objective=none, FULL-SENTENCES rows),
one segment, positions from [PAD]'s id + 1, LayerNorm eps 1e-5, Adam b2 0.98 with bias correction, eps 1e-6. The rest
(lr 1e-3, 60 warmup steps, 600 steps of 32 x 128 tokens, an 8k WordPiece vocabulary) is configs/tiny.py's,
so the two runs compare.
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 2
    config.model.hidden_size = 128
    config.model.num_heads = 2  # hidden / 64
    config.model.intermediate_size = 512  # 4 * hidden
    config.model.vocab_size = 8192
    config.model.max_position_embeddings = 129  # 128 + padding_idx + 1
    config.model.position_offset = 1  # [PAD] (id 0) + 1, as HF RoBERTa numbers positions
    config.model.type_vocab_size = 1
    config.model.layer_norm_eps = 1e-5

    config.data.objective = "none"
    config.data.vocab_size = 8192
    config.data.eval_fraction = 0.05
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15

    config.optimizer.learning_rate = 1e-3
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = True
    config.schedule.warmup_steps = 60
    config.train.batch_size = 32
    config.train.num_steps = 600
    config.checkpoint.every_steps = 200
    config.logging.log_every = 50
    config.logging.eval_every = 200
    config.logging.eval_batches = 10
    return config
