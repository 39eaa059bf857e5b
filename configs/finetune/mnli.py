"""MNLI, entailment in three classes (accuracy on matched and mismatched dev). Paper, BERT-base: 84.6/83.4 (test).

    python -m bertjax.finetune --config=configs/finetune/mnli.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("mnli")
    return config
