"""ELECTRA (Clark et al. 2020) as a Hugging Face family: BERT's encoder under `electra.`, with
embeddings_project E -> H where the embedding width differs from the hidden size, and ELECTRA's task
classes (its sequence classifier is dense, GELU, out_proj: bertjax's model.pooler="gelu").

The family record reads and writes the encoder (and the task heads), as every family's. ELECTRA's
pretraining is a pair of networks, so the pair has functions of its own here:
  * the discriminator is transformers' ElectraForPreTraining: the encoder plus
    discriminator_predictions.{dense, dense_prediction} (bertjax's discriminator_head);
  * the generator is ElectraForMaskedLM: its own encoder over the shared embeddings, plus
    generator_predictions.{dense H -> E, LayerNorm} and generator_lm_head (E -> V, tied to the word
    embeddings; its bias is bertjax's generator_head/output_bias).
bertjax keeps the embeddings once (bert/embeddings); each directory holds its copy, as transformers'.

Shape legend: H hidden, G generator hidden, E embedding, V vocabulary.
"""

import json
import logging
import os
from pathlib import Path

import flax.linen as nn
import numpy as np
from flax import traverse_util

from bertjax.interop import hf_bert, hf_convert, hf_family, hf_files
from bertjax.interop.hf_family import COPY, Family, linear
from bertjax.models.config import BertConfig

log = logging.getLogger(__name__)

DISCRIMINATOR_DIR, GENERATOR_DIR = "discriminator", "generator"


def _from_hf(hf_config: dict) -> dict:
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"config.json has hidden_act={act!r}: bertjax ELECTRA uses the exact (erf) GELU, "
                         "hidden_act='gelu'")
    hf_bert.check_absolute(hf_config, "ELECTRA")
    fields = hf_bert.fields_from_hf(hf_config, "ELECTRA")
    embedding = hf_config.get("embedding_size", 128)  # ElectraConfig's default
    # E = H has no projection, as bertjax's embedding_size 0.
    fields.update(embedding_size=0 if embedding == fields["hidden_size"] else embedding, pooler="gelu")
    return fields


def _to_hf(cfg: BertConfig) -> dict:
    if cfg.activation != "gelu" or cfg.position_embedding != "learned" or cfg.position_offset:
        raise ValueError("an ELECTRA checkpoint needs model.activation='gelu' and learned positions from 0")
    return {"model_type": "electra", "architectures": ["ElectraForPreTraining"], **hf_bert.fields_to_hf(cfg),
            "embedding_size": cfg.embedding_width, "hidden_act": "gelu", "position_embedding_type": "absolute",
            "pad_token_id": 0, "tie_word_embeddings": True,
            # The multiple-choice class's summary: dense H -> H and GELU on the first token (bertjax's pooler).
            "summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
            "summary_last_dropout": cfg.hidden_dropout_rate}


ELECTRA = Family(
    model_type="electra",
    name="ELECTRA",
    architecture="ElectraForPreTraining",
    base="electra.",
    heads=("discriminator_predictions.", "generator_predictions.", "generator_lm_head."),
    # The encoder only: the pretraining heads are the pair's (discriminator_state, generator_state).
    table=(hf_family.embeddings("electra.embeddings.")
           + linear("electra.embeddings_project", "bert/embeddings/projection")
           + hf_family.post_norm_block("electra.encoder.layer.{i}.", "attention.self.", hf_bert.BLOCK_PARTS)),
    tied={},
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    task_classes=hf_family.task_classes(
        "Electra",
        sequence=linear("classifier.dense", "bert/pooler") + linear("classifier.out_proj", "classifier"),
        multiple_choice=linear("sequence_summary.summary", "bert/pooler") + linear("classifier", "classifier"),
        span=linear("qa_outputs", "classifier"),
        tagging=linear("classifier", "classifier")),
    claims=lambda cfg: cfg.pooler == "gelu",
    options=("embedding_size", "pooler"),
    poolers=("gelu",),
    task_config=lambda cfg: {"classifier_dropout": cfg.hidden_dropout_rate},
)

# The pretraining heads: (HF name, bertjax path under the pair's params, transform).
DISCRIMINATOR_HEAD = (linear("discriminator_predictions.dense", "discriminator_head/dense")
                      + linear("discriminator_predictions.dense_prediction", "discriminator_head/prediction"))
GENERATOR_HEAD = (linear("generator_predictions.dense", "generator_head/transform")
                  + (("generator_predictions.LayerNorm.weight", "generator_head/layer_norm/scale", COPY),
                     ("generator_predictions.LayerNorm.bias", "generator_head/layer_norm/bias", COPY),
                     ("generator_lm_head.bias", "generator_head/output_bias", COPY)))
_TIED_DECODER = ("generator_lm_head.weight", "electra.embeddings.word_embeddings.weight")


# --------------------------------------------------------------------------------------------------
# The pair's params <-> the two state dicts
# --------------------------------------------------------------------------------------------------


def generator_as_encoder(params: dict) -> dict:
    """The generator's encoder as a BertModel's params (`bert` subtree): the shared tables, its own
    projection and layers; what the family's table converts."""
    embeddings = {k: v for k, v in params["bert"]["embeddings"].items() if k != "projection"}
    if "embeddings_project" in params["generator"]:
        embeddings["projection"] = params["generator"]["embeddings_project"]
    return {"embeddings": embeddings, "encoder": params["generator"]["encoder"]}


def pair_to_hf(params: dict, discriminator: BertConfig, generator: BertConfig) -> tuple[dict, dict]:
    """ElectraForPreTraining params (boxed or plain) -> (the discriminator's state dict, the generator's)."""
    params = nn.meta.unbox(params)
    params = params.get("params", params)
    flat = traverse_util.flatten_dict(params, sep="/")
    disc = hf_convert.to_state(ELECTRA, {"bert": params["bert"]}, discriminator)
    gen = hf_convert.to_state(ELECTRA, {"bert": generator_as_encoder(params)}, generator)
    for state, rows in ((disc, DISCRIMINATOR_HEAD), (gen, GENERATOR_HEAD)):
        for hf_name, path, transform in rows:
            state[hf_name] = np.ascontiguousarray(transform.to_hf(np.asarray(flat[path])))
    return disc, gen


def _split_heads(state: dict, rows) -> tuple[dict, dict]:
    """(the encoder's tensors, the head's) of a state dict."""
    names = {hf_name for hf_name, _, _ in rows} | {_TIED_DECODER[0]}
    return ({k: v for k, v in state.items() if k not in names},
            {k: v for k, v in state.items() if k in names})


def _head_params(state: dict, rows, shapes: dict, param_dtype) -> dict:
    """A head's rows of a state dict -> {path: array}; a missing or misshapen tensor is one line."""
    out = {}
    for hf_name, path, transform in rows:
        if hf_name not in state:
            raise ValueError(f"the checkpoint has no {hf_name!r}: is it an ELECTRA "
                             f"{'discriminator' if 'discriminator' in hf_name else 'generator'}?")
        x = transform.to_bertjax(np.asarray(state[hf_name]), shapes[path])
        if tuple(x.shape) != tuple(shapes[path]):
            raise ValueError(f"HF tensor {hf_name} has shape {np.shape(state[hf_name])}, bertjax {path} "
                             f"{tuple(shapes[path])}: the same config?")
        out[path] = x.astype(param_dtype)
    return out


def pair_from_hf(disc_state: dict, gen_state: dict | None, discriminator: BertConfig, generator: BertConfig,
                 fresh: dict) -> tuple[dict, list[str]]:
    """The two state dicts -> (ElectraForPreTraining params, plain, in the configs' layout; the paths
    taken from `fresh` (that network's freshly initialised params, the same tree)). gen_state None: the
    discriminator alone, the generator (and the pooler, which ELECTRA's pretraining class lacks) fresh."""
    fresh = nn.meta.unbox(fresh)
    flat_fresh = traverse_util.flatten_dict(fresh, sep="/")
    shapes = {path: tuple(np.shape(x)) for path, x in flat_fresh.items()}
    dtype = np.dtype(discriminator.param_dtype)
    encoder_state, head_state = _split_heads(disc_state, DISCRIMINATOR_HEAD)
    disc, _ = hf_convert.to_params(ELECTRA, encoder_state, discriminator)
    flat = traverse_util.flatten_dict({"bert": disc["bert"]}, sep="/")
    flat.update(_head_params(head_state, DISCRIMINATOR_HEAD, shapes, dtype))
    flat = {path: x for path, x in flat.items() if not path.startswith("bert/pooler/")}
    if gen_state is not None:
        encoder_state, head_state = _split_heads(gen_state, GENERATOR_HEAD)
        _check_shared_tables(encoder_state, disc_state)
        gen, _ = hf_convert.to_params(ELECTRA, encoder_state, generator)
        gen_bert = gen["bert"]
        if "projection" in gen_bert["embeddings"]:
            flat.update(traverse_util.flatten_dict({"generator": {"embeddings_project":
                                                                  gen_bert["embeddings"]["projection"]}}, sep="/"))
        flat.update(traverse_util.flatten_dict({"generator": {"encoder": gen_bert["encoder"]}}, sep="/"))
        flat.update(_head_params(head_state, GENERATOR_HEAD, shapes, dtype))
    missing = sorted(path for path in flat_fresh if path not in flat)
    unknown = sorted(path for path in flat if path not in flat_fresh)
    if unknown:
        raise ValueError(f"the checkpoints have params this ELECTRA config lacks, e.g. {unknown[0]}: the same "
                         "model and electra sections?")
    for path in missing:
        flat[path] = np.asarray(flat_fresh[path])
    for path, x in flat.items():
        if tuple(np.shape(x)) != shapes[path]:
            raise ValueError(f"{path} has shape {tuple(np.shape(x))} in the checkpoints, {shapes[path]} in this "
                             "config: the same model and electra sections?")
    return traverse_util.unflatten_dict(flat, sep="/"), missing


def _check_shared_tables(gen_state: dict, disc_state: dict) -> None:
    """ELECTRA shares the embeddings; a generator directory whose copy differs loses its own."""
    for name, x in gen_state.items():
        short = name.removeprefix("electra.")
        if short.startswith("embeddings.") and f"electra.{short}" in disc_state:
            if not np.array_equal(np.asarray(x), np.asarray(disc_state[f"electra.{short}"])):
                log.warning("the generator's %s differs from the discriminator's: the discriminator's is used "
                            "(ELECTRA shares its embeddings)", name)
                return


# --------------------------------------------------------------------------------------------------
# Directories
# --------------------------------------------------------------------------------------------------


def generator_hf_config(generator: BertConfig) -> dict:
    return {**_to_hf(generator), "architectures": ["ElectraForMaskedLM"], "dtype": generator.param_dtype,
            "torch_dtype": generator.param_dtype}


def save_pair(path: str | os.PathLike, discriminator: BertConfig, generator: BertConfig, params: dict,
              vocab_path=None, lower_case: bool = True) -> tuple[Path, Path]:
    """PATH/discriminator (ElectraForPreTraining) and PATH/generator (ElectraForMaskedLM), each with the
    vocabulary and tokenizer files. Returns the two directories."""
    disc_state, gen_state = pair_to_hf(params, discriminator, generator)
    disc_dir, gen_dir = Path(path) / DISCRIMINATOR_DIR, Path(path) / GENERATOR_DIR
    disc_config = {**_to_hf(discriminator), "dtype": discriminator.param_dtype,
                   "torch_dtype": discriminator.param_dtype}
    hf_files.write_directory(disc_dir, discriminator, disc_state, disc_config, vocab_path, lower_case, True)
    hf_files.write_directory(gen_dir, generator, gen_state, generator_hf_config(generator), vocab_path, lower_case,
                             True)
    return disc_dir, gen_dir


def is_pair(path: str | os.PathLike) -> bool:
    """A directory save_pair wrote: discriminator/ and generator/, each a Hugging Face directory."""
    return all((Path(path) / d / "config.json").is_file() for d in (DISCRIMINATOR_DIR, GENERATOR_DIR))


def read_pair(path: str | os.PathLike) -> tuple[dict, dict | None, dict, dict | None]:
    """(discriminator state, generator state or None, their config.json dicts) of a pair directory, or of
    a discriminator's directory alone."""
    path = Path(path)
    disc_dir, gen_dir = (path / DISCRIMINATOR_DIR, path / GENERATOR_DIR) if is_pair(path) else (path, None)
    disc_config = json.loads((disc_dir / "config.json").read_text())
    if disc_config.get("model_type") != "electra":
        raise ValueError(f"{disc_dir} is a {disc_config.get('model_type')!r} directory: ELECTRA's pretraining "
                         "continues from an ELECTRA discriminator (ElectraForPreTraining), or a pair of "
                         "discriminator/ and generator/")
    if gen_dir is None:
        return hf_files.read_hf_weights(disc_dir), None, disc_config, None
    return (hf_files.read_hf_weights(disc_dir), hf_files.read_hf_weights(gen_dir), disc_config,
            json.loads((gen_dir / "config.json").read_text()))


def generator_fields(hf_config: dict) -> dict:
    """A generator's config.json -> the electra section's generator_* keys."""
    return {"generator_hidden_size": hf_config["hidden_size"], "generator_num_layers": hf_config["num_hidden_layers"],
            "generator_num_heads": hf_config["num_attention_heads"],
            "generator_intermediate_size": hf_config["intermediate_size"]}
