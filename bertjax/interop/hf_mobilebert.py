"""MobileBERT (Sun et al. 2020) as a Hugging Face family: MobileBertForPreTraining and its task classes, the
encoder with model.block="mobilebert" (bertjax/models/mobilebert.py).

What its tables add to BERT's: the embedding's projection of the (trigram) word vectors, each layer's
bottlenecks and extra feed-forward networks ({j}), and the masked-LM decoder's own H - E columns, which
transformers keeps as a Linear(V, H - E) whose weight [H - E, V] is the transpose of bertjax's [V, H - E].
Its pooler is a tanh dense with classifier_activation, else the first token as it is (model.pooler="first",
no params). Its tokenizer is BERT's WordPiece (vocab.txt).
"""

import numpy as np

from bertjax.interop import hf_bert, hf_family
from bertjax.interop.hf_family import COPY, LINEAR, Family, linear
from bertjax.models.config import BertConfig
from bertjax.models.layers import projects_words

_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh"}  # HF's hidden_act -> model.activation
_NORMS = {"no_norm": "no_norm", "layer_norm": "layernorm"}  # HF's normalization_type -> model.norm
# MobileBertConfig's defaults (the published google/mobilebert-uncased shape) where config.json lacks a field.
_DEFAULTS = {"vocab_size": 30522, "hidden_size": 512, "num_hidden_layers": 24, "num_attention_heads": 4,
             "intermediate_size": 512, "hidden_dropout_prob": 0.0}


def _from_hf(hf_config: dict) -> dict:
    act, norm = hf_config.get("hidden_act", "relu"), hf_config.get("normalization_type", "no_norm")
    if act not in _ACTIVATIONS or norm not in _NORMS:
        raise ValueError(f"config.json has hidden_act={act!r}, normalization_type={norm!r}: bertjax MobileBERT has "
                         f"hidden_act in {sorted(_ACTIVATIONS)} and normalization_type in {sorted(_NORMS)}")
    fields = hf_bert.fields_from_hf(hf_config, "MobileBERT", _DEFAULTS)
    embedding = hf_config.get("embedding_size", 128)
    bottleneck = hf_config.get("use_bottleneck", True)
    # transformers reads the shared and the bottleneck attention only with a bottleneck; the bottleneck
    # attention wins where both are set (its shared bottleneck then goes unused).
    attention = bottleneck and hf_config.get("use_bottleneck_attention", False)
    fields.update(block="mobilebert", activation=_ACTIVATIONS[act], norm=_NORMS[norm],
                  embedding_size=0 if embedding == fields["hidden_size"] else embedding,
                  trigram_input=hf_config.get("trigram_input", True),
                  intra_bottleneck_size=hf_config.get("intra_bottleneck_size", 128) if bottleneck else 0,
                  key_query_shared_bottleneck=bool(bottleneck and not attention
                                                   and hf_config.get("key_query_shared_bottleneck", True)),
                  use_bottleneck_attention=bool(attention),
                  num_feedforward_networks=hf_config.get("num_feedforward_networks", 4),
                  pooler="tanh" if hf_config.get("classifier_activation", True) else "first")
    return fields


def _to_hf(cfg: BertConfig) -> dict:
    if (cfg.block != "mobilebert" or cfg.activation not in ("relu", "gelu", "gelu_tanh") or cfg.norm == "rmsnorm"
            or cfg.pooler not in ("tanh", "first") or cfg.position_offset or not cfg.use_bias):
        raise ValueError("a MobileBERT checkpoint needs model.block='mobilebert', activation relu, gelu or "
                         "gelu_tanh, norm no_norm or layernorm, pooler tanh or first, positions from 0 and biases")
    return {"model_type": "mobilebert", "architectures": ["MobileBertForPreTraining"], **hf_bert.fields_to_hf(cfg),
            "hidden_act": {v: k for k, v in _ACTIVATIONS.items()}[cfg.activation],
            "normalization_type": {v: k for k, v in _NORMS.items()}[cfg.norm],
            "embedding_size": cfg.embedding_width, "trigram_input": cfg.trigram_input,
            "use_bottleneck": bool(cfg.intra_bottleneck_size), "intra_bottleneck_size": cfg.true_hidden_size,
            "true_hidden_size": cfg.true_hidden_size, "key_query_shared_bottleneck": cfg.key_query_shared_bottleneck,
            "use_bottleneck_attention": cfg.use_bottleneck_attention,
            "num_feedforward_networks": cfg.num_feedforward_networks,
            "classifier_activation": cfg.pooler == "tanh", "pad_token_id": 0, "tie_word_embeddings": True}


_PROJECTION = "mobilebert.embeddings.embedding_transformation."


def _drop_unused_projection(state: dict, cfg: BertConfig) -> dict:
    """transformers builds the embedding's projection even where it does not use it (E = H without trigrams),
    and bertjax has none there: left out of what is read."""
    unused = "embeddings.embedding_transformation."  # a bare encoder's names lack the "mobilebert." prefix
    return state if projects_words(cfg) else {k: v for k, v in state.items() if unused not in k}


def _add_unused_projection(state: dict, cfg: BertConfig) -> dict:
    """The unused projection written as zeros, so that transformers loads an export with nothing missing."""
    if projects_words(cfg) or not any(name.startswith("mobilebert.embeddings.") for name in state):
        return state
    dtype = state["mobilebert.embeddings.word_embeddings.weight"].dtype
    return {**state, f"{_PROJECTION}weight": np.zeros((cfg.hidden_size, cfg.embedding_width), dtype),
            f"{_PROJECTION}bias": np.zeros((cfg.hidden_size,), dtype)}


def _norm(hf_prefix: str, path: str) -> tuple:
    """A norm's rows: LayerNorm or NoNorm, both weight and bias."""
    return ((f"{hf_prefix}.weight", f"{path}/scale", COPY), (f"{hf_prefix}.bias", f"{path}/bias", COPY))


def _layer(hf: str) -> tuple:
    """The rows of a MobileBERT layer; those whose path a config lacks (the bottlenecks without one, the
    shared bottleneck without key_query_shared_bottleneck) are left out by the conversion."""
    bj = "bert/encoder/layers_{i}/"
    rows = hf_family.post_norm_block(hf, "attention.self.", hf_bert.BLOCK_PARTS)  # attention, the last FFN
    rows += linear(f"{hf}output.bottleneck.dense", f"{bj}output_bottleneck")
    rows += _norm(f"{hf}output.bottleneck.LayerNorm", f"{bj}output_bottleneck_layer_norm")
    for part in ("input", "attention"):
        rows += linear(f"{hf}bottleneck.{part}.dense", f"{bj}bottleneck_{part}")
        rows += _norm(f"{hf}bottleneck.{part}.LayerNorm", f"{bj}bottleneck_{part}_layer_norm")
    return (rows + linear(f"{hf}ffn.{{j}}.intermediate.dense", f"{bj}mlp_{{j}}/intermediate")
            + linear(f"{hf}ffn.{{j}}.output.dense", f"{bj}mlp_{{j}}/output")
            + _norm(f"{hf}ffn.{{j}}.output.LayerNorm", f"{bj}mlp_{{j}}_layer_norm"))


_POOLER = linear("mobilebert.pooler.dense", "bert/pooler")  # only with classifier_activation (model.pooler tanh)

MOBILEBERT = Family(
    model_type="mobilebert",
    name="MobileBERT",
    architecture="MobileBertForPreTraining",
    base="mobilebert.",
    heads=("cls.",),
    table=(hf_family.embeddings("mobilebert.embeddings.")
           + linear("mobilebert.embeddings.embedding_transformation", "bert/embeddings/word_projection")
           + _layer("mobilebert.encoder.layer.{i}.")
           + _POOLER
           + hf_family.mlm_head("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                "cls.predictions.bias")
           + (("cls.predictions.dense.weight", "mlm_head/decoder_extension", LINEAR),)
           + linear("cls.seq_relationship", "nsp_head")),
    tied={"cls.predictions.decoder.weight": "mobilebert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    # MobileBertModel's pooler in the pooled classes; the per-token ones are built without it.
    task_classes=hf_family.task_classes(
        "MobileBert",
        sequence=_POOLER + linear("classifier", "classifier"),
        multiple_choice=_POOLER + linear("classifier", "classifier"),
        span=linear("qa_outputs", "classifier"),
        tagging=linear("classifier", "classifier")),
    claims=lambda cfg: cfg.block == "mobilebert",
    options=("block", "embedding_size", "trigram_input", "intra_bottleneck_size", "key_query_shared_bottleneck",
             "use_bottleneck_attention", "num_feedforward_networks", "norm", "activation", "pooler"),
    masked_lm="MobileBertForMaskedLM",  # MobileBertModel without its pooler, no next-sentence head
    not_in_masked_lm=("mobilebert.pooler.", "cls.seq_relationship."),
    to_table=_drop_unused_projection,
    from_table=_add_unused_projection,
    poolers=("tanh", "first"),
    task_config=lambda cfg: {"classifier_dropout": cfg.hidden_dropout_rate},
)
