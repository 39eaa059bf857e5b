"""IB-BERT-Tiny: the teacher of MobileBERT-Tiny (configs/mobilebert_tiny.py) on the demo corpus, in minutes on a
CPU: its L=4 layers, H=128 between them and A=2 heads, each layer widened to W=256 inside (heads of 128), one
feed-forward network of 512, the student's 64-wide trigram word vectors; LayerNorm, GELU and a tanh pooler, as
IB-BERT-Large (configs/ibbert.py). tiny.py's data (next-sentence pairs, 32 x 128 tokens, an 8k WordPiece
vocabulary) and Adam at lr 1e-3 with 60 warmup steps, trained as long and as hard as the 6-layer
ModernBERT-tiny teacher of README's compression table: 1,200 steps, 30% masking (15% held out), no dropout,
lr constant until 1 - sqrt decay over the last 240. tiny.py's own recipe (600 steps, 15%, dropout 0.1) gives a
teacher too weak to transfer from (docs/performance.md, "Every row of the compression table").

  python -m bertjax.train --config=configs/ibbert_tiny.py --workdir=/tmp/bertjax-ibbert-tiny
  python -m bertjax.distill --config=configs/distill/mobilebert_tiny.py \
      --config.distill.teacher=/tmp/bertjax-ibbert-tiny --workdir=/tmp/bertjax-mobilebert-tiny-pkt

Measured on a 2-core CPU shared with other jobs: held-out masked-LM accuracy 29.3% (the most frequent token:
5.7%).
"""

from configs import tiny


def get_config():
    config = tiny.get_config()  # its data and optimizer; the run's length, masking and schedule below
    config.train.num_steps = 1200
    config.schedule.decay = "wsd"
    config.schedule.decay_steps = 240
    config.data.mask_rate = 0.3
    config.data.eval_mask_rate = 0.15
    config.data.max_predictions_per_seq = 40  # 30% of 128, rounded up
    m = config.model
    m.num_layers = 4  # the student's
    m.hidden_size = 128  # the feature map between layers: the student's
    m.num_heads = 2  # the student's, of intra_bottleneck_size / 2 = 128
    m.intermediate_size = 512
    m.block = "mobilebert"
    m.intra_bottleneck_size = 256  # inside each layer: wider than the feature map (the student's: 64)
    m.key_query_shared_bottleneck = True
    m.use_bottleneck_attention = False
    m.num_feedforward_networks = 1
    m.embedding_size = 64  # the student's embedding, copied into it
    m.trigram_input = True
    m.norm = "layernorm"
    m.activation = "gelu"
    m.pooler = "tanh"
    m.hidden_dropout_rate = 0.0
    m.attention_dropout_rate = 0.0
    return config
