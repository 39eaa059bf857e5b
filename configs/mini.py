"""BERT-Mini (Turc et al. 2019): L=4, H=256, A=4.

  python -m bertjax.train --config=configs/mini.py --workdir=/tmp/bertjax-mini
"""

import pathlib
import runpy

base_config = runpy.run_path(str(pathlib.Path(__file__).with_name("common.py")))["base_config"]


def get_config():
    config = base_config()
    config.model.num_layers = 4
    config.model.hidden_size = 256
    config.model.num_heads = 4  # hidden / 64
    config.model.intermediate_size = 1024  # 4 * hidden
    return config
