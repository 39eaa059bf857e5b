"""CoNLL-2003 English NER, token tagging (entity-level F1). Paper, BERT-base: 96.4 dev F1 fine-tuned,
96.1 with the feature-based tagger (the last four layers concatenated, a two-layer BiLSTM).

    python -m bertjax.finetune --config=configs/finetune/conll2003.py --config.train.init_from=PATH --workdir=DIR
    python -m bertjax.finetune --config=configs/finetune/conll2003.py --config.train.init_from=PATH \
        --config.feature_based.enabled=True --workdir=DIR

A word's tag is predicted at its first piece (the paper's choice, section 5.3). The paper gives no
NER-specific hyperparameters: the common recipe (batch 32, 3 epochs, the learning-rate grid), with
the cased vocabulary as the paper used for NER.
"""

from configs.finetune import common


def get_config():
    return common.tagging_config("conll2003")
