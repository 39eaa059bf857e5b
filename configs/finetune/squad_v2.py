"""SQuAD v2.0, span question answering with unanswerable questions (exact match, F1 at the no-answer
threshold tuned on dev). Paper, BERT-large: 78.7 EM / 81.9 F1 (dev).

    python -m bertjax.finetune --config=configs/finetune/squad_v2.py --config.train.init_from=PATH --workdir=DIR

The paper's recipe (section 4.3): 2 epochs, learning rate 5e-5, batch 48; windows and decoding as
SQuAD v1.1. The threshold is saved with the best checkpoint, so bertjax.load(...).predict uses it.
"""

from configs.finetune import common


def get_config():
    config = common.span_config("squad_v2")
    config.train.epochs = 2.0
    config.train.batch_size = 48
    return config
