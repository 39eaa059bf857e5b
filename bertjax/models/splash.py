"""Self-attention through the Pallas splash attention kernel (TPUs): model.attention_impl="splash".

The kernel keeps packed sequences apart by segment ids (the k-th sequence of a row attends only to its
own tokens; padding is segment 0, so real tokens never see it) and skips the blocks a mask leaves empty,
which the dense mask of the XLA form cannot. Off TPUs it runs in Pallas' interpret mode: the same
kernel, executed op by op, which is how the CPU tests check it against the XLA form.

Shapes: B batch, S sequence, N heads, D head size.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash

# The kernel's tiles: the TPU's 128 lanes. On a TPU sequence lengths must be multiples of it.
BLOCK = 128


def _kernel(seq_len: int, num_heads: int, half_window: int, interpret: bool):
    """The splash kernel for [N, S, D] inputs: full attention, or a band |query - key| <= half_window
    (half_window > 0, ModernBERT's local layers; within a packed sequence its tokens are contiguous, so
    the band on row offsets is the band on positions). Made inside each trace, not cached: its mask
    tables become constants of the trace that made them."""
    shape = (seq_len, seq_len)
    if half_window:
        head = splash.LocalMask(shape, window_size=(half_window, half_window), offset=0)
    else:
        head = splash.FullMask(shape)
    block = min(BLOCK, seq_len)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return splash.make_splash_mha(splash.MultiHeadMask([head] * num_heads), block_sizes=sizes, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)


def check_length(seq_len: int) -> None:
    if seq_len % BLOCK:
        raise ValueError(f"model.attention_impl='splash' tiles the sequence by {BLOCK}: make data.max_seq_length "
                         f"a multiple of {BLOCK} (it is {seq_len}), or set model.attention_impl='xla'")


def _local_attention(q, k, v, segments, *, half_window: int, is_local, interpret: bool):
    """One device's share: q, k, v [b, S, N, D], segments [b, S] int -> context [b, S, N, D]."""
    seq_len, num_heads, head_dim = q.shape[1:]
    scale = np.float32(1.0 / np.sqrt(head_dim)).astype(q.dtype)  # the kernel does not scale the logits

    def per_row(kernel, q, k, v, segments):  # [S, N, D] each, [S]
        ids = splash.SegmentIds(q=segments, kv=segments)
        out = kernel(jnp.swapaxes(q * scale, 0, 1), jnp.swapaxes(k, 0, 1), jnp.swapaxes(v, 0, 1), segment_ids=ids)
        return jnp.swapaxes(out, 0, 1)

    def attend(half):
        kernel = _kernel(seq_len, num_heads, half, interpret)
        return jax.vmap(functools.partial(per_row, kernel))(q, k, v, segments)

    if is_local is None:
        return attend(half_window)
    # A scanned stack of local and global layers: both kernels compiled, the layer's kind picks one.
    return jax.lax.cond(is_local, lambda: attend(half_window), lambda: attend(0))


def splash_attention(q, k, v, segments, *, half_window: int = 0, is_local=None, interpret: bool | None = None):
    """softmax(q k^T / sqrt(D)) v over the keys of each query's own segment (and band).

    q, k, v: [B, S, N, D]; segments: [B, S] int, the sequence each token belongs to (0 at padding);
    half_window: 0 (full) or the band's reach; is_local: None, or a traced [] bool choosing the band
    (True) or full attention (a scanned stack). Under a mesh the kernel runs per device by shard_map,
    over the batch and heads as the logical rules shard them. interpret: default off TPUs."""
    mesh = jax.sharding.get_abstract_mesh()
    if interpret is None:  # the mesh's devices, not this host's backend: plan compiles for TPUs on a CPU
        platform = (jax.default_backend() if mesh.empty or mesh.abstract_device is None
                    else mesh.abstract_device.platform)
        interpret = platform != "tpu"
    if not interpret:
        check_length(q.shape[1])
    segments = segments.astype(jnp.int32)
    local = functools.partial(_local_attention, half_window=half_window, is_local=is_local, interpret=interpret)
    if mesh.empty:
        return local(q, k, v, segments)
    spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
    if spec[1] is not None or spec[3] is not None:
        raise ValueError("model.attention_impl='splash' needs whole sequences and heads on each device: the "
                         "logical_axis_rules shard 'length' or 'kv'; set model.attention_impl='xla'")
    row = jax.sharding.PartitionSpec(spec[0], None)
    in_specs = (spec, spec, spec, row)
    if is_local is not None:
        return jax.shard_map(lambda q, k, v, s, flag: _local_attention(q, k, v, s, half_window=half_window,
                                                                       is_local=flag, interpret=interpret),
                             mesh=mesh, in_specs=in_specs + (jax.sharding.PartitionSpec(),), out_specs=spec,
                             check_vma=False)(q, k, v, segments, is_local)
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec, check_vma=False)(q, k, v, segments)
