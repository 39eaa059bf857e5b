"""IB-BERT-Large (Sun et al. 2020, "MobileBERT", Table 1): the inverted-bottleneck BERT-Large that teaches
MobileBERT (configs/mobilebert.py) by progressive knowledge transfer (configs/distill/mobilebert.py). L=24
layers with 512-wide feature maps between them, each widened to 1024 inside (an inverted bottleneck), A=4
heads of 256, one feed-forward network of 4096, 128-wide word vectors seen as trigrams; LayerNorm and GELU,
as BERT (the published teacher config, google-research/mobilebert's uncased_L-24_H-1024_B-512_A-4.json).

  python -m bertjax.train --config=configs/ibbert.py --workdir=$TEACHER
  python -m bertjax.distill --config=configs/distill/mobilebert.py --config.distill.teacher=$TEACHER \
      --workdir=$WORKDIR

Its feature maps (hidden_size 512), layers and heads are the student's: layer l of each is compared with
layer l of the other. One difference from the published teacher, whose attention reads queries, keys and
values from the 512-wide input and projects them to 1024: bertjax's block attends over the H-wide input
only through a bottleneck, so here queries and keys read a 512 -> 1024 bottleneck of it (as the student's
read theirs, key_query_shared_bottleneck) and values the input itself. The recipe is BERT-Large's
(configs/large.py's "adam", "adam_seq512"). With no corpus set this trains on the built-in demo corpus;
for real pretraining set data.source.
"""

from configs import common


def get_config(recipe: str = "adam"):
    config = common.base_config()
    m = config.model
    m.num_layers = 24
    m.hidden_size = 512  # the feature map between layers: the student's
    m.num_heads = 4  # of intra_bottleneck_size / 4 = 256
    m.intermediate_size = 4096
    m.vocab_size = 30522
    m.block = "mobilebert"
    m.intra_bottleneck_size = 1024  # inside each layer: the inverted bottleneck
    m.key_query_shared_bottleneck = True  # queries and keys from a bottleneck of the input, values from it
    m.use_bottleneck_attention = False
    m.num_feedforward_networks = 1
    m.embedding_size = 128  # the student's embedding, copied into it
    m.trigram_input = True
    m.norm = "layernorm"
    m.activation = "gelu"
    m.pooler = "tanh"  # classifier_activation, the published default
    m.scan_layers = True  # 24 blocks compiled once, as configs/large.py
    m.remat_policy = "save_named"
    return common.apply_recipe(config, common.DEVLIN_RECIPES, recipe, "configs/ibbert.py")
