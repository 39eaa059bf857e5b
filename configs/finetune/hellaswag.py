"""HellaSwag (the successor of SWAG, which TFDS lacks), the ending of a situation out of four (accuracy).

    python -m bertjax.finetune --config=configs/finetune/hellaswag.py --config.train.init_from=PATH --workdir=DIR
"""

from configs.finetune import common


def get_config():
    config = common.finetune_config("hellaswag")
    # The paper's SWAG recipe: batch 16, learning rate 2e-5, 3 epochs.
    config.train.batch_size = 16
    config.data.max_seq_length = 128
    return config
