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

import pathlib
import runpy

base_config = runpy.run_path(str(pathlib.Path(__file__).with_name("common.py")))["base_config"]


def get_config(recipe: str = "adam"):
    config = base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12  # hidden / 64
    config.model.intermediate_size = 3072  # 4 * hidden
    if recipe == "adam":
        config.optimizer.update(name="adamw", learning_rate=1e-4, bias_correction=False)
        config.schedule.update(warmup_steps=10000, decay="linear", power=1.0)
        config.train.update(batch_size=256, num_steps=900_000)
    elif recipe == "adam_seq512":
        config.optimizer.update(name="adamw", learning_rate=1e-5, bias_correction=False)
        config.schedule.update(warmup_steps=0, decay="linear", power=1.0)
        config.train.update(batch_size=256, num_steps=100_000)
        config.data.update(max_seq_length=512, max_predictions_per_seq=80)
    else:
        raise ValueError(f"unknown recipe {recipe!r} for configs/base.py: choose one of adam, adam_seq512")
    return config
