"""Span question answering on the user's own SQuAD-format JSON files (v1.1, or v2.0 with unanswerable
questions).

    python -m bertjax.finetune --config=configs/finetune/span.py --config.train.init_from=PATH \
        --config.data.train=train.json --config.data.validation=dev.json \
        [--config.data.squad_version=v2.0] --workdir=DIR
"""

from configs.finetune import common


def get_config():
    return common.span_config("span")
