"""ModernBERT (Warner et al. 2024) as a Hugging Face family: pre-norm without biases, rotary positions
(two bases), GeGLU, alternating local/global attention, and one fused q/k/v tensor per layer.

The fused Wqkv is split into three table rows before the table is read and joined after it is written.
Its own tokenizer (tokenizer.json, byte-level BPE) runs as bertjax's bpe tokenizer (BPETokenizer,
bertjax/text/tokenizers.py); a ModernBERT trained by bertjax exports its WordPiece vocab.txt (and the same
vocabulary as tokenizer.json, which AutoTokenizer reads).
"""

import numpy as np

from bertjax.interop import hf_family
from bertjax.interop.hf_family import ATTENTION_OUT_KERNEL, COPY, LINEAR, QKV_BIAS, QKV_KERNEL, Family, linear
from bertjax.models.config import BertConfig


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


def _from_hf(hf_config: dict) -> dict:
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


def _to_hf(cfg: BertConfig) -> dict:
    if ((cfg.position_embedding, cfg.activation, cfg.norm_placement, cfg.type_vocab_size)
            != ("rotary", "geglu", "pre", 0)):
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


def _split_qkv(state: dict, cfg: BertConfig) -> dict:
    """attn.Wqkv [3*N*D, H] (q, k, v rows, as HF views it [3, N, D]) -> attn.Wq, attn.Wk, attn.Wv."""
    state = dict(state)
    for name in [n for n in state if ".attn.Wqkv." in n]:
        for part, x in zip(_QKV, np.split(state.pop(name), 3, axis=0)):
            state[name.replace(".Wqkv.", f".{part}.")] = x
    return state


def _join_qkv(state: dict, cfg: BertConfig) -> dict:
    state = dict(state)
    for name in [n for n in state if ".attn.Wq." in n]:
        parts = [state.pop(name.replace(".Wq.", f".{part}.")) for part in _QKV]
        state[name.replace(".Wq.", ".Wqkv.")] = np.concatenate(parts, axis=0)
    return state


def _layer(layer: str) -> tuple:
    """The rows of a pre-norm block; those whose path a config lacks (layer 0's attention norm, HF's
    Identity; the biases when use_bias=False) are left out by the conversion."""
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


# ModernBertPredictionHead `head` (dense, GELU, norm: bertjax's pooler "gelu_norm").
_PREDICTION_HEAD = linear("head.dense", "bert/pooler") + (("head.norm.weight", "bert/pooler_norm/scale", COPY),
                                                            ("head.norm.bias", "bert/pooler_norm/bias", COPY))

MODERNBERT = Family(
    model_type="modernbert",
    name="ModernBERT",
    architecture="ModernBertForMaskedLM",
    base="model.",
    heads=("head.", "decoder."),
    table=(hf_family.embeddings("model.embeddings.", word="tok_embeddings", norm="norm")
           + _layer("model.layers.{i}.")
           + (("model.final_norm.weight", "bert/encoder/final_layer_norm/scale", COPY),
              ("model.final_norm.bias", "bert/encoder/final_layer_norm/bias", COPY))
           + hf_family.mlm_head("head.dense", "head.norm", "decoder.bias")),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    # Every class runs the prediction head before its classifier: on [CLS] for the pooled kinds, at every
    # token for span and tagging.
    task_classes=hf_family.task_classes("ModernBert", sequence=_PREDICTION_HEAD + linear("classifier", "classifier"),
                                        multiple_choice=_PREDICTION_HEAD + linear("classifier", "classifier"),
                                        span=_PREDICTION_HEAD + linear("classifier", "classifier"),
                                        tagging=_PREDICTION_HEAD + linear("classifier", "classifier")),
    claims=lambda cfg: cfg.position_embedding == "rotary",
    options=("position_embedding", "activation", "norm_placement", "use_bias", "local_attention_window", "pooler"),
    masked_lm="ModernBertForMaskedLM",
    to_table=_split_qkv,
    from_table=_join_qkv,
    poolers=("gelu_norm",),
    task_config=lambda cfg: {"classifier_pooling": "cls", "classifier_dropout": cfg.hidden_dropout_rate},
)
