"""bertjax's own saved models, read: the checkpoint a workdir stands for (a fine-tuning run's best dev
checkpoint, else its newest) and a params export (`python -m bertjax.export --format=params`: params.npz
beside a config.json record). What bertjax/init_from.py reads for these two kinds of starting model; Hugging
Face and sentence-transformers directories are interop/'s.
"""

import json

import jax
import numpy as np
from etils import epath
from flax import traverse_util

from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from bertjax.training import checkpoint
from bertjax.training.checkpoint_meta import CheckpointMeta

PARAMS_FILE = "params.npz"  # a params export's weights, the tree flattened with "/", beside config.json


def chosen_checkpoint(path: str) -> str | None:
    """The checkpoint a workdir (or checkpoint path) stands for: a fine-tuning run's best dev checkpoint,
    else its newest; None where `path` holds no bertjax checkpoint."""
    best = epath.Path(path) / checkpoint.BEST_DIR
    if best.is_dir() and checkpoint.is_checkpoint(str(best)):
        return str(best)
    return path if checkpoint.is_checkpoint(path) else None


def is_params_export(path: str) -> bool:
    return (epath.Path(path) / "config.json").exists() and (epath.Path(path) / PARAMS_FILE).exists()


def export_meta(path: str, what: str) -> CheckpointMeta:
    """A params export's config.json: model, tokenizer, task, step and (int8 exports) quantize. `what` names
    the setting in the error."""
    meta = json.loads((epath.Path(path) / "config.json").read_text())
    if "model" not in meta:
        raise ValueError(f"{what}={path}: its config.json has no model section, so it is not a bertjax params "
                         "export (python -m bertjax.export --format=params)")
    return CheckpointMeta.from_json({"step": 0, **{k: v for k, v in meta.items() if v is not None}})


def export_params(path: str, config: BertConfig, quantized: bool) -> dict:
    """A params export's params (numpy), float ones stored as `config` asks (in_layout); an int8 export's
    as they are (quantized)."""
    with (epath.Path(path) / PARAMS_FILE).open("rb") as f:
        params = traverse_util.unflatten_dict(dict(np.load(f)), sep="/")
    return params if quantized else in_layout(params, config)


def in_layout(params: dict, config: BertConfig) -> dict:
    """Params stored as the config asks (a run may store them otherwise than the saving one did): in its
    param_dtype, the layers stacked or not as config.scan_layers says."""
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, config.param_dtype), params)
    encoder = params["bert"]["encoder"]
    if config.scan_layers == ("layers" in encoder):
        return params
    change = bert_model.stack_layers if config.scan_layers else bert_model.unstack_layers
    encoder = jax.tree_util.tree_map(np.asarray, change(encoder, config))
    return {**params, "bert": {**params["bert"], "encoder": encoder}}
