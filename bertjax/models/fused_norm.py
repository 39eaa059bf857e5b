"""LayerNorm(residual + dropout(y)) as one Pallas kernel, forward and backward: model.norm_kernel="pallas".

The post-LN block's sum, dropout and norm are three memory-bound passes in XLA's form, and its dropout
mask is drawn as random bits in memory and kept for the backward pass. Here one kernel reads y and the
residual once and writes the output and two floats per row; the keep mask is a hash of (seed, element
index) computed in registers, so no random bits and no mask ever go through memory, and the backward
kernel recomputes it from the same seed.

The kernel targets GPUs (Pallas' Triton backend); elsewhere it runs in interpret mode, which is how the
CPU tests check it against the unfused form (tests/test_fused_norm.py).

Layout: y, residual [..., H] are viewed as rows [R, H]; a program holds [Rb, Hb], Rb = block_rows rows
and the whole of H padded to Hb, the next power of two (Triton's blocks are powers of two: BERT-base's
768 runs as 1024). The padding exists only in registers: loads and stores are masked by row and column,
so nothing is copied to pad R or H, and the last block of rows may be partial.

Shape legend: R rows (every leading axis flattened), H hidden, Rb rows of a block, Hb H padded to a
power of two, G blocks of rows.
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Elements of one program's [Rb, Hb] block: 8 rows of 1024 (BERT-large, base padded), 64 of 128 (tiny).
BLOCK_ELEMENTS = 8192
MAX_BLOCK_ROWS = 64


# ----------------------------------------------------------------------------------------------------
# The keep mask: a counter hash
# ----------------------------------------------------------------------------------------------------

def _fmix32(x):
    """murmur3's finalizer: a bijection on uint32 whose every output bit depends on every input bit."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


def _hash(seed, index):
    """uint32 bits of element `index` under `seed` (both uint32). Two rounds, the seed mixed in before
    each: with one round the masks of two seeds would be the same sequence, its indices XOR-permuted."""
    second_key = _fmix32(seed ^ np.uint32(0x9E3779B9))
    return _fmix32(_fmix32(index ^ seed) ^ second_key)


def _threshold(rate: float) -> np.uint32:
    """Bits below it drop an element: rate to 2^-32. Just below 1 it stays at 2^32 - 1 (keeps one in
    2^32) rather than wrapping to 0 (keeping all)."""
    return np.uint32(min(round(rate * 2**32), 2**32 - 1))


def keep_mask(seed, rows: int, hidden: int, rate: float):
    """[rows, hidden] bool, True where the kernel keeps y's element (row r, column h) under seed: the
    same hash of r * hidden + h, computed outside the kernel (for the reference and the tests)."""
    index = (jnp.arange(rows, dtype=jnp.uint32)[:, None] * np.uint32(hidden)
             + jnp.arange(hidden, dtype=jnp.uint32)[None, :])  # [R, H]; wraps past 2^32 elements
    return _hash(jnp.asarray(seed, jnp.uint32), index) >= _threshold(rate)


# ----------------------------------------------------------------------------------------------------
# The kernels
# ----------------------------------------------------------------------------------------------------

class _Plan(NamedTuple):
    """What the kernels are specialised on (hashable: custom_vjp's static argument)."""

    rows: int  # R
    hidden: int  # H
    block_rows: int  # Rb
    block_hidden: int  # Hb
    dropout: str  # "none" (rate 0) | "hash" | "all" (rate 1: y never reaches the sum)
    threshold: int  # hash bits below it drop (dropout="hash")
    multiplier: float  # 1 / (1 - rate) on kept values
    eps: float
    has_bias: bool
    interpret: bool

    @property
    def num_blocks(self) -> int:
        return pl.cdiv(self.rows, self.block_rows)


def _block_coordinates(plan: _Plan):
    """(row indices [Rb], column indices [Hb], rows inside R [Rb], columns inside H [Hb], both [Rb, Hb])
    of this program's block. Kept 1-D and broadcast with [:, None]: Triton has no slicing of values."""
    rows = pl.program_id(0) * plan.block_rows + jax.lax.iota(jnp.int32, plan.block_rows)
    cols = jax.lax.iota(jnp.int32, plan.block_hidden)
    row_inside, col_inside = rows < plan.rows, cols < plan.hidden
    return rows, cols, row_inside, col_inside, row_inside[:, None] & col_inside[None, :]


def _dropped_y(plan: _Plan, seed_ref, y, rows, cols):
    """y [Rb, Hb] float32 after inverted dropout, and the factor d(that)/dy per element (for backward)."""
    if plan.dropout == "none":
        return y, None
    if plan.dropout == "all":
        return jnp.zeros_like(y), jnp.zeros_like(y)
    index = rows.astype(jnp.uint32)[:, None] * np.uint32(plan.hidden) + cols.astype(jnp.uint32)[None, :]
    keep = _hash(seed_ref[0], index) >= np.uint32(plan.threshold)  # [Rb, Hb]
    factor = jnp.where(keep, np.float32(plan.multiplier), np.float32(0.0))
    return y * factor, factor


def _load(ref, mask):
    return plgpu.load(ref, mask=mask, other=0).astype(jnp.float32)


def _summed(plan: _Plan, seed_ref, y_ref, residual_ref, rows, cols, inside):
    """x = residual + dropout(y) [Rb, Hb] float32 (0 outside R x H), and the dropout factor."""
    y, factor = _dropped_y(plan, seed_ref, _load(y_ref, inside), rows, cols)
    return _load(residual_ref, inside) + y, factor


def _forward_kernel(plan: _Plan, seed_ref, y_ref, residual_ref, scale_ref, *refs):
    bias_ref, (out_ref, mean_ref, rstd_ref) = (refs[0], refs[1:]) if plan.has_bias else (None, refs)
    rows, cols, row_inside, col_inside, inside = _block_coordinates(plan)
    x, _ = _summed(plan, seed_ref, y_ref, residual_ref, rows, cols, inside)
    hidden = np.float32(plan.hidden)
    mean = jnp.sum(x, axis=1) / hidden  # [Rb]; the padding adds 0
    centred = jnp.where(inside, x - mean[:, None], 0.0)
    # The exact two-pass variance, as layers.layer_norm's (use_fast_variance=False).
    rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1) / hidden + np.float32(plan.eps))  # [Rb]
    out = centred * rstd[:, None] * _load(scale_ref, col_inside)[None, :]
    if bias_ref is not None:
        out = out + _load(bias_ref, col_inside)[None, :]
    plgpu.store(out_ref, out.astype(out_ref.dtype), mask=inside)
    plgpu.store(mean_ref, mean, mask=row_inside)
    plgpu.store(rstd_ref, rstd, mask=row_inside)


def _backward_kernel(plan: _Plan, seed_ref, y_ref, residual_ref, scale_ref, mean_ref, rstd_ref, dout_ref,
                     dy_ref, dresidual_ref, dscale_ref, *dbias_ref):
    rows, cols, row_inside, col_inside, inside = _block_coordinates(plan)
    x, factor = _summed(plan, seed_ref, y_ref, residual_ref, rows, cols, inside)
    rstd = _load(rstd_ref, row_inside)[:, None]  # [Rb, 1]
    # 0 outside R x H, so that rows past R add nothing to the partial sums.
    normed = jnp.where(inside, (x - _load(mean_ref, row_inside)[:, None]) * rstd, 0.0)  # [Rb, Hb]
    dout = _load(dout_ref, inside)
    g = dout * _load(scale_ref, col_inside)[None, :]  # d loss / d normed
    hidden = np.float32(plan.hidden)
    dx = rstd * (g - (jnp.sum(g, axis=1) / hidden)[:, None]
                 - normed * (jnp.sum(g * normed, axis=1) / hidden)[:, None])  # [Rb, Hb]
    plgpu.store(dresidual_ref, dx.astype(dresidual_ref.dtype), mask=inside)
    dy = dx if factor is None else dx * factor
    plgpu.store(dy_ref, dy.astype(dy_ref.dtype), mask=inside)
    # This block's share of d scale and d bias: one row of [G, H], summed over G outside.
    plgpu.store(dscale_ref, jnp.sum(dout * normed, axis=0)[None, :], mask=col_inside[None, :])
    if dbias_ref:
        plgpu.store(dbias_ref[0], jnp.sum(dout, axis=0)[None, :], mask=col_inside[None, :])


def _call(plan: _Plan, kernel, name: str, out_shape, in_specs, out_specs, *args):
    # Warps by block size: a starting point, not yet tuned on a GPU.
    params = {} if plan.interpret else dict(
        compiler_params=plgpu.CompilerParams(num_warps=8 if plan.block_rows * plan.block_hidden >= 8192 else 4))
    return pl.pallas_call(functools.partial(kernel, plan), out_shape=out_shape, grid=(plan.num_blocks,),
                          in_specs=in_specs, out_specs=out_specs, interpret=plan.interpret, name=name,
                          **params)(*args)


def _specs(plan: _Plan):
    """BlockSpecs of a [R, H] block, an [H] vector, an [R] per-row vector, a [G, H] partial and the seed."""
    rb, hb = plan.block_rows, plan.block_hidden
    return (pl.BlockSpec((rb, hb), lambda i: (i, 0)), pl.BlockSpec((hb,), lambda i: (0,)),
            pl.BlockSpec((rb,), lambda i: (i,)), pl.BlockSpec((1, hb), lambda i: (i, 0)),
            pl.BlockSpec((1,), lambda i: (0,)))


def _forward(plan: _Plan, y, residual, scale, bias, seed):
    block, vector, per_row, _, seed_spec = _specs(plan)
    stats = jax.ShapeDtypeStruct((plan.rows,), jnp.float32)
    out, mean, rstd = _call(
        plan, _forward_kernel, "residual_dropout_norm_fwd",
        (jax.ShapeDtypeStruct(y.shape, y.dtype), stats, stats),
        [seed_spec, block, block, vector] + ([vector] if plan.has_bias else []),
        (block, per_row, per_row),
        seed, y, residual, scale, *([bias] if plan.has_bias else []))
    return out, (mean, rstd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(plan: _Plan, y, residual, scale, bias, seed):
    return _forward(plan, y, residual, scale, bias, seed)[0]


def _fused_fwd(plan: _Plan, y, residual, scale, bias, seed):
    out, (mean, rstd) = _forward(plan, y, residual, scale, bias, seed)
    # No mask among the residuals: the backward kernel hashes it again from the seed.
    return out, (y, residual, scale, bias, seed, mean, rstd)


def _fused_bwd(plan: _Plan, saved, dout):
    y, residual, scale, bias, seed, mean, rstd = saved
    block, vector, per_row, partial, seed_spec = _specs(plan)
    partial_shape = jax.ShapeDtypeStruct((plan.num_blocks, plan.hidden), jnp.float32)  # [G, H]
    grads = _call(
        plan, _backward_kernel, "residual_dropout_norm_bwd",
        (jax.ShapeDtypeStruct(y.shape, y.dtype), jax.ShapeDtypeStruct(residual.shape, residual.dtype),
         partial_shape, *([partial_shape] if plan.has_bias else [])),
        [seed_spec, block, block, vector, per_row, per_row, block],
        (block, block, partial, *([partial] if plan.has_bias else [])),
        seed, y, residual, scale, mean, rstd, dout)
    dy, dresidual, dscale = grads[:3]
    dbias = jnp.sum(grads[3], axis=0).astype(bias.dtype) if plan.has_bias else None
    return dy, dresidual, jnp.sum(dscale, axis=0).astype(scale.dtype), dbias, None


_fused.defvjp(_fused_fwd, _fused_bwd)


# ----------------------------------------------------------------------------------------------------
# The public function, its reference, and the module
# ----------------------------------------------------------------------------------------------------

def default_block_rows(rows: int, hidden: int) -> int:
    """Rb: BLOCK_ELEMENTS / Hb rows, 8 to 64, and no more than R needs (a power of two)."""
    block_hidden = pl.next_power_of_2(hidden)
    return min(MAX_BLOCK_ROWS, max(8, BLOCK_ELEMENTS // block_hidden), pl.next_power_of_2(max(rows, 1)))


def _check(y, residual, scale, bias, rate: float, block_rows: int | None):
    if y.shape != residual.shape or y.ndim < 1:
        raise ValueError(f"residual_dropout_norm: give y {y.shape} and residual {residual.shape} one shape [..., H]")
    hidden = y.shape[-1]
    for name, vector in (("scale", scale), ("bias", bias)):
        if vector is not None and vector.shape != (hidden,):
            raise ValueError(f"residual_dropout_norm: {name} {vector.shape} must be [H] = ({hidden},)")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"residual_dropout_norm: rate={rate} must be in [0, 1]")
    if block_rows is not None and (block_rows < 1 or block_rows & (block_rows - 1)):
        raise ValueError(f"residual_dropout_norm: block_rows={block_rows} must be a power of two (Triton's blocks)")


def residual_dropout_norm(y, residual, scale, bias, *, rate: float, seed, eps: float, interpret: bool | None = None,
                          block_rows: int | None = None):
    """LayerNorm(residual + dropout(y)) over the last axis, by one kernel each way.

    y, residual: [..., H]; scale: [H]; bias: [H] or None (no bias). Returns y's shape and dtype; the mean
    and the (two-pass) variance are float32 whatever the inputs are. Dropout is inverted (kept values
    scaled by 1 / (1 - rate)), its mask keep_mask(seed, R, H, rate) for seed a uint32 scalar; rate 0:
    none, and the seed is ignored. interpret: None compiles for GPUs and interprets elsewhere.
    """
    _check(y, residual, scale, bias, rate, block_rows)
    shape, hidden = y.shape, y.shape[-1]
    rows = int(np.prod(shape[:-1]))
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    dropout = "none" if rate == 0.0 else "all" if rate == 1.0 else "hash"
    plan = _Plan(rows=rows, hidden=hidden, block_rows=block_rows or default_block_rows(rows, hidden),
                 block_hidden=pl.next_power_of_2(hidden), dropout=dropout,
                 threshold=int(_threshold(rate)) if dropout == "hash" else 0,
                 multiplier=1.0 / (1.0 - rate) if dropout == "hash" else 1.0, eps=float(eps),
                 has_bias=bias is not None, interpret=bool(interpret))
    seed = jnp.zeros((1,), jnp.uint32) if dropout != "hash" else jnp.asarray(seed, jnp.uint32).reshape(1)
    out = _fused(plan, y.reshape(rows, hidden), residual.reshape(rows, hidden), scale, bias, seed)
    return out.reshape(shape)


def reference_residual_dropout_norm(y, residual, scale, bias, *, rate: float, seed, eps: float):
    """The same computation unfused in jnp, with keep_mask's mask (for the tests)."""
    _check(y, residual, scale, bias, rate, None)
    hidden = y.shape[-1]
    y32 = y.astype(jnp.float32)
    if rate == 1.0:
        y32 = jnp.zeros_like(y32)
    elif rate > 0.0:
        keep = keep_mask(seed, int(np.prod(y.shape[:-1])), hidden, rate).reshape(y.shape)
        y32 = jnp.where(keep, y32 / np.float32(1.0 - rate), 0.0)
    x = residual.astype(jnp.float32) + y32
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    out = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps) * scale.astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(y.dtype)


class FusedResidualNorm(nn.Module):
    """LayerNorm(residual + Dropout(y)) by residual_dropout_norm, with the params layers.layer_norm's
    nn.LayerNorm declares (scale, and bias with use_bias; [H], logical axis "embed", ones and zeros), so
    that a checkpoint loads under either norm_kernel."""

    epsilon: float
    rate: float  # hidden dropout
    use_bias: bool = True
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, y, residual, deterministic: bool):
        # y, residual: [..., H]; returns [..., H] in y's dtype.
        hidden = y.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
                           (hidden,), self.param_dtype)
        bias = None
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
                              (hidden,), self.param_dtype)
        rate = 0.0 if deterministic else self.rate
        seed = jax.random.bits(self.make_rng("dropout"), (), jnp.uint32) if rate > 0.0 else None
        return residual_dropout_norm(y, residual, scale, bias, rate=rate, seed=seed, eps=self.epsilon)
