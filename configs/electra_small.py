"""ELECTRA-Small (Clark et al. 2020, Table 6): discriminator L=12, H=256, A=4, F=1024 with 128-wide
embeddings; a generator a quarter as wide (H=64) and as deep, sharing the embeddings.

  python -m bertjax.train --config=configs/electra_small.py --workdir=/tmp/bertjax-electra-small

The paper's pretraining: 1M steps of 128 sequences of 128 tokens, lr 5e-4 with 10,000 warmup steps and
linear decay, Adam (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01), 15% of the tokens masked, loss =
generator MLM + 50 x discriminator BCE. GLUE dev (the paper): 79.9, against BERT-Small's 75.1.
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 256
    config.model.num_heads = 4
    config.model.intermediate_size = 1024
    config.model.embedding_size = 128  # projected to 256 (Hugging Face: embeddings_project)
    config.model.pooler = "gelu"  # ELECTRA's classification head: dense, GELU, then the classifier

    config.electra = common.electra_section(generator_hidden_size=64, generator_num_layers=12, generator_num_heads=1,
                                            generator_intermediate_size=256, discriminator_weight=50.0)

    config.data.objective = "none"
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15
    config.data.mask_token_fraction = 0.85  # ELECTRA's release: [MASK] or the original, no random token
    config.data.random_token_fraction = 0.0

    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 5e-4
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = False
    config.optimizer.clip_norm = 1.0
    config.schedule.warmup_steps = 10000
    config.schedule.decay = "linear"
    config.train.batch_size = 128
    config.train.num_steps = 1_000_000
    return config
