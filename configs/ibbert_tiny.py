"""IB-BERT-Tiny: the teacher of MobileBERT-Tiny (configs/mobilebert_tiny.py) on the demo corpus, in minutes on a
CPU: its L=4 layers, H=128 between them and A=2 heads, each layer widened to W=256 inside (heads of 128), one
feed-forward network of 512, the student's 64-wide trigram word vectors; LayerNorm, GELU and a tanh pooler, as
IB-BERT-Large (configs/ibbert.py), at tiny.py's scale and recipe (600 steps of 32 x 128 tokens, Adam with
bias correction, lr 1e-3 with 60 warmup steps, an 8k WordPiece vocabulary).

  python -m bertjax.train --config=configs/ibbert_tiny.py --workdir=/tmp/bertjax-ibbert-tiny
  python -m bertjax.distill --config=configs/distill/mobilebert_tiny.py \
      --config.distill.teacher=/tmp/bertjax-ibbert-tiny --workdir=/tmp/bertjax-mobilebert-tiny-pkt

Measured on a 2-core CPU shared with other jobs: 14.5 min, held-out masked-LM accuracy 18.1% (the most frequent
token: 5.7%).
"""

from configs import tiny


def get_config():
    config = tiny.get_config()  # its data, optimizer, schedule and run length; the network below
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
    return config
