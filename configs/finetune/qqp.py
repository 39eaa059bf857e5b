"""QQP, duplicate questions (F1, accuracy). Paper, BERT-base: 71.2 F1 (test).

    python -m bertjax.finetune --config=configs/finetune/qqp.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("qqp")
    return config
