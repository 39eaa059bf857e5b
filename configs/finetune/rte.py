"""RTE, entailment (accuracy). Paper, BERT-base: 66.4 (test).

    python -m bertjax.finetune --config=configs/finetune/rte.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("rte")
    return config
