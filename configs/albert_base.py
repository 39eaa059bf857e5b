"""ALBERT-Base (Lan et al. 2020), 12M parameters: L=12, H=768, A=12, embeddings E=128, all 12 layers
sharing one group of parameters.

  python -m bertjax.train --config=configs/albert_base.py --workdir=$WORKDIR --config.data.source=...

What differs from BERT: factorised embeddings (E=128 tables projected to H once), cross-layer sharing
(num_hidden_groups=1), the tanh GELU ("gelu_new"), sentence-order prediction (data.objective=sop: two
consecutive segments of one document, swapped half the time), n-gram masking (whole-word n-grams,
n <= 3, p(n) ~ 1/n), a 30,000-piece SentencePiece vocabulary, no dropout (v2), LAMB lr 0.00176 with
3,125 warmup steps then linear decay, batch 4,096 sequences of 512 for 125,000 steps. The weights
convert to and from HF AlbertForPreTraining (bertjax.interop.hf_albert). With scan_layers=True the groups are scanned,
each applied L/G times inside its scan step.
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12  # hidden / 64
    config.model.intermediate_size = 3072  # 4 * hidden
    config.model.embedding_size = 128
    config.model.num_hidden_groups = 1  # every layer runs the same parameters
    config.model.activation = "gelu_tanh"
    config.model.vocab_size = 30000
    config.model.hidden_dropout_rate = 0.0  # ALBERT v2
    config.model.attention_dropout_rate = 0.0

    config.data.objective = "sop"
    config.data.tokenizer = "sentencepiece"
    config.data.vocab_size = 30000
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 20  # as google-research/albert's run_pretraining
    config.data.mask_rate = 0.15
    # ALBERT's n-gram masking: n-grams of whole words, n <= 3 with p(n) proportional to 1/n.
    config.data.masking = "ngram"
    config.data.ngram_max_n = 3

    config.optimizer.name = "lamb"
    config.optimizer.learning_rate = 0.00176
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = False  # ALBERT's lamb_optimizer.py has none
    config.optimizer.clip_norm = 1.0
    config.schedule.warmup_steps = 3125
    config.schedule.decay = "linear"
    config.schedule.power = 1.0
    config.train.batch_size = 4096
    config.train.num_steps = 125_000
    return config
