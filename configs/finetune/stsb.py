"""STS-B, sentence similarity 0-5 (Spearman, Pearson). Paper, BERT-base: 85.8 Spearman (test).

    python -m bertjax.finetune --config=configs/finetune/stsb.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("stsb")
    return config
