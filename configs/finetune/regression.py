"""A number predicted for the user's own texts or pairs (JSON lines: text, optional text_pair, label).

    python -m bertjax.finetune --config=configs/finetune/regression.py --config.train.init_from=PATH \
        --config.data.train=train.jsonl --config.data.validation=dev.jsonl --workdir=DIR
"""

from configs.finetune import common


def get_config():
    return common.finetune_config("regression")
