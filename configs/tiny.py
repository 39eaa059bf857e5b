"""BERT-Tiny (Turc et al. 2019): L=2, H=128, A=2.

  python -m bertjax.train --config=configs/tiny.py --workdir=/tmp/bertjax-tiny
"""

import pathlib
import runpy

base_config = runpy.run_path(str(pathlib.Path(__file__).with_name("common.py")))["base_config"]


def get_config():
    config = base_config()
    config.model.num_layers = 2
    config.model.hidden_size = 128
    config.model.num_heads = 2  # hidden / 64
    config.model.intermediate_size = 512  # 4 * hidden
    # A vocabulary learned from the corpus on first use; 8k suits the few-MB demo corpus.
    config.model.vocab_size = 8192
    config.data.vocab_size = 8192
    # The demo corpus has about 1,000 documents: hold out about 50 of them.
    config.data.eval_fraction = 0.05
    # On a CPU, bfloat16 matmuls are emulated and slower than float32.
    config.model.dtype = "float32"
    return config
