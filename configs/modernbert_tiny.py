"""ModernBERT-Tiny: ModernBERT's network at L=3, H=128, A=2, GeGLU width 192, on the demo corpus in
minutes on a CPU.

  python -m bertjax.train --config=configs/modernbert_tiny.py --workdir=/tmp/bertjax-modernbert-tiny

As configs/modernbert_base.py (pre-norm without biases, RoPE, layer 0 global and layers 1-2 in a
window of 128, 30% masking, warmup-stable-decay), at tiny.py's scale: 600 steps of 32 x 128 tokens,
lr 1e-3, 60 warmup steps, 1 - sqrt decay over the last 120, an 8k WordPiece vocabulary. The optimizer
stays decoupled AdamW, which docs/performance.md's ModernBERT-tiny figures were measured with;
--config.optimizer.name=decoupled_stable_adamw trains with base's StableAdamW.
"""

from configs import common
from configs import modernbert_base


def get_config():
    config = common.base_config()
    modernbert_base.modernbert_model(config, layers=3, hidden=128, heads=2, intermediate=192)
    modernbert_base.modernbert_recipe(config, learning_rate=1e-3)
    config.optimizer.name = "decoupled_adamw"
    config.model.vocab_size = 8192
    config.model.max_position_embeddings = 128
    config.data.vocab_size = 8192
    config.data.eval_fraction = 0.05
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 40  # 30% of 128 = 38
    config.schedule.warmup_steps = 60
    config.schedule.decay_steps = 120
    config.train.batch_size = 32
    config.train.num_steps = 600
    config.checkpoint.every_steps = 200
    config.logging.log_every = 50
    config.logging.eval_every = 200
    config.logging.eval_batches = 10
    return config
