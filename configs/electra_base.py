"""ELECTRA-Base (Clark et al. 2020, Table 6): discriminator L=12, H=768, A=12, F=3072 (BERT-Base's shape);
a generator a third as wide (H=256) and as deep, sharing the embeddings (768 wide: projected to 256).

  python -m bertjax.train --config=configs/electra_base.py --workdir=gs://bucket/electra-base

The paper's pretraining: 766,000 steps of 256 sequences of 512 tokens, lr 2e-4 with 10,000 warmup steps
and linear decay, Adam (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01), 15% of the tokens masked (79
predictions per sequence), loss = generator MLM + 50 x discriminator BCE.
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12
    config.model.intermediate_size = 3072
    config.model.embedding_size = 0  # 0: the hidden size, 768
    config.model.pooler = "gelu"  # ELECTRA's classification head: dense, GELU, then the classifier

    config.electra = common.electra_section(generator_hidden_size=256, generator_num_layers=12, generator_num_heads=4,
                                            generator_intermediate_size=1024, discriminator_weight=50.0)

    config.data.objective = "none"
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 79  # (0.15 + 0.005) x 512, as the release sets it
    config.data.max_sequences_per_row = 16
    config.data.mask_rate = 0.15
    config.data.mask_token_fraction = 0.85  # ELECTRA's release: [MASK] or the original, no random token
    config.data.random_token_fraction = 0.0

    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 2e-4
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = False
    config.optimizer.clip_norm = 1.0
    config.schedule.warmup_steps = 10000
    config.schedule.decay = "linear"
    config.train.batch_size = 256
    config.train.num_steps = 766_000
    return config
