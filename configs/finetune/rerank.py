"""A reranker (cross-encoder) fine-tuned on the user's queries and their candidate passages (JSON lines:
query, passages, labels; or query, passage, label per row), dev nDCG@10 of reranking choosing the best
checkpoint; exported as a sentence-transformers CrossEncoder.

    python -m bertjax.finetune --config=configs/finetune/rerank.py --config.train.init_from=PATH \
        --config.data.train=train.jsonl --config.data.validation=dev.jsonl --workdir=DIR

Every hyperparameter is written out in configs/finetune/common.py's rerank_config; the ones a run usually
changes are repeated here.
"""

from configs.finetune import common


def get_config():
    config = common.rerank_config()
    config.rerank.loss = "bce"  # listnet, lambdaloss, ranknet (lists of labels); margin_mse, kl (teacher scores)
    config.rerank.candidates = 8
    config.train.batch_size = 16
    config.train.epochs = 1.0
    config.optimizer.learning_rate = 2e-5
    config.data.max_seq_length = 256
    return config
