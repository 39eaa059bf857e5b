"""BERT (Devlin et al. 2018) as a Hugging Face family: BertForPreTraining and its task classes.

BERT is the encoder with every option at its default. Its config field names (`CONFIG_FIELDS`) and the
names of its block's parts (`BLOCK_PARTS`) are shared by RoBERTa and ALBERT, which start from them.
"""

from bertjax.interop import hf_family
from bertjax.interop.hf_family import HF_HEADS, Family, TaskClass, linear
from bertjax.models.config import BertConfig

# Hugging Face config field -> BertConfig field, with HF's own default where the field may be absent
# (None: the field is required, because no sensible default exists).
CONFIG_FIELDS = (
    ("vocab_size", "vocab_size", None),
    ("hidden_size", "hidden_size", None),
    ("num_hidden_layers", "num_layers", None),
    ("num_attention_heads", "num_heads", None),
    ("intermediate_size", "intermediate_size", None),
    ("max_position_embeddings", "max_position_embeddings", 512),
    ("type_vocab_size", "type_vocab_size", 2),
    ("hidden_dropout_prob", "hidden_dropout_rate", 0.1),
    ("attention_probs_dropout_prob", "attention_dropout_rate", 0.1),
    ("layer_norm_eps", "layer_norm_eps", 1e-12),
    ("initializer_range", "initializer_range", 0.02),
)

# HF's names for the parts of a block (hf_family.post_norm_block), BERT's and RoBERTa's.
BLOCK_PARTS = dict(query="query", key="key", value="value", output="attention.output.dense",
                   attention_norm="attention.output.LayerNorm", intermediate="intermediate.dense",
                   mlp_output="output.dense", mlp_norm="output.LayerNorm")


def fields_from_hf(hf_config: dict, family: str, defaults: dict | None = None) -> dict:
    """The BertConfig fields of CONFIG_FIELDS; `defaults` replace HF BERT's where the family's differ."""
    fields = {}
    for hf_name, name, default in CONFIG_FIELDS:
        default = (defaults or {}).get(hf_name, default)
        if hf_name not in hf_config and default is None:
            raise ValueError(f"config.json has no {hf_name!r}, which a {family} config must give")
        fields[name] = hf_config.get(hf_name, default)
    return fields


def fields_to_hf(cfg: BertConfig) -> dict:
    return {hf_name: getattr(cfg, name) for hf_name, name, _ in CONFIG_FIELDS}


def check_absolute(hf_config: dict, family: str):
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"config.json has position_embedding_type={position!r}: bertjax {family} has only "
                         "'absolute' (learned) position embeddings")


def _from_hf(hf_config: dict) -> dict:
    """Refuses what the network cannot reproduce rather than loading a subtly different model: a GELU
    other than the exact (erf) one, relative position embeddings."""
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"config.json has hidden_act={act!r}: bertjax BERT uses the exact (erf) GELU, "
                         "hidden_act='gelu'")
    check_absolute(hf_config, "BERT")
    return fields_from_hf(hf_config, "BERT")


def _to_hf(cfg: BertConfig) -> dict:
    return {"model_type": "bert", "architectures": ["BertForPreTraining"], **fields_to_hf(cfg),
            "hidden_act": "gelu", "position_embedding_type": "absolute",
            "pad_token_id": 0,  # BERT vocabularies put [PAD] at 0; HF uses it only to zero that row at init
            "tie_word_embeddings": True}  # the MLM decoder is the word-embedding matrix, as in bertjax


def _tf_norm_names(state: dict, cfg: BertConfig) -> dict:
    """Checkpoints converted from TensorFlow long ago name the LayerNorm parameters gamma/beta."""
    renamed, sources = {}, {}
    for name, x in state.items():
        new = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        if new in renamed:
            raise ValueError(f"HF tensors {sources[new]!r} and {name!r} are the same parameter under two names")
        renamed[new], sources[new] = x, name
    return renamed


_LAYER = "bert.encoder.layer.{i}."

BERT = Family(
    model_type="bert",
    name="BERT",
    architecture="BertForPreTraining",
    base="bert.",
    heads=("cls.",),
    table=(hf_family.embeddings("bert.embeddings.")
           + hf_family.post_norm_block(_LAYER, "attention.self.", BLOCK_PARTS)
           + linear("bert.pooler.dense", "bert/pooler")  # dense H -> H, tanh, on [CLS]
           + hf_family.mlm_head("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                "cls.predictions.bias")
           + linear("cls.seq_relationship", "nsp_head")),  # dense H -> 2 on the pooled output
    # Older transformers wrote the tied decoder out.
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    # The kinds' own records name BERT's classes (bertjax/tasks/kinds/): the pooler where the class reads
    # the pooled [CLS], then the head's dense layer.
    task_classes={kind: TaskClass(spec.architecture, (linear("bert.pooler.dense", "bert/pooler") if spec.pooler
                                                      else ()) + linear(spec.prefix, "classifier"))
                  for kind, spec in HF_HEADS.items()},
    claims=lambda cfg: not hf_family.changed_options(cfg),
    masked_lm="BertForMaskedLM",
    not_in_masked_lm=("bert.pooler.", "cls.seq_relationship."),
    to_table=_tf_norm_names,
    tokenizer_json=False,
)
