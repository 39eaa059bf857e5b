"""ModernBERT-Large (Warner et al. 2024), 395M parameters: L=28, H=1024, A=16, GeGLU width 2,624.

  python -m bertjax.train --config=configs/modernbert_large.py --workdir=$WORKDIR --config.data.source=...

The network and recipe of configs/modernbert_base.py, with lr 5e-4 (the paper's for large); batch and
steps derived as there (4,928 x 1,024 tokens a step as the paper's large batch), the batch warmed up from
448 to 4,928 sequences over the first 10B tokens as the paper's large (1 to 11 microbatches of 448, over
3,960 steps), the learning rate over 3B tokens (2,080 steps), 1.7T tokens = 339,000 steps. save_named
remat keeps the matmul outputs and recomputes the element-wise work.
"""

from configs import common
from configs import modernbert_base


def get_config():
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
    return config
