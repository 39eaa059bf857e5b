"""The model a config builds, without building it: every parameter with its shape, logical axis names and
the mesh axes the config's rules give it, the parameter count beside the count of the Hugging Face class the
model converts to, and the parameter memory; what `python -m bertjax.summary` prints. Shapes come from
jax.eval_shape, so even configs/large.py costs no memory."""

import dataclasses
import re

import flax.linen as nn
import jax
import numpy as np

from bertjax.interop import hf
from bertjax.models import bert
from bertjax.models.config import BertConfig


def abstract_params(cfg: BertConfig, seq_len: int = 8, max_predictions: int = 1) -> dict:
    """BertForPreTraining's params as boxed shapes (jax.eval_shape: no memory, no FLOPs)."""
    batch = bert.dummy_batch(1, seq_len, max_predictions)
    return jax.eval_shape(lambda: bert.BertForPreTraining(cfg).init(jax.random.key(0), **batch))["params"]


def hf_class_count(cfg: BertConfig) -> tuple[str, int, list[str]] | None:
    """(the Hugging Face class this config converts to, its parameter count, bertjax's params it lacks),
    or None for a network no HF class has. A param counts when a row of the family's conversion table
    names it, so a tied tensor (the decoder) counts once, as the class's parameters() does."""
    try:
        family = hf.family_of_config(cfg)
    except ValueError:
        return None
    architecture, table = family.architecture, family.table
    # Rows with {i} stand for every layer (or ALBERT's group) of an unrolled stack.
    named = re.compile("|".join(r"\d+".join(map(re.escape, path.split("{i}"))) for _, path, _ in table))
    unrolled = nn.unbox(abstract_params(dataclasses.replace(cfg, scan_layers=False)))
    count, lacking = 0, []
    for path, leaf in jax.tree_util.tree_leaves_with_path(unrolled):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        if named.fullmatch(name):
            count += int(np.prod(leaf.shape))
        else:
            lacking.append(name)
    return architecture, count, lacking


def print_summary(config) -> None:
    """Every parameter with its shape, logical axes and mesh axes; the counts, beside Hugging Face's."""
    cfg = BertConfig.from_dict(config.model)
    boxed = abstract_params(cfg, config.data.max_seq_length, config.data.max_predictions_per_seq)
    rules = [tuple(rule) for rule in config.logical_axis_rules]
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
    print(f"{'parameter':72} {'shape':>20}  logical axes -> mesh axes")
    for path, leaf in jax.tree_util.tree_leaves_with_path(boxed, is_leaf=is_box):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        mesh_axes = nn.logical_to_mesh_axes(leaf.names, rules)
        print(f"{name:72} {str(leaf.value.shape):>20}  {leaf.names} -> {tuple(mesh_axes)}")
    total = bert.count_params(nn.unbox(boxed))
    encoder = bert.count_params(nn.unbox(boxed["bert"]["encoder"]))
    print(f"\n{cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, vocab {cfg.vocab_size}")
    print(f"parameters: {total:,} in all ({total / 1e6:.1f}M), {encoder:,} in the encoder blocks")
    counted = hf_class_count(cfg)
    if counted is not None:
        architecture, hf_total, lacking = counted
        if hf_total == total:
            print(f"parameters as Hugging Face {architecture} counts them: the same")
        else:
            print(f"parameters as Hugging Face {architecture} counts them: {hf_total:,} ({hf_total / 1e6:.1f}M), "
                  f"without bertjax's {', '.join(lacking)}")
    print(f"parameter memory: {total * np.dtype(cfg.param_dtype).itemsize / 2**20:.1f} MiB as {cfg.param_dtype}")


