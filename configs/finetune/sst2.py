"""SST-2, sentiment of movie-review sentences (accuracy). Paper, BERT-base: 93.5 (test).

    python -m bertjax.finetune --config=configs/finetune/sst2.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("sst2")
    return config
