"""MobileBERT-Tiny: MobileBERT's network at L=4, H=128 between layers, W=64 inside (A=2 heads of 32, two
feed-forward networks of 128), 64-wide word vectors as trigrams, on the demo corpus in minutes on a CPU.

  python -m bertjax.train --config=configs/mobilebert_tiny.py --workdir=/tmp/bertjax-mobilebert-tiny

As configs/mobilebert.py (bottlenecks with a shared query/key bottleneck, NoNorm, ReLU, no pooler dense,
MLM + NSP) at tiny.py's scale and recipe: 600 steps of 32 x 128 tokens, Adam with bias correction, lr 1e-3
with 60 warmup steps, an 8k WordPiece vocabulary. About 0.57 M multiply-adds a token forward (the encoder's
layers 0.31 M): the class of the TinyBERT student of configs/distill/tinybert_tiny.py (0.20 M; 0.10 M) and of
BERT-Tiny (0.63 M; 0.39 M), twice as deep as either. Expected: held-out masked-LM accuracy well above the
most-frequent-token baseline, as tiny.py's.
"""

from configs import tiny


def get_config():
    config = tiny.get_config()  # its data, optimizer, schedule and run length; the network below
    m = config.model
    m.num_layers = 4
    m.hidden_size = 128  # between layers
    m.num_heads = 2  # of intra_bottleneck_size / 2 = 32
    m.intermediate_size = 128  # 2 * intra_bottleneck_size
    m.block = "mobilebert"
    m.intra_bottleneck_size = 64  # inside each layer
    m.key_query_shared_bottleneck = True
    m.use_bottleneck_attention = False
    m.num_feedforward_networks = 2
    m.embedding_size = 64
    m.trigram_input = True
    m.norm = "no_norm"
    m.activation = "relu"
    m.pooler = "first"
    m.hidden_dropout_rate = 0.0  # as the published config
    return config
