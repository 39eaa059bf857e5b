"""Hugging Face RoBERTa, ALBERT and ModernBERT checkpoints <-> bertjax params, in both directions.

Each family is the BERT encoder with options (models/bert.py BertConfig) and a `Family` record here: its
config translation and its name table, rows (HF name, bertjax path, transform) as hf.TABLE's. The
conversion itself is hf.py's table-driven core (shape checks, dtype, fresh params, scan layout), run
on the family's table; only what a table cannot say is added per family: the names tied to other
tensors, and ModernBERT's fused q/k/v tensor, split into three table rows before the table is read
and joined after it is written.

Rows with {i} repeat for every parameter group of the stack (a layer, or ALBERT's shared group); a row
whose bertjax path the config does not have (ModernBERT's layer 0 attention norm, biases when
use_bias=False) is left out. bertjax params with no row (the pooler and NSP head of families whose HF
class has none) are freshly initialised on load and not written.

Task heads (bertjax/models/heads.py) map to each family's task classes (RobertaForSequenceClassification,
AlbertForQuestionAnswering, ModernBertForTokenClassification, ...): the encoder's rows of the table plus
the head's own rows per kind (`TaskClass`), through the same core and hf.py's label config.

Shape legend: as in hf.py (H hidden, N heads, D head size, F feed-forward, V vocabulary, E embedding).
"""

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np

from bertjax.compression import pruning
from bertjax.interop import hf, hf_files
from bertjax.models import bert as bert_model
from bertjax.models import heads

log = logging.getLogger(__name__)

COPY, LINEAR = hf.COPY, hf.LINEAR
QKV_KERNEL, QKV_BIAS, ATTENTION_OUT_KERNEL = hf.QKV_KERNEL, hf.QKV_BIAS, hf.ATTENTION_OUT_KERNEL


@dataclasses.dataclass(frozen=True)
class TaskClass:
    """A task kind's transformers class in one family and the rows of its head: the pooler's where the
    class has one, then the classifier's (bertjax's `classifier`), as Family.table's rows."""

    architecture: str  # e.g. "RobertaForSequenceClassification"
    rows: tuple  # (HF name, bertjax path, transform)

    @property
    def pooler(self) -> bool:
        """Whether the class has bertjax's pooler; where not, bertjax computes it unused (nor written)."""
        return any(path.startswith("bert/pooler") for _, path, _ in self.rows)


@dataclasses.dataclass(frozen=True)
class Family:
    """What differs between the families' HF checkpoints; the conversion is the same for all."""

    model_type: str  # config.json's model_type
    architecture: str  # the transformers class written (and read whole)
    base: str  # the encoder's prefix in that class ("roberta."): a bare encoder checkpoint lacks it
    heads: tuple  # prefixes of the head tensors (not under `base`)
    table: tuple  # (HF name, bertjax path, transform); {i}: each parameter group
    tied: dict  # HF name -> the HF name it is a copy of (accepted if equal, never written)
    config_from_hf: Callable[[dict], dict]  # config.json -> BertConfig fields
    config_to_hf: Callable[[bert_model.BertConfig], dict]  # BertConfig -> config.json
    task_classes: dict  # task kind (hf.HF_HEADS) -> TaskClass
    split: Callable[[dict, bert_model.BertConfig], dict] = lambda state, cfg: state  # HF -> table names
    join: Callable[[dict, bert_model.BertConfig], dict] = lambda state, cfg: state  # table names -> HF
    pooler: str = "tanh"  # the model.pooler its task classes compute (bert_model.POOLERS)
    task_config: Callable[[bert_model.BertConfig], dict] = lambda cfg: {}  # a task class's config.json fields


def _linear(hf_prefix: str, path: str) -> tuple:
    """The rows of a torch Linear (<hf_prefix>.weight [out, in], .bias) <-> a flax Dense (<path>/kernel, /bias)."""
    return ((f"{hf_prefix}.weight", f"{path}/kernel", LINEAR), (f"{hf_prefix}.bias", f"{path}/bias", COPY))


def _task_classes(model: str, *, sequence: tuple, multiple_choice: tuple, span: tuple, tagging: tuple) -> dict:
    """kind -> TaskClass, given each class's head rows; transformers names a family's task classes as
    BERT's, <Model>For<Task>."""
    return {"classification": TaskClass(f"{model}ForSequenceClassification", sequence),
            "regression": TaskClass(f"{model}ForSequenceClassification", sequence),
            "multiple_choice": TaskClass(f"{model}ForMultipleChoice", multiple_choice),
            "span": TaskClass(f"{model}ForQuestionAnswering", span),
            "tagging": TaskClass(f"{model}ForTokenClassification", tagging)}


def _bert_fields(hf_config: dict, defaults: dict) -> dict:
    """The BERT-named fields (hf._CONFIG_FIELDS) that RoBERTa and ALBERT configs share."""
    fields = {}
    for hf_name, name, default in hf._CONFIG_FIELDS:
        default = defaults.get(hf_name, default)
        if hf_name not in hf_config and default is None:
            raise ValueError(f"config.json has no {hf_name!r}, which the model must give")
        fields[name] = hf_config.get(hf_name, default)
    return fields


def _bert_config(cfg: bert_model.BertConfig) -> dict:
    return {hf_name: getattr(cfg, name) for hf_name, name, _ in hf._CONFIG_FIELDS}


def _check_absolute(hf_config: dict, family: str):
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"config.json has position_embedding_type={position!r}: bertjax {family} has only "
                         "'absolute' (learned) position embeddings")


# --------------------------------------------------------------------------------------------------
# RoBERTa (Liu et al. 2019): BERT's network, positions from padding_idx + 1, one segment, no pooler.
# --------------------------------------------------------------------------------------------------


def _roberta_from_hf(hf_config: dict) -> dict:
    _check_absolute(hf_config, "RoBERTa")
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config.json has hidden_act={hf_config['hidden_act']!r}: bertjax RoBERTa uses 'gelu'")
    fields = _bert_fields(hf_config, {})
    # HF numbers the real tokens from padding_idx + 1 (create_position_ids_from_input_ids).
    fields["position_offset"] = hf_config.get("pad_token_id", 1) + 1
    return fields


def _roberta_to_hf(cfg: bert_model.BertConfig) -> dict:
    pad = cfg.position_offset - 1
    if pad < 0 or cfg.position_embedding != "learned" or cfg.pre_layer_norm or cfg.norm_placement != "post":
        raise ValueError("a RoBERTa checkpoint needs learned positions with model.position_offset >= 1 "
                         "(padding_idx + 1) and post-norm blocks")
    return {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], **_bert_config(cfg),
            "hidden_act": "gelu", "position_embedding_type": "absolute", "pad_token_id": pad,
            "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True}


def _bert_layer(hf_layer: str, attention: str, names: dict) -> tuple:
    """The rows of a BERT-style post-LN block under HF's names for its parts (RoBERTa, ALBERT)."""
    bj = "bert/encoder/layers_{i}/"
    rows = []
    for part in ("query", "key", "value"):
        rows += [(f"{hf_layer}{attention}{names[part]}.weight", f"{bj}attention/{part}/kernel", QKV_KERNEL),
                 (f"{hf_layer}{attention}{names[part]}.bias", f"{bj}attention/{part}/bias", QKV_BIAS)]
    return tuple(rows) + (
        (f"{hf_layer}{names['output']}.weight", f"{bj}attention/output/kernel", ATTENTION_OUT_KERNEL),
        (f"{hf_layer}{names['output']}.bias", f"{bj}attention/output/bias", COPY),
        (f"{hf_layer}{names['attention_norm']}.weight", f"{bj}attention_layer_norm/scale", COPY),
        (f"{hf_layer}{names['attention_norm']}.bias", f"{bj}attention_layer_norm/bias", COPY),
        (f"{hf_layer}{names['intermediate']}.weight", f"{bj}mlp/intermediate/kernel", LINEAR),
        (f"{hf_layer}{names['intermediate']}.bias", f"{bj}mlp/intermediate/bias", COPY),
        (f"{hf_layer}{names['mlp_output']}.weight", f"{bj}mlp/output/kernel", LINEAR),
        (f"{hf_layer}{names['mlp_output']}.bias", f"{bj}mlp/output/bias", COPY),
        (f"{hf_layer}{names['mlp_norm']}.weight", f"{bj}mlp_layer_norm/scale", COPY),
        (f"{hf_layer}{names['mlp_norm']}.bias", f"{bj}mlp_layer_norm/bias", COPY),
    )


def _embeddings(prefix: str, word: str = "word_embeddings", norm: str = "LayerNorm") -> tuple:
    bj = "bert/embeddings/"
    return (
        (f"{prefix}{word}.weight", bj + "word_embeddings/embedding", COPY),
        (f"{prefix}position_embeddings.weight", bj + "position_embeddings/embedding", COPY),
        (f"{prefix}token_type_embeddings.weight", bj + "token_type_embeddings/embedding", COPY),
        (f"{prefix}{norm}.weight", bj + "layer_norm/scale", COPY),
        (f"{prefix}{norm}.bias", bj + "layer_norm/bias", COPY),
    )


def _mlm_head(dense: str, norm: str, bias: str) -> tuple:
    return (
        (f"{dense}.weight", "mlm_head/transform/kernel", LINEAR),
        (f"{dense}.bias", "mlm_head/transform/bias", COPY),
        (f"{norm}.weight", "mlm_head/layer_norm/scale", COPY),
        (f"{norm}.bias", "mlm_head/layer_norm/bias", COPY),
        (bias, "mlm_head/output_bias", COPY),
    )


_BERT_PARTS = dict(query="query", key="key", value="value", output="attention.output.dense",
                   attention_norm="attention.output.LayerNorm", intermediate="intermediate.dense",
                   mlp_output="output.dense", mlp_norm="output.LayerNorm")

ROBERTA = Family(
    model_type="roberta",
    architecture="RobertaForMaskedLM",
    base="roberta.",
    heads=("lm_head.",),
    table=(_embeddings("roberta.embeddings.")
           + _bert_layer("roberta.encoder.layer.{i}.", "attention.self.", _BERT_PARTS)
           + _mlm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")),
    tied={"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"},
    config_from_hf=_roberta_from_hf,
    config_to_hf=_roberta_to_hf,
    # RobertaModel's pooler is only in the multiple-choice class; the sequence classifier has its own
    # dense + tanh on <s> (classifier.dense), which computes what bertjax's pooler does, then out_proj.
    task_classes=_task_classes(
        "Roberta",
        sequence=_linear("classifier.dense", "bert/pooler") + _linear("classifier.out_proj", "classifier"),
        multiple_choice=_linear("roberta.pooler.dense", "bert/pooler") + _linear("classifier", "classifier"),
        span=_linear("qa_outputs", "classifier"),
        tagging=_linear("classifier", "classifier")),
)


# --------------------------------------------------------------------------------------------------
# ALBERT (Lan et al. 2020): factorised embeddings E -> H, groups of shared layers, SOP head.
# --------------------------------------------------------------------------------------------------

_ALBERT_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu": "gelu"}


def _albert_from_hf(hf_config: dict) -> dict:
    _check_absolute(hf_config, "ALBERT")
    act = hf_config.get("hidden_act", "gelu_new")
    if act not in _ALBERT_ACTIVATIONS or hf_config.get("inner_group_num", 1) != 1:
        raise ValueError(f"config.json has hidden_act={act!r}, inner_group_num={hf_config.get('inner_group_num')}: "
                         f"bertjax ALBERT has hidden_act in {sorted(_ALBERT_ACTIVATIONS)} and inner_group_num 1")
    fields = _bert_fields(hf_config, {"intermediate_size": 16384, "hidden_size": 4096, "num_attention_heads": 64,
                                      "num_hidden_layers": 12, "vocab_size": 30000})
    fields.update(activation=_ALBERT_ACTIVATIONS[act], embedding_size=hf_config.get("embedding_size", 128),
                  num_hidden_groups=hf_config.get("num_hidden_groups", 1))
    return fields


def _albert_to_hf(cfg: bert_model.BertConfig) -> dict:
    if cfg.activation not in ("gelu", "gelu_tanh") or cfg.position_embedding != "learned" or cfg.position_offset:
        raise ValueError("an ALBERT checkpoint needs model.activation gelu or gelu_tanh and learned positions from 0")
    act = {v: k for k, v in _ALBERT_ACTIVATIONS.items()}[cfg.activation]
    return {"model_type": "albert", "architectures": ["AlbertForPreTraining"], **_bert_config(cfg),
            "hidden_act": act, "embedding_size": cfg.embedding_width, "num_hidden_groups": cfg.num_groups,
            "inner_group_num": 1, "position_embedding_type": "absolute", "pad_token_id": 0, "bos_token_id": 2,
            "eos_token_id": 3, "tie_word_embeddings": True}


_ALBERT_PARTS = dict(query="query", key="key", value="value", output="attention.dense",
                     attention_norm="attention.LayerNorm", intermediate="ffn", mlp_output="ffn_output",
                     mlp_norm="full_layer_layer_norm")

ALBERT = Family(
    model_type="albert",
    architecture="AlbertForPreTraining",
    base="albert.",
    heads=("predictions.", "sop_classifier."),
    table=(_embeddings("albert.embeddings.")
           + (("albert.encoder.embedding_hidden_mapping_in.weight", "bert/embeddings/projection/kernel", LINEAR),
              ("albert.encoder.embedding_hidden_mapping_in.bias", "bert/embeddings/projection/bias", COPY))
           # {i} is the group: layers i*L/G ... (i+1)*L/G - 1 run it (bertjax's layers_{i}).
           + _bert_layer("albert.encoder.albert_layer_groups.{i}.albert_layers.0.", "attention.", _ALBERT_PARTS)
           + (("albert.pooler.weight", "bert/pooler/kernel", LINEAR), ("albert.pooler.bias", "bert/pooler/bias", COPY))
           + _mlm_head("predictions.dense", "predictions.LayerNorm", "predictions.bias")
           + (("sop_classifier.classifier.weight", "nsp_head/kernel", LINEAR),
              ("sop_classifier.classifier.bias", "nsp_head/bias", COPY))),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    config_from_hf=_albert_from_hf,
    config_to_hf=_albert_to_hf,
    # AlbertModel's pooler (a Linear named albert.pooler) in the pooled classes; none per token.
    task_classes=_task_classes(
        "Albert",
        sequence=_linear("albert.pooler", "bert/pooler") + _linear("classifier", "classifier"),
        multiple_choice=_linear("albert.pooler", "bert/pooler") + _linear("classifier", "classifier"),
        span=_linear("qa_outputs", "classifier"),
        tagging=_linear("classifier", "classifier")),
    # ALBERT's classifiers drop out at classifier_dropout_prob (default 0.1); bertjax's heads at the hidden rate.
    task_config=lambda cfg: {"classifier_dropout_prob": cfg.hidden_dropout_rate},
)


# --------------------------------------------------------------------------------------------------
# ModernBERT (Warner et al. 2024): pre-norm, RoPE, GeGLU, no biases, alternating local/global attention.
# --------------------------------------------------------------------------------------------------


def _global_every(hf_config: dict) -> int:
    """global_attn_every_n_layers, or (transformers 5) the n that config.json's layer_types follow."""
    types = hf_config.get("layer_types")
    if not types:
        return hf_config.get("global_attn_every_n_layers", 3)
    every = next((i for i, t in enumerate(types) if i and t == "full_attention"), len(types))
    if types != ["full_attention" if i % every == 0 else "sliding_attention" for i in range(len(types))]:
        raise ValueError(f"config.json has layer_types={types}: bertjax has global layers at i % n == 0 only")
    return every


def _rope_theta(hf_config: dict, layer_type: str, old_key: str, default: float) -> float:
    rope = (hf_config.get("rope_parameters") or {}).get(layer_type) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"config.json has rope_type={rope['rope_type']!r}: bertjax has the default RoPE only")
    return float(rope.get("rope_theta", hf_config.get(old_key, default)))


def _modernbert_from_hf(hf_config: dict) -> dict:
    biases = {k: hf_config.get(k, d) for k, d in (("norm_bias", False), ("attention_bias", False),
                                                  ("mlp_bias", False), ("classifier_bias", False))}
    acts = {k: hf_config.get(k, "gelu") for k in ("hidden_activation", "classifier_activation")}
    if len(set(biases.values())) != 1 or set(acts.values()) != {"gelu"} or not hf_config.get("decoder_bias", True):
        raise ValueError(f"config.json has {biases}, {acts}, decoder_bias={hf_config.get('decoder_bias')}: bertjax "
                         "ModernBERT has one bias switch for all, 'gelu' activations and a decoder bias")
    return dict(vocab_size=hf_config["vocab_size"], hidden_size=hf_config["hidden_size"],
                num_layers=hf_config["num_hidden_layers"], num_heads=hf_config["num_attention_heads"],
                intermediate_size=hf_config["intermediate_size"],
                max_position_embeddings=hf_config.get("max_position_embeddings", 8192), type_vocab_size=0,
                layer_norm_eps=hf_config.get("norm_eps", 1e-5),
                initializer_range=hf_config.get("initializer_range", 0.02),
                hidden_dropout_rate=hf_config.get("mlp_dropout", 0.0),
                attention_dropout_rate=hf_config.get("attention_dropout", 0.0),
                position_embedding="rotary", activation="geglu", norm_placement="pre",
                use_bias=biases["norm_bias"],
                rotary_theta=_rope_theta(hf_config, "sliding_attention", "local_rope_theta", 10000.0),
                global_rotary_theta=_rope_theta(hf_config, "full_attention", "global_rope_theta", 160000.0),
                local_attention_window=hf_config.get("local_attention", 128),
                global_attention_every=_global_every(hf_config), pooler="gelu_norm")


def _modernbert_to_hf(cfg: bert_model.BertConfig) -> dict:
    if (cfg.position_embedding, cfg.activation, cfg.norm_placement, cfg.type_vocab_size) != ("rotary", "geglu", "pre", 0):
        raise ValueError("a ModernBERT checkpoint needs model.position_embedding='rotary', activation='geglu', "
                         "norm_placement='pre' and type_vocab_size=0")
    layer_types = ["sliding_attention" if cfg.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
    global_theta = cfg.global_rotary_theta or cfg.rotary_theta
    hf = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
          "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings,
          "norm_eps": cfg.layer_norm_eps, "initializer_range": cfg.initializer_range,
          "mlp_dropout": cfg.hidden_dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
          "hidden_activation": "gelu", "classifier_activation": "gelu", "decoder_bias": True,
          "norm_bias": cfg.use_bias, "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias,
          "classifier_bias": cfg.use_bias, "local_attention": cfg.local_attention_window or cfg.max_position_embeddings,
          "global_attn_every_n_layers": cfg.global_attention_every, "layer_types": layer_types,
          "global_rope_theta": global_theta, "local_rope_theta": cfg.rotary_theta,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": global_theta},
                              "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rotary_theta}},
          "tie_word_embeddings": True}
    if cfg.vocab_size <= 50283:  # HF's special ids (50281 ...) would lie outside a smaller vocabulary:
        # bertjax's own, as its vocabularies order them ([PAD] [UNK] [CLS] [SEP] [MASK]).
        hf.update(pad_token_id=0, cls_token_id=2, bos_token_id=2, sep_token_id=3, eos_token_id=3)
    return hf


_QKV = ("Wq", "Wk", "Wv")


def _split_qkv(state: dict, cfg: bert_model.BertConfig) -> dict:
    """attn.Wqkv [3*N*D, H] (q, k, v rows, as HF views it [3, N, D]) -> attn.Wq, attn.Wk, attn.Wv."""
    for name in [n for n in state if ".attn.Wqkv." in n]:
        for part, x in zip(_QKV, np.split(state.pop(name), 3, axis=0)):
            state[name.replace(".Wqkv.", f".{part}.")] = x
    return state


def _join_qkv(state: dict, cfg: bert_model.BertConfig) -> dict:
    for name in [n for n in state if ".attn.Wq." in n]:
        parts = [state.pop(name.replace(".Wq.", f".{part}.")) for part in _QKV]
        state[name.replace(".Wq.", ".Wqkv.")] = np.concatenate(parts, axis=0)
    return state


def _modernbert_layer(layer: str) -> tuple:
    bj = "bert/encoder/layers_{i}/"
    rows = []
    for suffix, kind in (("weight", "scale"), ("bias", "bias")):
        rows += [(f"{layer}attn_norm.{suffix}", f"{bj}attention_layer_norm/{kind}", COPY),  # none in layer 0
                 (f"{layer}mlp_norm.{suffix}", f"{bj}mlp_layer_norm/{kind}", COPY)]
    for part, path in zip(_QKV, ("query", "key", "value")):
        rows += [(f"{layer}attn.{part}.weight", f"{bj}attention/{path}/kernel", QKV_KERNEL),
                 (f"{layer}attn.{part}.bias", f"{bj}attention/{path}/bias", QKV_BIAS)]
    return tuple(rows) + (
        (f"{layer}attn.Wo.weight", f"{bj}attention/output/kernel", ATTENTION_OUT_KERNEL),
        (f"{layer}attn.Wo.bias", f"{bj}attention/output/bias", COPY),
        (f"{layer}mlp.Wi.weight", f"{bj}mlp/intermediate/kernel", LINEAR),  # [2F, H]: input rows, then gate
        (f"{layer}mlp.Wi.bias", f"{bj}mlp/intermediate/bias", COPY),
        (f"{layer}mlp.Wo.weight", f"{bj}mlp/output/kernel", LINEAR),
        (f"{layer}mlp.Wo.bias", f"{bj}mlp/output/bias", COPY),
    )


_PREDICTION_HEAD = _linear("head.dense", "bert/pooler") + (("head.norm.weight", "bert/pooler_norm/scale", COPY),
                                                             ("head.norm.bias", "bert/pooler_norm/bias", COPY))

MODERNBERT = Family(
    model_type="modernbert",
    architecture="ModernBertForMaskedLM",
    base="model.",
    heads=("head.", "decoder."),
    table=(_embeddings("model.embeddings.", word="tok_embeddings", norm="norm")
           + _modernbert_layer("model.layers.{i}.")
           + (("model.final_norm.weight", "bert/encoder/final_layer_norm/scale", COPY),
              ("model.final_norm.bias", "bert/encoder/final_layer_norm/bias", COPY))
           + _mlm_head("head.dense", "head.norm", "decoder.bias")),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
    config_from_hf=_modernbert_from_hf,
    config_to_hf=_modernbert_to_hf,
    # Every class runs ModernBertPredictionHead `head` (dense, GELU, norm: bertjax's pooler "gelu_norm")
    # before its classifier: on [CLS] for the pooled kinds, at every token for span and tagging.
    task_classes=_task_classes("ModernBert", sequence=_PREDICTION_HEAD + _linear("classifier", "classifier"),
                               multiple_choice=_PREDICTION_HEAD + _linear("classifier", "classifier"),
                               span=_PREDICTION_HEAD + _linear("classifier", "classifier"),
                               tagging=_PREDICTION_HEAD + _linear("classifier", "classifier")),
    pooler="gelu_norm",
    task_config=lambda cfg: {"classifier_pooling": "cls", "classifier_dropout": cfg.hidden_dropout_rate},
    split=_split_qkv,
    join=_join_qkv,
)

FAMILIES = {family.model_type: family for family in (ROBERTA, ALBERT, MODERNBERT)}


# --------------------------------------------------------------------------------------------------
# The conversion: hf.py's core on a family's table
# --------------------------------------------------------------------------------------------------


_TRAINING_FIELDS = ("hidden_dropout_rate", "attention_dropout_rate")


def family_of(hf_config: dict) -> Family:
    model_type = hf_config.get("model_type", "bert")
    if model_type not in FAMILIES:
        raise ValueError(f"config.json has model_type={model_type!r}: bertjax reads bert, {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def config_from_hf(hf_config: dict, **overrides) -> bert_model.BertConfig:
    """A family's config.json -> BertConfig; `overrides` set the compute fields (dtype, remat, ...)."""
    fields = family_of(hf_config).config_from_hf(hf_config)
    # Dropout is how a run trains (fine-tuning sets its own), not what the weights are: overrides win.
    clash = sorted(k for k in overrides if k in fields and overrides[k] != fields[k] and k not in _TRAINING_FIELDS)
    if clash:
        raise ValueError(f"the overrides {clash} contradict the checkpoint's config.json")
    return bert_model.BertConfig(**{**fields, **overrides})


def _task_class(family: Family, kind: str, cfg: bert_model.BertConfig) -> TaskClass:
    """The family's transformers class for a task kind, whose head the config must compute."""
    hf._hf_head(kind)  # an unknown kind: one line listing the known ones
    task = family.task_classes[kind]
    if cfg.pooler != family.pooler:
        raise ValueError(f"a {family.model_type} {kind!r} head needs model.pooler={family.pooler!r} (what "
                         f"{task.architecture} computes), not {cfg.pooler!r}")
    return task


def _rows(family: Family, cfg: bert_model.BertConfig, shapes: dict, kind: str | None = None,
          reading: bool = False) -> list:
    """The family's table for this config: {i} over the parameter groups, rows the config lacks left out.
    With a task kind: the encoder's rows and the rows of the kind's class's head; `reading`, the pretraining
    class's pooler too where the task class has none (as hf.py reads bert.pooler for every head)."""
    table = family.table
    if kind is not None:
        task = _task_class(family, kind, cfg)
        pretraining_pooler = reading and not task.pooler
        encoder = tuple(row for row in table if row[1].startswith("bert/")
                        and (pretraining_pooler or not row[1].startswith("bert/pooler")))
        table = encoder + task.rows
    rows = []
    for hf_name, path, transform in table:
        groups = range(cfg.num_groups) if "{i}" in hf_name else [None]
        rows += [(hf_name.format(i=i), path.format(i=i), transform) for i in groups]
    return [row for row in rows if row[1] in shapes]


def _task_prefixes(family: Family) -> tuple:
    """The prefixes of the task classes' head tensors outside the encoder that no pretraining class has
    ("classifier.", "qa_outputs."; not ModernBERT's "head.", its masked-LM class's head too)."""
    prefixes = {name.split(".")[0] + "." for task in family.task_classes.values() for name, _, _ in task.rows
                if not name.startswith(family.base)}
    return tuple(sorted(prefixes - set(family.heads)))


def _canonical(family: Family, state: dict) -> dict:
    """Canonical name -> the checkpoint's: a bare encoder checkpoint gets the class's prefix."""
    names = {}
    outside = (family.base,) + family.heads + _task_prefixes(family)
    for name in state:
        new = name if name.startswith(outside) else family.base + name
        names[new] = name
    return names


def hf_to_params(state: dict, cfg: bert_model.BertConfig, family: Family, seed: int = 0, kind: str | None = None,
                 num_labels: int | None = None):
    """A family's HF state dict -> (bertjax BertForPreTraining params, missing), as hf.hf_to_params; with
    a task kind, the params of its head (hf_to_head_params), whose pooler and classifier may be fresh."""
    shapes = hf._param_shapes(cfg, kind, num_labels)
    state = family.split(dict(state), cfg)
    names = _canonical(family, state)
    rows = _rows(family, cfg, shapes, kind, reading=True)
    flat, used = hf._converted_rows(state, names, rows, shapes, np.dtype(cfg.param_dtype))
    for tied, source in family.tied.items() if kind is None else ():  # a head reads no decoder
        if tied in names:
            x, y = state[names[tied]], state.get(names.get(source, ""))
            if y is None or x.shape != y.shape or not np.array_equal(x, y):
                raise ValueError(f"HF tensor {tied!r} differs from {source!r}: bertjax ties them, so this "
                                 "checkpoint cannot be loaded exactly")
            used.add(tied)
    unused = sorted(names[n] for n in names if n not in used and not n.endswith("_ids"))
    if kind is not None and unused and all(n.startswith(family.heads) for n in unused):
        log.info("not used by a %r head: the pretraining heads %s", kind, unused)  # fine-tuning replaces them
    elif unused:
        what = family.architecture if kind is None else family.task_classes[kind].architecture
        log.warning("ignoring %d tensor(s) that %s has no place for: %s", len(unused), what, unused)
    missing = [path for path in shapes if path not in flat]
    optional = () if kind is None else ("bert/pooler", "classifier/")  # a task head's own: fresh if absent
    required = [path for path in missing if path in {row[1] for row in rows} and not path.startswith(optional)]
    if required:
        hf_name = {path: name for name, path, _ in rows}[required[0]]
        raise ValueError(f"the checkpoint lacks {len(required)} tensor(s), e.g. {hf_name!r}: is it a "
                         f"{family.model_type} checkpoint with num_hidden_layers={cfg.num_layers}?")
    if missing:
        log.info("no %s tensor, freshly initialised: %s", family.model_type, missing)
        flat.update(hf._fresh_params(cfg, missing, seed, kind, num_labels))
    params = hf._unflatten(flat)
    return (hf._stack(params, cfg) if cfg.scan_layers else params), missing


def params_to_hf(params: dict, cfg: bert_model.BertConfig, family: Family, kind: str | None = None) -> dict:
    """bertjax BertForPreTraining params (boxed or plain, unrolled or scanned) -> the family's HF state
    dict; params with no HF name (pooler, NSP head) are left out, tied tensors are not written. With a
    task kind, a head's params -> its class's (head_params_to_hf): every param has a name there, but the
    pooler of a class without one."""
    import flax.linen as nn

    params = nn.meta.unbox(params)
    params = params.get("params", params)
    # Pruned heads (model.layer_heads): no family's transformers class has pruned_heads, so they are written
    # at full shapes, the removed heads all zeros: the same outputs.
    cfg, params = pruning.with_all_heads(params, cfg)
    encoder = params["bert"]["encoder"]
    if "layers" in encoder:
        encoder = bert_model.unstack_layers(encoder, cfg)
        params = {**params, "bert": {**params["bert"], "encoder": encoder}}
    flat = hf._flatten(params)
    num_labels = None if kind is None else hf._classifier_width(flat, kind)
    shapes = hf._param_shapes(cfg, kind, num_labels)
    rows = _rows(family, cfg, shapes, kind)
    if kind is not None:
        has_pooler = family.task_classes[kind].pooler
        unmapped = sorted(path for path in set(flat) - {row[1] for row in rows}
                          if has_pooler or not path.startswith("bert/pooler"))
        if unmapped:
            raise ValueError(f"bertjax params with no name in {family.task_classes[kind].architecture}: {unmapped}")
    state = {}
    for hf_name, path, transform in rows:
        p = np.asarray(flat[path])
        if tuple(p.shape) != shapes[path]:
            raise ValueError(f"bertjax param {path}: the config implies shape {shapes[path]}, found {p.shape}")
        state[hf_name] = np.ascontiguousarray(transform.to_hf(p))
    return family.join(state, cfg)


def load_hf_checkpoint(path: str | os.PathLike, model_config_overrides: dict | None = None):
    """A family's Hugging Face directory -> (BertConfig, params, missing), as hf.load_hf_checkpoint."""
    path = Path(path)
    hf_config = json.loads((path / "config.json").read_text())
    cfg = config_from_hf(hf_config, **(model_config_overrides or {}))
    params, missing = hf_to_params(hf_files.read_hf_weights(path), cfg, family_of(hf_config))
    return cfg, params, missing


def model_type_of(cfg: bert_model.BertConfig) -> str:
    """The HF model_type whose class computes this config's network: "bert" for BERT's defaults, else the
    family its options make; a mix of options no HF class has is a ValueError."""
    if cfg.embedding_size or cfg.num_hidden_groups or cfg.activation == "gelu_tanh":
        model_type = "albert"
    elif cfg.position_embedding == "rotary":
        model_type = "modernbert"
    elif cfg.position_offset:
        model_type = "roberta"
    else:
        model_type = "bert"
    defaults = bert_model.BertConfig()
    options = bert_model.FAMILY_OPTIONS
    if model_type == "bert" and any(getattr(cfg, k) != getattr(defaults, k) for k in options):
        changed = sorted(k for k in options if getattr(cfg, k) != getattr(defaults, k))
        raise ValueError(f"model options {changed} make a network no Hugging Face class has (BERT, RoBERTa, "
                         "ALBERT, ModernBERT): export it with --format=params")
    if model_type != "bert":
        FAMILIES[model_type].config_to_hf(cfg)  # raises, naming what the family cannot have
    return model_type


def save_hf_checkpoint(path: str | os.PathLike, cfg: bert_model.BertConfig, params: dict, model_type: str,
                       vocab_path: str | os.PathLike | None = None, lower_case: bool = True):
    """Write a directory that the family's transformers class (FAMILIES[model_type].architecture) loads,
    with the WordPiece vocabulary the model was trained with where one is given."""
    family = FAMILIES[model_type]
    _check_vocabulary(model_type, cfg, vocab_path)
    state = params_to_hf(params, cfg, family)
    hf_config = {**family.config_to_hf(cfg), "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype}
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case)


def _check_vocabulary(model_type: str, cfg: bert_model.BertConfig, vocab_path) -> None:
    pad = cfg.position_offset - 1
    if model_type == "roberta" and vocab_path is not None:
        tokens = Path(vocab_path).read_text(encoding="utf-8").split("\n")
        if pad < len(tokens) and tokens[pad] not in ("[PAD]", "<pad>"):
            # HF numbers positions from its pad_token_id (offset - 1): that token would be taken for padding.
            log.warning("model.position_offset=%d makes pad_token_id %d, which is %r in %s: transformers will "
                        "number positions wrongly after it; train with position_offset = [PAD]'s id + 1",
                        cfg.position_offset, pad, tokens[pad], vocab_path)


# --------------------------------------------------------------------------------------------------
# Task heads (bertjax/models/heads.py) <-> each family's task classes
# --------------------------------------------------------------------------------------------------


def _classifier_bias(task: TaskClass) -> str:
    return next(hf_name for hf_name, path, _ in task.rows if path == "classifier/bias")


def hf_to_head_params(state: dict, cfg: bert_model.BertConfig, family: Family, kind: str,
                      num_labels: int | None = None, seed: int = 0):
    """A family's HF state dict -> (params of the `kind` head, missing), as hf.hf_to_head_params: from the
    kind's own class everything loads; from a pretraining or bare encoder state dict the encoder does and
    the classifier is fresh (in missing). num_labels: None takes it from the state dict's classifier."""
    weights = state.get(_classifier_bias(_task_class(family, kind, cfg)))
    if num_labels is None and heads.head(kind).num_labels is None and weights is not None:
        num_labels = int(weights.shape[0])
    return hf_to_params(state, cfg, family, seed, kind=kind, num_labels=heads.resolve_num_labels(kind, num_labels))


def head_params_to_hf(params: dict, cfg: bert_model.BertConfig, family: Family, kind: str) -> dict:
    """bertjax params of the `kind` head (boxed or plain, unrolled or scanned) -> the state dict of the
    family's class for it."""
    return params_to_hf(params, cfg, family, kind)


def load_hf_head(path: str | os.PathLike, kind: str, num_labels: int | None = None,
                 model_config_overrides: dict | None = None):
    """A family's Hugging Face directory -> (BertConfig, params of the `kind` head, missing), as
    hf.load_hf_head: the kind's own class loads whole; a pretraining directory (RobertaForMaskedLM, ...)
    or another task's gives the encoder and a fresh classifier (in missing). ModernBERT's prediction
    head `head.` is its masked-LM class's too, and becomes the pooler, as transformers loads it."""
    path = Path(path)
    hf_config = json.loads((path / "config.json").read_text())
    family = family_of(hf_config)
    cfg = config_from_hf(hf_config, **(model_config_overrides or {}))
    task = _task_class(family, kind, cfg)
    pooling = hf_config.get("classifier_pooling", "cls")  # ModernBERT's: what its pooled classes pool
    if pooling != "cls" and hf.HF_HEADS[kind].pooler:  # a kind that reads the pooled [CLS]
        if task.architecture in (hf_config.get("architectures") or []):
            raise ValueError(f"{path} was trained with classifier_pooling={pooling!r}: bertjax's heads pool "
                             "[CLS] only (classifier_pooling='cls'); fine-tune from its encoder's checkpoint")
        log.warning("%s says classifier_pooling=%r: the %r head pools [CLS] (its export says 'cls')",
                    path, pooling, kind)
    state = hf.task_state(path, hf_config, hf_files.read_hf_weights(path), kind, task.architecture,
                          _task_prefixes(family))
    params, missing = hf_to_head_params(state, cfg, family, kind, num_labels)
    return cfg, params, missing


def save_hf_head(path: str | os.PathLike, cfg: bert_model.BertConfig, params: dict, model_type: str, kind: str,
                 label_names: list[str] | None = None, vocab_path: str | os.PathLike | None = None,
                 lower_case: bool = True):
    """Write a directory that the family's class for `kind` (and AutoModelFor... of that task) loads with
    no missing or unexpected weight: as save_hf_checkpoint, for a task head's params; its config.json
    carries the labels and problem_type as hf.save_hf_head writes them for BERT."""
    family = FAMILIES[model_type]
    _check_vocabulary(model_type, cfg, vocab_path)
    state = head_params_to_hf(params, cfg, family, kind)
    task = family.task_classes[kind]
    num_labels = int(state[_classifier_bias(task)].shape[0])
    labels = hf._head_config(kind, num_labels if heads.head(kind).num_labels is None else None, label_names)
    hf_config = {**family.config_to_hf(cfg), **family.task_config(cfg), **labels, "architectures": [task.architecture],
                 "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype}
    hf_files.write_directory(path, cfg, state, hf_config, vocab_path, lower_case)
