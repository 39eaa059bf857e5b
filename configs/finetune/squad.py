"""SQuAD v1.1, span question answering (exact match, F1). Paper, BERT-base: 80.8 EM / 88.5 F1 (dev).

    python -m bertjax.finetune --config=configs/finetune/squad.py --config.train.init_from=PATH --workdir=DIR

The paper's recipe (section 4.2): 3 epochs, learning rate 5e-5, batch 32; windows of 384 tokens,
doc stride 128, questions cut to 64 tokens; answers of at most 30 tokens from the 20 best start and
end positions (google-research/bert's run_squad.py defaults).
"""

from configs.finetune import common


def get_config():
    return common.span_config("squad")
