"""python -m bertjax.summary --config=configs/base.py: the model a config builds, without building it.

Prints every parameter with its shape, logical axis names and the mesh axes the config's rules give it,
then the parameter count. Shapes come from jax.eval_shape, so even configs/large.py costs no memory.
"""

import flax.linen as nn
import jax
import numpy as np
from absl import app
from ml_collections import config_flags

from bertjax import console
from bertjax.models import bert


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        config=config_flags.DEFINE_config_file("config", None, "A configs/<size>.py file.", lock_config=True),
    )


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = args.config
    cfg = bert.BertConfig.from_dict(config.model)
    batch = bert.dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq)
    boxed = jax.eval_shape(lambda: bert.BertForPreTraining(cfg).init(jax.random.key(0), **batch))["params"]
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
    print(f"parameter memory: {total * np.dtype(cfg.param_dtype).itemsize / 2**20:.1f} MiB as {cfg.param_dtype}")


def entry():
    """`python -m bertjax.summary` as a console program."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
