"""RoBERTa (Liu et al. 2019) as a Hugging Face family: BERT's network, positions numbered from
padding_idx + 1, one segment, and no pooler in its masked-LM class.

Its own tokenizer (byte-level BPE: tokenizer.json, or vocab.json and merges.txt) runs as bertjax's bpe
tokenizer (BPETokenizer, bertjax/text/tokenizers.py), <s> A </s></s> B </s>; a RoBERTa trained by bertjax
exports its WordPiece vocab.txt, which is read back.
"""

from bertjax.interop import hf_bert, hf_family
from bertjax.interop.hf_family import Family, linear
from bertjax.models.config import BertConfig


def _from_hf(hf_config: dict) -> dict:
    hf_bert.check_absolute(hf_config, "RoBERTa")
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config.json has hidden_act={hf_config['hidden_act']!r}: bertjax RoBERTa uses 'gelu'")
    fields = hf_bert.fields_from_hf(hf_config, "RoBERTa")
    # HF numbers the real tokens from padding_idx + 1 (create_position_ids_from_input_ids).
    fields["position_offset"] = hf_config.get("pad_token_id", 1) + 1
    return fields


def _to_hf(cfg: BertConfig) -> dict:
    pad = cfg.position_offset - 1
    if pad < 0 or cfg.position_embedding != "learned" or cfg.pre_layer_norm or cfg.norm_placement != "post":
        raise ValueError("a RoBERTa checkpoint needs learned positions with model.position_offset >= 1 "
                         "(padding_idx + 1) and post-norm blocks")
    return {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], **hf_bert.fields_to_hf(cfg),
            "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": pad,
            "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True}


ROBERTA = Family(
    model_type="roberta",
    name="RoBERTa",
    architecture="RobertaForMaskedLM",
    base="roberta.",
    heads=("lm_head.",),
    table=(hf_family.embeddings("roberta.embeddings.")
           + hf_family.post_norm_block("roberta.encoder.layer.{i}.", "attention.self.", hf_bert.BLOCK_PARTS)
           + hf_family.mlm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")),
    tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    # RobertaModel's pooler is only in the multiple-choice class; the sequence classifier has its own
    # dense + tanh on <s> (classifier.dense), which computes what bertjax's pooler does, then out_proj.
    task_classes=hf_family.task_classes(
        "Roberta",
        sequence=linear("classifier.dense", "bert/pooler") + linear("classifier.out_proj", "classifier"),
        multiple_choice=linear("roberta.pooler.dense", "bert/pooler") + linear("classifier", "classifier"),
        span=linear("qa_outputs", "classifier"),
        tagging=linear("classifier", "classifier")),
    claims=lambda cfg: cfg.position_offset > 0,
    options=("position_offset",),
    masked_lm="RobertaForMaskedLM",
)
