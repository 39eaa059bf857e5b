"""BERT-Small (Turc et al. 2019): L=4, H=512, A=8.

  python -m bertjax.train --config=configs/small.py --workdir=/tmp/bertjax-small
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 4
    config.model.hidden_size = 512
    config.model.num_heads = 8  # hidden / 64
    config.model.intermediate_size = 2048  # 4 * hidden
    return config
