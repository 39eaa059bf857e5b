"""MRPC, paraphrase pairs (F1, accuracy). Paper, BERT-base: 88.9 F1 (test).

    python -m bertjax.finetune --config=configs/finetune/mrpc.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("mrpc")
    return config
