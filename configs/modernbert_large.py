"""ModernBERT-Large (Warner et al. 2024), 395M parameters: L=28, H=1024, A=16, GeGLU width 2,624.

  python -m bertjax.train --config=configs/modernbert_large.py --workdir=$WORKDIR --config.data.source=...

The network and recipe of configs/modernbert_base.py, with lr 5e-4 (the paper's for large); batch and
steps derived as there (4,928 x 1,024 tokens a step as the paper's large batch). save_named remat keeps
the matmul outputs and recomputes the element-wise work.
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
    config.schedule.warmup_steps = 600
    config.schedule.decay_steps = 9_900
    config.train.batch_size = 4928
    config.train.num_steps = 337_000
    return config
