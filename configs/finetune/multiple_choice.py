"""Multiple choice on the user's own files (JSON lines: context, choices, label = the right choice's index).

    python -m bertjax.finetune --config=configs/finetune/multiple_choice.py --config.train.init_from=PATH \
        --config.data.train=train.jsonl --config.data.validation=dev.jsonl --config.data.num_choices=4 \
        --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("multiple_choice")
    config.train.batch_size = 16  # the paper's SWAG batch: each example is num_choices sequences
    return config
