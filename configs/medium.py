"""BERT-Medium (Turc et al. 2019): L=8, H=512, A=8.

  python -m bertjax.train --config=configs/medium.py --workdir=/tmp/bertjax-medium
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 8
    config.model.hidden_size = 512
    config.model.num_heads = 8  # hidden / 64
    config.model.intermediate_size = 2048  # 4 * hidden
    return config
