"""RoBERTa-Base (Liu et al. 2019), 125M parameters: BERT-Base's network, trained as the paper trains it.

  python -m bertjax.train --config=configs/roberta_base.py --workdir=$WORKDIR --config.data.source=...

What differs from BERT: no next-sentence prediction (data.objective=none: FULL-SENTENCES rows of
contiguous sentences up to 512 tokens, crossing documents), masks re-drawn every epoch (bertjax's
masking always is), one segment (type_vocab_size 1), positions from padding_idx + 1 = 1 (513 rows, as
HF RobertaForMaskedLM numbers them with bertjax's [PAD] at 0: the weights convert both ways,
bertjax.interop.hf_roberta), LayerNorm eps 1e-5,
Adam b2 0.98 with bias correction, eps 1e-6, weight decay 0.01, no clipping, lr 6e-4 with 24,000 warmup
steps then linear decay to 0 at 500,000 steps, batch 8,192 sequences of 512 tokens (Table 9).
The paper's tokenizer is a 50,265-token byte-level BPE; bertjax learns a WordPiece vocabulary of that
size instead (or give data.vocab_path).
"""

from configs import common


def get_config():
    config = common.base_config()
    config.model.num_layers = 12
    config.model.hidden_size = 768
    config.model.num_heads = 12  # hidden / 64
    config.model.intermediate_size = 3072  # 4 * hidden
    config.model.vocab_size = 50265
    config.model.max_position_embeddings = 513  # 512 + padding_idx + 1
    # HF RoBERTa numbers positions from padding_idx + 1, and bertjax vocabularies put [PAD] at id 0
    # (the released roberta-base has <pad> at 1, so its checkpoints load with offset 2).
    config.model.position_offset = 1
    config.model.type_vocab_size = 1
    config.model.layer_norm_eps = 1e-5

    config.data.objective = "none"  # FULL-SENTENCES, masked LM only
    config.data.vocab_size = 50265
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80  # 15% of 512 = 77, rounded up
    config.data.mask_rate = 0.15

    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 6e-4
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98  # 0.999 is unstable with large batches (Section 3.1)
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = True  # fairseq's Adam
    config.optimizer.clip_norm = 0.0  # the paper clips at 0.0, i.e. not at all
    config.schedule.warmup_steps = 24_000
    config.schedule.decay = "linear"
    config.schedule.power = 1.0
    config.train.batch_size = 8192
    config.train.num_steps = 500_000
    return config
