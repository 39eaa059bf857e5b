"""ModernBERT-Large (Warner et al. 2024), 395M parameters: L=28, H=1024, A=16, GeGLU width 2,624.

  python -m bertjax.train --config=configs/modernbert_large.py --workdir=$WORKDIR --config.data.source=...
  python -m bertjax.train --config=configs/modernbert_large.py:extend --workdir=$P2 --config.train.init_from=$P1 ...

The network and recipe of configs/modernbert_base.py, with lr 5e-4 (the paper's for large); batch and
steps derived as there (4,928 x 1,024 tokens a step as the paper's large batch), the batch warmed up from
448 to 4,928 sequences over the first 10B tokens as the paper's large (1 to 11 microbatches of 448, over
3,960 steps), the learning rate over 3B tokens (2,080 steps), 1.7T tokens = 339,000 steps. save_named
remat keeps the matmul outputs and recomputes the element-wise work.

Recipes as configs/modernbert_base.py's: one_phase (the default, as above), and the paper's phases
pretrain (large's rate, warmups and steps, the rate constant after its warmup, global theta 10,000),
extend and decay (8,192 tokens, global theta 160,000, batch 576, lr 3e-4 constant then 1 - sqrt to 0;
53,000 and 10,600 steps: the issue gives these settings for ModernBERT's phases, the same for both sizes).
grad_accum_steps=9 at 8,192: microbatches of 64 rows, as base's; change it with the hardware.
"""

from configs import common
from configs import modernbert_base

LONG_ROWS, NO_BATCH_WARMUP = modernbert_base.LONG_ROWS, modernbert_base.NO_BATCH_WARMUP
RECIPES = {
    "one_phase": {},
    **modernbert_base.phase_recipes(
        "configs/modernbert_large.py",
        pretrain=dict(optimizer=dict(learning_rate=5e-4), schedule=dict(warmup_steps=2080, decay_steps=0),
                      data=dict(max_seq_length=1024, max_predictions_per_seq=320),
                      train=dict(batch_size=4928, grad_accum_steps=11, batch_warmup_start=448,
                                 batch_warmup_steps=3960, num_steps=339_000)),
        extend=dict(optimizer=dict(learning_rate=3e-4), schedule=dict(warmup_steps=0, decay_steps=0), data=LONG_ROWS,
                    train=dict(batch_size=576, grad_accum_steps=9, num_steps=53_000, **NO_BATCH_WARMUP)),
        decay=dict(optimizer=dict(learning_rate=3e-4), schedule=dict(warmup_steps=0, decay_steps=10_600),
                   data=LONG_ROWS,
                   train=dict(batch_size=576, grad_accum_steps=9, num_steps=10_600, **NO_BATCH_WARMUP)),
    ),
}


def get_config(recipe: str = "one_phase"):
    config = common.base_config()
    modernbert_base.modernbert_model(config, layers=28, hidden=1024, heads=16, intermediate=2624)
    modernbert_base.modernbert_recipe(config, learning_rate=5e-4)
    config.model.remat_policy = "save_named"
    config.model.scan_layers = True  # layer 0 unrolled, layers 1-27 one compiled block: short compiles
    config.data.max_seq_length = 1024
    config.data.max_predictions_per_seq = 320
    config.schedule.warmup_steps = 2080
    config.schedule.decay_steps = 9_900
    config.train.batch_size = 4928
    config.train.grad_accum_steps = 11  # microbatches of 448: the batch warmup's unit
    config.train.batch_warmup_start = 448
    config.train.batch_warmup_steps = 3960
    config.train.num_steps = 339_000
    return common.apply_recipe(config, RECIPES, recipe, "configs/modernbert_large.py")
