"""CoLA, grammatical acceptability (Matthews correlation). Paper, BERT-base: 52.1 (test).

    python -m bertjax.finetune --config=configs/finetune/cola.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("cola")
    return config
