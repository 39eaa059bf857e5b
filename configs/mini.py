"""BERT-Mini (Turc et al. 2019): L=4, H=256, A=4.

  python -m bertjax.train --config=configs/mini.py --workdir=/tmp/bertjax-mini
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 4
    config.model.hidden_size = 256
    config.model.num_heads = 4  # hidden / 64
    config.model.intermediate_size = 1024  # 4 * hidden
    return config
