"""BERT-Base (Devlin et al. 2018), 110M parameters: L=12, H=768, A=12.

  python -m bertjax.train --config=configs/base.py --workdir=$WORKDIR
  python -m bertjax.train --config=configs/base.py:adam_seq512 --workdir=$W512 --config.train.init_from=$WORKDIR

Recipes ("adam" (default), "adam_seq512"):
adam: the paper's pretraining: Adam (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01, no bias
correction), lr 1e-4 with 10,000 warmup steps then linear decay, batch 256, global-norm clipping 1.0;
900,000 steps at seq 128. adam_seq512: the last 100,000 of the paper's 1,000,000 steps at seq 512,
from the seq-128 parameters: the same linear decay, continued (lr 1e-5 down to 0).
With no corpus set this trains on the built-in demo corpus; for real pretraining set data.source.
"""

from configs import common


def get_config(recipe: str = "adam"):
    config = common.base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12  # hidden / 64
    config.model.intermediate_size = 3072  # 4 * hidden
    return common.apply_recipe(config, common.DEVLIN_RECIPES, recipe, "configs/base.py")
