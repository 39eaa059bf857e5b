"""ALBERT (Lan et al. 2020) as a Hugging Face family: factorised embeddings E -> H, groups of layers
sharing their parameters, the tanh GELU, and a sentence-order head where BERT has NSP.

Its tokenizer is SentencePiece (spiece.model): bertjax reads one that has bertjax's special pieces
([PAD] [UNK] [CLS] [SEP] [MASK], as `python -m bertjax.vocab train --kind=sentencepiece` makes them),
and a WordPiece vocab.txt before it where both are there.
"""

from bertjax.interop import hf_bert, hf_family
from bertjax.interop.hf_family import COPY, LINEAR, Family, linear
from bertjax.models.config import BertConfig

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu": "gelu"}  # HF's hidden_act -> model.activation


def _from_hf(hf_config: dict) -> dict:
    hf_bert.check_absolute(hf_config, "ALBERT")
    act = hf_config.get("hidden_act", "gelu_new")
    if act not in _ACTIVATIONS or hf_config.get("inner_group_num", 1) != 1:
        raise ValueError(f"config.json has hidden_act={act!r}, inner_group_num={hf_config.get('inner_group_num')}: "
                         f"bertjax ALBERT has hidden_act in {sorted(_ACTIVATIONS)} and inner_group_num 1")
    fields = hf_bert.fields_from_hf(hf_config, "ALBERT", {
        "intermediate_size": 16384, "hidden_size": 4096, "num_attention_heads": 64, "num_hidden_layers": 12,
        "vocab_size": 30000})
    fields.update(activation=_ACTIVATIONS[act], embedding_size=hf_config.get("embedding_size", 128),
                  num_hidden_groups=hf_config.get("num_hidden_groups", 1))
    return fields


def _to_hf(cfg: BertConfig) -> dict:
    if cfg.activation not in ("gelu", "gelu_tanh") or cfg.position_embedding != "learned" or cfg.position_offset:
        raise ValueError("an ALBERT checkpoint needs model.activation gelu or gelu_tanh and learned positions from 0")
    act = {v: k for k, v in _ACTIVATIONS.items()}[cfg.activation]
    return {"model_type": "albert", "architectures": ["AlbertForPreTraining"], **hf_bert.fields_to_hf(cfg),
            "hidden_act": act, "embedding_size": cfg.embedding_width, "num_hidden_groups": cfg.num_groups,
            "inner_group_num": 1, "position_embedding_type": "absolute", "pad_token_id": 0, "bos_token_id": 2,
            "eos_token_id": 3, "tie_word_embeddings": True}


_PARTS = dict(query="query", key="key", value="value", output="attention.dense",
              attention_norm="attention.LayerNorm", intermediate="ffn", mlp_output="ffn_output",
              mlp_norm="full_layer_layer_norm")

ALBERT = Family(
    model_type="albert",
    name="ALBERT",
    architecture="AlbertForPreTraining",
    base="albert.",
    heads=("predictions.", "sop_classifier."),
    table=(hf_family.embeddings("albert.embeddings.")
           + (("albert.encoder.embedding_hidden_mapping_in.weight", "bert/embeddings/projection/kernel", LINEAR),
              ("albert.encoder.embedding_hidden_mapping_in.bias", "bert/embeddings/projection/bias", COPY))
           # {i} is the group: layers i*L/G ... (i+1)*L/G - 1 run it (bertjax's layers_{i}).
           + hf_family.post_norm_block("albert.encoder.albert_layer_groups.{i}.albert_layers.0.", "attention.",
                                       _PARTS)
           + linear("albert.pooler", "bert/pooler")
           + hf_family.mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
           + linear("sop_classifier.classifier", "nsp_head")),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    # AlbertModel's pooler (a Linear named albert.pooler) in the pooled classes; none per token.
    task_classes=hf_family.task_classes(
        "Albert",
        sequence=linear("albert.pooler", "bert/pooler") + linear("classifier", "classifier"),
        multiple_choice=linear("albert.pooler", "bert/pooler") + linear("classifier", "classifier"),
        span=linear("qa_outputs", "classifier"),
        tagging=linear("classifier", "classifier")),
    # ELECTRA's factorised embeddings come with its own pooler (hf_electra).
    # MobileBERT's block comes with factorised embeddings of its own (hf_mobilebert).
    claims=lambda cfg: cfg.pooler != "gelu" and cfg.block == "bert" and bool(
        cfg.embedding_size or cfg.num_hidden_groups or cfg.activation == "gelu_tanh"),
    options=("embedding_size", "num_hidden_groups", "activation"),
    tokenizer_files=(("vocab.txt", "wordpiece"), ("spiece.model", "sentencepiece")),
    masked_lm="AlbertForMaskedLM",  # AlbertModel without its pooler, no sentence-order head
    not_in_masked_lm=("albert.pooler.", "sop_classifier."),
    # ALBERT's classifiers drop out at classifier_dropout_prob (default 0.1); bertjax's heads at the hidden rate.
    task_config=lambda cfg: {"classifier_dropout_prob": cfg.hidden_dropout_rate},
)
