"""BERT-Large (Devlin et al. 2018), ~340M parameters: L=24, H=1024, A=16.

  python -m bertjax.train --config=configs/large.py --workdir=/tmp/bertjax-large
"""

import pathlib
import runpy

base_config = runpy.run_path(str(pathlib.Path(__file__).with_name("common.py")))["base_config"]


def get_config():
    config = base_config()
    config.model.num_layers = 24
    config.model.hidden_size = 1024
    config.model.num_heads = 16  # hidden / 64
    config.model.intermediate_size = 4096  # 4 * hidden
    return config
