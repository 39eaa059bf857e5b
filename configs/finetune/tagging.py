"""Token tagging on the user's own CoNLL column files (word first, tag last; BIO or IOB1 tags).

    python -m bertjax.finetune --config=configs/finetune/tagging.py --config.train.init_from=PATH \
        --config.data.train=train.txt --config.data.validation=dev.txt \
        --config.data.labels="('O', 'B-PER', 'I-PER', 'B-LOC', 'I-LOC')" --workdir=DIR
"""

from configs.finetune import common


def get_config():
    return common.tagging_config("tagging")
