"""Contextual positions (CoPE): positions counted by gates on the logits.

Pure float32 functions of the attention's own logits and queries. The
counts run over every query-key pair: they are summed in blocks by a small
triangular product (`running_sum`), not by TensorFlow's one-core scan.
"""

import functools

import numpy as np
import tensorflow as tf

from keras_posenc._backend import IS_TENSORFLOW, xp
from keras_posenc._compat import rank
from keras_posenc.ops._gradient import registered_gradient

# Keys per block of `running_sum`: a (16, 16) triangle keeps the product's
# cost near a plain scan's while it runs as a matrix product on every core.
# Measured forward+backward on (16, 4, 512, 512), 2-core AMD EPYC: blocks of
# 8 / 16 / 32 / 64 keys 122 / 110 / 116 / 382 ms, `tf.cumsum` 145 ms (64
# was chosen on a Xeon; there its product ran faster).
SCAN_BLOCK = 16


def contextual_positions(
    logits, mask, max_position, bidirectional=False, query_offset=None
):
    """`p[i, j] = sum_{t >= j} sigmoid(logits[i, t])` over unmasked keys `(..., T, S)`.

    Under a causal mask the sum runs over `t = j .. i`: how many keys from
    `j` to the query "count" (each gate in [0, 1]), clamped to
    `max_position`.

    With `bidirectional=True` the count runs from the query to the key on
    either side (the query `i` is key `i + query_offset`, by default
    `i + S - T`): `sum_{t=j..i}` for a key
    at or before it, `sum_{t=i..j}` for a key after it, each clamped to
    `max_position = P`. A key after the query is returned as `P + 1 + p`, so
    one table of `2 (P + 1)` rows holds both sides and an interpolation never
    crosses from one side to the other.
    """
    gates = xp.sigmoid(xp.cast(logits, xp.float32))
    if mask is not None:
        gates = gates * xp.cast(mask, xp.float32)
    if not bidirectional:
        positions = running_sum(gates, reverse=True)
        return xp.minimum(positions, float(max_position))
    queries, keys = xp.shape(gates)[-2], xp.shape(gates)[-1]
    if query_offset is None:
        query_offset = keys - queries
    query_keys = xp.range(queries) + query_offset  # (T,): each query's key
    after = xp.cast(xp.range(keys)[None, :] > query_keys[:, None], xp.float32)
    from_query = xp.cast(xp.range(keys)[None, :] >= query_keys[:, None], xp.float32)
    before = running_sum(gates * (1.0 - after), reverse=True)  # 0 after the query
    beyond = running_sum(gates * from_query) * after  # 0 at or before it
    limit = float(max_position)
    # One clamp for both sides (their counts never overlap), then the offset.
    return xp.minimum(before + beyond, limit) + (limit + 1.0) * after


def interpolated_logits(queries, embeddings, positions, fused=False):
    """`q_i . e[p]` `(B, N, T, S)`, linear between `e[floor(p)]` and `e[ceil(p)]`.

    Args:
        queries: `(B, T, N, H)` heads-last queries.
        embeddings: `(H, P)` position embeddings (shared by the heads).
        positions: float32 `(B, N, T, S)` in `[0, P - 1]`.
        fused: interpolate in one XLA-compiled function (the layer's
            training path; 92 -> 14 ms forward at B=16, T=S=512:
            `docs/measurements.md`); exports trace the plain ops.
    """
    q = xp.cast(queries, xp.float32)
    per_position = xp.einsum("btnh,hp->bntp", q, xp.cast(embeddings, xp.float32))
    interpolate = _compiled_interpolation if fused else _interpolate
    return interpolate(per_position, positions)


def _interpolate(per_position, positions):
    """`per_position` `(B, N, T, P)` read at fractional `positions` `(B, N, T, S)`."""
    low = xp.floor(positions)
    weight = positions - low  # (B, N, T, S) in [0, 1)
    batch_dims = rank(positions) - 1
    below = xp.gather(per_position, xp.cast(low, xp.int32), batch_dims=batch_dims)
    high = xp.cast(xp.math.ceil(positions), xp.int32)
    above = xp.gather(per_position, high, batch_dims=batch_dims)
    return below * (1.0 - weight) + above * weight


#: On JAX and PyTorch, `_interpolate` as written (Keras compiles the step).
_compiled_interpolation = (
    tf.function(_interpolate, jit_compile=True, autograph=False)
    if IS_TENSORFLOW
    else _interpolate
)


def running_sum(x, reverse=False):
    """`tf.cumsum(x, axis=-1, reverse=reverse)`, in blocks when the axis is long.

    TensorFlow's CPU scan runs on one core; here each block of `SCAN_BLOCK`
    values is summed by a product with a triangle of ones, and the blocks'
    totals (each block's first or last sum) by the same running sum, a 16th
    as long (a plain scan only once it is shorter than two blocks). The gradient is
    the running sum of the upstream gradient the other way (as a scan's),
    not the product's, slices' and broadcasts' own (`benchmarks/results/speed_steps.md`
    measures the whole layer, `cope`). The order of the additions differs from
    the plain scan's: sums agree to float32 rounding. Axes shorter than two
    blocks, or of unknown length, take the plain scan.
    """
    size = x.shape[-1]
    if size is None or size < 2 * SCAN_BLOCK:
        return xp.cumsum(x, axis=-1, reverse=reverse)
    blocked = functools.partial(_blocked_sum, reverse=reverse)
    return (_reverse_sum if reverse else _forward_sum)(blocked, x)


def _blocked_sum(x, reverse):
    """`running_sum`'s values on an axis of known length, without its gradient."""
    size = x.shape[-1]
    blocks = -(-size // SCAN_BLOCK)
    pad = blocks * SCAN_BLOCK - size
    if pad:  # on the side the sums start from: zeros add nothing
        side = [pad, 0] if reverse else [0, pad]
        x = xp.pad(x, [[0, 0]] * (rank(x) - 1) + [side])
    padded_shape = xp.shape(x)
    lead = padded_shape[:-1]
    x = xp.reshape(x, xp.concat([lead, [blocks, SCAN_BLOCK]], 0))
    ones = np.tril(np.ones((SCAN_BLOCK, SCAN_BLOCK), np.float32))  # [t, j]: t >= j
    triangle = xp.constant(ones if reverse else ones.T, dtype=x.dtype)
    within = xp.einsum("...bt,tj->...bj", x, triangle)
    totals = within[..., 0] if reverse else within[..., -1]  # (..., blocks)
    earlier = running_sum(totals, reverse=reverse) - totals  # exclusive
    sums = xp.reshape(within + earlier[..., None], padded_shape)
    if pad:
        return sums[..., pad:] if reverse else sums[..., :size]
    return sums


_forward_sum = registered_gradient("KerasPosencRunningSum")(
    lambda upstream: [running_sum(upstream, reverse=True)]
)
_reverse_sum = registered_gradient("KerasPosencReverseRunningSum")(
    lambda upstream: [running_sum(upstream)]
)
