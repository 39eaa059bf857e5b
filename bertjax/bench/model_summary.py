"""The model a config builds, without building it: every parameter with its shape, logical axis names and
the mesh axes the config's rules give it, the parameter count beside the count of the Hugging Face class the
model converts to, and the parameter memory; what `python -m bertjax.summary` prints. Shapes come from
jax.eval_shape, so even configs/large.py costs no memory. With --memory, the train step is also compiled
(never run) for one device of this machine, and XLA's memory analysis gives what that device must hold."""

import dataclasses
import re

import flax.linen as nn
import jax
import numpy as np

from bertjax.interop import hf
from bertjax.models import bert
from bertjax.models.config import BertConfig
from bertjax.bench import tpu_plan
from bertjax.runs.start import make_layout
from bertjax.training import pretraining_step
from bertjax.training import state as train_state


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
    # Rows with {i} stand for every layer (or ALBERT's group) of an unrolled stack, {j} for each of a MobileBERT
    # layer's extra feed-forward networks.
    named = re.compile("|".join(r"\d+".join(map(re.escape, re.split(r"\{[ij]\}", path))) for _, path, _ in table))
    unrolled = nn.unbox(abstract_params(dataclasses.replace(cfg, scan_layers=False)))
    count, lacking = 0, []
    for path, leaf in jax.tree_util.tree_leaves_with_path(unrolled):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        if named.fullmatch(name):
            count += int(np.prod(leaf.shape))
        else:
            lacking.append(name)
    return architecture, count, lacking


def step_memory(config) -> dict:
    """Bytes one device holds for the pretraining step at the config's train.batch_size x
    data.max_seq_length: parameters, optimizer state, the batch, and XLA's temporaries (the activations
    the backward pass keeps, and scratch), from the memory analysis of the step compiled for this
    machine's first device; nothing is allocated."""
    grad_accum = config.train.grad_accum_steps
    layout = make_layout(config.mesh, config.logical_axis_rules, config.train.batch_size, grad_accum,
                         jax.devices()[:1])
    init_key, dropout_key = train_state.root_keys(config.train.seed, config.train.dropout_rng)
    setup = pretraining_step.setup(config, layout.mesh, layout.rules, init_key)
    step_fn, _ = setup.compile_steps(layout.data_sharding, grad_accum)
    batch = tpu_plan.abstract_batch(config, config.train.batch_size, layout.data_sharding)
    replicated = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec())
    key = jax.ShapeDtypeStruct(dropout_key.shape, dropout_key.dtype, sharding=replicated)
    with jax.set_mesh(layout.mesh):
        analysis = step_fn.lower(setup.abstract_state, batch, key).compile().memory_analysis()
    return dict(device=jax.devices()[0].platform, dtype=setup.bert_config.dtype,
                remat_policy=setup.bert_config.remat_policy,
                params=tpu_plan.bytes_per_device(setup.abstract_state.params),
                opt_state=tpu_plan.bytes_per_device(setup.abstract_state.opt_state),
                batch=tpu_plan.bytes_per_device(batch), temporaries=int(analysis.temp_size_in_bytes))


def memory_line(config, memory: dict) -> str:
    """step_memory as one line, in MiB."""
    mib = {key: memory[key] / 2**20 for key in ("params", "opt_state", "batch", "temporaries")}
    return (f"train step on one {memory['device']} device, batch {config.train.batch_size} x "
            f"{config.data.max_seq_length}, {memory['dtype']} compute, remat {memory['remat_policy']}: parameters "
            f"{mib['params']:,.1f} MiB, optimizer state {mib['opt_state']:,.1f} MiB, batch {mib['batch']:,.1f} MiB, "
            f"activations and temporaries {mib['temporaries']:,.1f} MiB; {sum(mib.values()):,.1f} MiB in all "
            f"(XLA's memory analysis of the compiled step)")


def print_summary(config, memory: bool = False) -> None:
    """Every parameter with its shape, logical axes and mesh axes; the counts, beside Hugging Face's;
    with memory, what the compiled train step holds (step_memory)."""
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
    if memory:
        print(memory_line(config, step_memory(config)))


