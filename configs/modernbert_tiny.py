"""ModernBERT-Tiny: ModernBERT's network at L=3, H=128, A=2, GeGLU width 192, on the demo corpus in
minutes on a CPU.

  python -m bertjax.train --config=configs/modernbert_tiny.py --workdir=/tmp/bertjax-modernbert-tiny

As configs/modernbert_base.py (pre-norm without biases, RoPE, layer 0 global and layers 1-2 in a
window of 128, 30% masking, warmup-stable-decay), at tiny.py's scale: 600 steps of 32 x 128 tokens,
lr 1e-3, 60 warmup steps, 1 - sqrt decay over the last 120, an 8k WordPiece vocabulary. The optimizer
stays decoupled AdamW, which docs/performance.md's ModernBERT-tiny figures were measured with;
--config.optimizer.name=decoupled_stable_adamw trains with base's StableAdamW.

The paper's three phases at this scale on the demo corpus (configs/modernbert_base.py has them whole):
  python -m bertjax.train --config=configs/modernbert_tiny.py:pretrain --workdir=/tmp/mbt-pretrain
  python -m bertjax.train --config=configs/modernbert_tiny.py:extend --workdir=/tmp/mbt-extend \\
    --config.train.init_from=/tmp/mbt-pretrain
  python -m bertjax.train --config=configs/modernbert_tiny.py:decay --workdir=/tmp/mbt-decay \\
    --config.train.init_from=/tmp/mbt-extend

pretrain: 300 steps of 8 x 1,024 tokens, StableAdamW (decoupled decay) lr 1e-3 with 30 warmup steps then
constant, the batch warmed up from 4 to 8 rows over the first 60 steps, global theta 10,000. extend: 100
steps of one 8,192-token row, global theta 160,000, lr 3.75e-4 (the paper's 3e-4 / 8e-4 of pretraining's)
constant, blockwise attention so that a CPU holds the row. decay: 40 more such steps, 1 - sqrt to 0.
model.max_position_embeddings is 8,192 in every phase (rotary: no table, only a limit), so that the
pretrain run's model can be fine-tuned on long rows too.
"""

from configs import common
from configs import modernbert_base

STABLE = dict(name="decoupled_stable_adamw")
LONG_ROWS = modernbert_base.LONG_ROWS
RECIPES = {
    "one_phase": {},
    **modernbert_base.phase_recipes(
        "configs/modernbert_tiny.py",
        pretrain=dict(model=dict(max_position_embeddings=8192, attention_impl="auto"),
                      optimizer=dict(STABLE, learning_rate=1e-3), schedule=dict(warmup_steps=30, decay_steps=0),
                      data=dict(max_seq_length=1024, max_predictions_per_seq=320),
                      train=dict(batch_size=8, grad_accum_steps=2, batch_warmup_start=4, batch_warmup_steps=60,
                                 num_steps=300),
                      checkpoint=dict(every_steps=100), logging=dict(log_every=25, eval_every=100, eval_batches=4)),
        extend=dict(model=dict(max_position_embeddings=8192, attention_impl="blockwise"),
                    optimizer=dict(STABLE, learning_rate=3.75e-4), schedule=dict(warmup_steps=0, decay_steps=0),
                    data=LONG_ROWS, train=dict(batch_size=1, grad_accum_steps=1, num_steps=100,
                                               **modernbert_base.NO_BATCH_WARMUP),
                    checkpoint=dict(every_steps=50), logging=dict(log_every=10, eval_every=50, eval_batches=2)),
        decay=dict(model=dict(max_position_embeddings=8192, attention_impl="blockwise"),
                   optimizer=dict(STABLE, learning_rate=3.75e-4), schedule=dict(warmup_steps=0, decay_steps=40),
                   data=LONG_ROWS, train=dict(batch_size=1, grad_accum_steps=1, num_steps=40,
                                              **modernbert_base.NO_BATCH_WARMUP),
                   checkpoint=dict(every_steps=20), logging=dict(log_every=10, eval_every=20, eval_batches=2)),
    ),
}


def get_config(recipe: str = "one_phase"):
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
    return common.apply_recipe(config, RECIPES, recipe, "configs/modernbert_tiny.py")
