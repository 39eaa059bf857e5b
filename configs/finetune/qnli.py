"""QNLI, does the sentence answer the question (accuracy). Paper, BERT-base: 90.5 (test).

    python -m bertjax.finetune --config=configs/finetune/qnli.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("qnli")
    return config
