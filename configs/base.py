"""BERT-Base (Devlin et al. 2018), ~110M parameters: L=12, H=768, A=12.

  python -m bertjax.train --config=configs/base.py --workdir=/tmp/bertjax-base
"""

import pathlib
import runpy

base_config = runpy.run_path(str(pathlib.Path(__file__).with_name("common.py")))["base_config"]


def get_config():
    config = base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12  # hidden / 64
    config.model.intermediate_size = 3072  # 4 * hidden
    return config
