"""WNLI, pronoun resolution as entailment (accuracy); the paper left it out (its dev set is adversarial).

    python -m bertjax.finetune --config=configs/finetune/wnli.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("wnli")
    return config
