"""ELECTRA-Tiny: a BERT-Tiny-shaped discriminator (L=2, H=128, A=2) and a generator a quarter as wide,
trained by replaced-token detection (Clark et al. 2020) on the demo corpus, in minutes on a CPU.

  python -m bertjax.train --config=configs/electra_tiny.py --workdir=/tmp/bertjax-electra-tiny

The generator (H=32, 2 layers) is a masked LM on the demo corpus's 15% masked positions; its samples
replace them, and the discriminator learns which tokens were replaced. Logged: mlm_* (the generator),
disc_loss, disc_accuracy and replaced_share. The recipe (lr 1e-3, 60 warmup steps, 600 steps of 32 x 128
tokens, an 8k WordPiece vocabulary) is configs/tiny.py's, so the two runs compare.
"""

from configs import common


def get_config():
    config = common.base_config()
    # The discriminator: the model that is kept (fine-tuning, bertjax.load, export read it).
    config.model.num_layers = 2
    config.model.hidden_size = 128
    config.model.num_heads = 2  # hidden / 64
    config.model.intermediate_size = 512  # 4 * hidden
    config.model.vocab_size = 8192
    config.model.embedding_size = 0  # 0: the hidden size (ELECTRA-Small factorises: 128 for 256)
    config.model.pooler = "gelu"  # ELECTRA's classification head: dense, GELU, then the classifier

    config.electra = common.electra_section(generator_hidden_size=32, generator_num_layers=2, generator_num_heads=1,
                                            generator_intermediate_size=128, discriminator_weight=50.0)

    config.data.objective = "none"  # no sentence task: full rows across documents
    config.data.vocab_size = 8192
    config.data.eval_fraction = 0.05
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.data.mask_rate = 0.15
    config.data.mask_token_fraction = 0.85  # ELECTRA's release: [MASK] or the original, no random token
    config.data.random_token_fraction = 0.0

    config.optimizer.learning_rate = 1e-3
    config.optimizer.bias_correction = True
    config.schedule.warmup_steps = 60
    config.train.batch_size = 32
    config.train.num_steps = 600
    config.checkpoint.every_steps = 200
    config.logging.log_every = 50
    config.logging.eval_every = 200
    config.logging.eval_batches = 10
    return config
