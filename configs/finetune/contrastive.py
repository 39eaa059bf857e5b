"""A sentence embedder fine-tuned on the user's query / positive pairs (JSON lines: query, positive,
optional negatives; or text, text_pair, score with contrastive.loss=cosent): MultipleNegativesRankingLoss
over the global batch, dev retrieval (mrr_at_10, recall_at_1) choosing the best checkpoint. Embedding
distillation: contrastive.loss=distill_mse and contrastive.teacher=PATH on {text, target_text} rows.

    python -m bertjax.finetune --config=configs/finetune/contrastive.py --config.train.init_from=PATH \
        --config.data.train=pairs.jsonl --config.data.validation=dev_pairs.jsonl --workdir=DIR

Every hyperparameter is written out in configs/finetune/common.py's contrastive_config; the ones a run
usually changes are repeated here.
"""

from configs.finetune import common


def get_config():
    config = common.contrastive_config()
    config.train.batch_size = 64  # in-batch negatives: larger batches are harder (and better) contrasts
    config.train.epochs = 1.0
    config.train.contrastive_microbatch = 0  # e.g. 16: the same gradient in 4 cached microbatches
    config.schedule.warmup_fraction = 0.1
    config.contrastive.loss = "mnrl"
    config.contrastive.scale = 20.0
    config.contrastive.symmetric = False
    config.contrastive.matryoshka_dims = ()  # e.g. (768, 512, 256, 128, 64) for a base model
    config.contrastive.pooling = ("mean",)
    config.contrastive.normalize = True
    config.contrastive.query_prompt = ""  # e.g. "query: "
    config.contrastive.passage_prompt = ""  # e.g. "passage: "
    config.contrastive.include_prompt = True  # False: the prompts' tokens are not pooled
    config.data.max_query_length = 32
    config.data.max_seq_length = 128
    config.data.packing = True  # queries, passages and negatives share rows: far fewer padded positions
    config.data.packed_rows = None  # rows of a packed step; unset: the most any step of the run needs
    return config
