"""Classification of the user's own texts or text pairs (JSON lines: text, optional text_pair, label).

    python -m bertjax.finetune --config=configs/finetune/classification.py --config.train.init_from=PATH \
        --config.data.train=train.jsonl --config.data.validation=dev.jsonl \
        --config.data.labels="('negative', 'positive')" --workdir=DIR
"""

from configs.finetune import common


def get_config():
    return common.finetune_config("classification")
