"""MobileBERT (Sun et al. 2020): the published google/mobilebert-uncased network. L=24 layers H=512 wide
between them, each working W=128 wide inside (A=4 heads of 32, four feed-forward networks of 512), 128-wide
word vectors seen as trigrams, NoNorm, ReLU, no pooler dense. 25M parameters, and 11.7M more in the
masked-LM decoder's own 384 x 30,522 columns (36.6M, as transformers' MobileBertForPreTraining counts them).

  python -m bertjax.train --config=configs/mobilebert.py --workdir=$WORKDIR
  python -m bertjax.train --config=configs/mobilebert.py --workdir=$WORKDIR --config.train.init_from=$HF_DIR

The model section is that checkpoint's config.json (bertjax.interop.hf_mobilebert converts it both ways),
so $HF_DIR, a download of google/mobilebert-uncased, starts the run from the published weights exactly.
The paper trains it by layer-wise knowledge transfer from an inverted-bottleneck BERT-Large teacher (LAMB,
batch 4,096); this file trains it on its own with BERT-Base's recipe (configs/base.py's: "adam" (default),
"adam_seq512"). Its layers' matmuls: about 5.1 GFLOPs a 128-token sequence forward, BERT-Base's 22.
With no corpus set this trains on the built-in demo corpus; for real pretraining set data.source.
"""

from configs import common


def get_config(recipe: str = "adam"):
    config = common.base_config()
    m = config.model
    m.num_layers = 24
    m.hidden_size = 512  # between layers
    m.num_heads = 4  # of intra_bottleneck_size / 4 = 32
    m.intermediate_size = 512  # 4 * intra_bottleneck_size
    m.vocab_size = 30522
    m.block = "mobilebert"
    m.intra_bottleneck_size = 128  # inside each layer
    m.key_query_shared_bottleneck = True  # queries and keys from a second bottleneck, values from the input
    m.use_bottleneck_attention = False
    m.num_feedforward_networks = 4
    m.embedding_size = 128
    m.trigram_input = True  # [next, token, previous] word vectors (3 x 128) projected to 512
    m.norm = "no_norm"  # x * scale + bias: no mean or variance to compute
    m.activation = "relu"
    m.pooler = "first"  # classifier_activation false: the first token's state as it is
    m.hidden_dropout_rate = 0.0  # the published config's; attention dropout stays 0.1
    return common.apply_recipe(config, common.DEVLIN_RECIPES, recipe, "configs/mobilebert.py")
