"""Position functions: sinusoids, distances, T5 buckets, clipping, ALiBi.

Shape letters (see docs/glossary.md): B batch, T query length, S key length, N heads,
D model width, K buckets/table size.
"""

import math

import numpy as np

from keras_posenc._backend import xp
from keras_posenc._compat import rank


def position_range(length, start_index=0):
    """Float32 positions `start_index, ..., start_index + length - 1`, shape (T,)."""
    return xp.range(length, dtype=xp.float32) + xp.cast(start_index, xp.float32)


def sinusoid(positions, width, max_wavelength=10000.0):
    """Vaswani et al. sinusoids: sine on even features, cosine on odd ones.

    Feature `i` of position `p` is `sin(p / max_wavelength ** (2 * (i // 2) /
    width))` for even `i` and `cos(...)` for odd `i`, as keras-hub's
    `SinePositionEncoding`.

    Args:
        positions: float tensor of any shape `(...)`.
        width: int, the feature width D.
        max_wavelength: float, the longest wavelength.

    Returns:
        A float32 tensor of shape `(..., D)`.
    """
    positions = xp.cast(positions, xp.float32)
    index = np.arange(width)
    exponent = (2 * (index // 2)).astype(np.float32) / np.float32(width)
    inverse_timescale = xp.constant(
        np.power(np.float32(1.0 / max_wavelength), exponent), xp.float32
    )
    angles = positions[..., None] * inverse_timescale  # (..., D)
    is_cos = xp.constant((index % 2).astype(np.float32))
    return xp.sin(angles) * (1.0 - is_cos) + xp.cos(angles) * is_cos


def relative_positions(query_positions, key_positions):
    """Key minus query position `j - i`: `(..., T, S)` from `(..., T)`, `(..., S)`."""
    return key_positions[..., None, :] - query_positions[..., :, None]


def t5_relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """T5 / Mesh TensorFlow `_relative_position_bucket`, bit for bit.

    Args:
        relative_position: int32 tensor, `key_position - query_position`.
        bidirectional: bool, whether keys after the query get their own buckets.
        num_buckets: int, the number of buckets K.
        max_distance: int, distances at and beyond it share the last bucket.

    Returns:
        An int32 tensor of the same shape with values in `[0, num_buckets)`.
    """
    relative_position = xp.cast(relative_position, xp.int32)
    bucket = xp.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + xp.cast(n < 0, xp.int32) * num_buckets
        n = xp.abs(n)
    else:
        n = xp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # max(n, 1) only keeps log(0) out of the unused branch of tf.where.
    scaled = (
        xp.math.log(xp.cast(xp.maximum(n, 1), xp.float32) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    )
    val_if_large = xp.minimum(max_exact + xp.cast(scaled, xp.int32), num_buckets - 1)
    return bucket + xp.where(is_small, n, val_if_large)


def clipped_relative_index(relative_position, max_distance, bidirectional=True):
    """Shaw et al. clipping, shifted to a table index.

    Bidirectional: `clip(j - i, -M, M) + M` in `[0, 2M]`. Causal:
    `clip(j - i, -M, 0) + M` in `[0, M]`.
    """
    upper = max_distance if bidirectional else 0
    relative_position = xp.cast(relative_position, xp.int32)
    return xp.clip_by_value(relative_position, -max_distance, upper) + max_distance


def alibi_slopes(num_heads):
    """The fixed geometric head slopes of ALiBi (Press et al.), float32 `(N,)`.

    For a power of two `n` the slopes are `2^(-8/n), 2^(-16/n), ...`; for other
    counts, the paper's rule: the slopes of the closest lower power of two, then
    every other slope of twice that power.
    """

    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    def slopes(n):
        if math.log2(n).is_integer():
            return power_of_two(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_two(closest) + slopes(2 * closest)[0::2][: n - closest]

    return np.asarray(slopes(num_heads), dtype=np.float32)


def alibi_bias(relative_position, num_heads, bidirectional=True):
    """ALiBi bias `(..., N, T, S)` from relative positions `(..., T, S)`.

    Causal: `-m_h * |j - i|` (keys after the query are masked by the caller).
    Bidirectional: a symmetric penalty cannot tell left from right, so heads
    alternate direction: even heads look left (slope `m_h` on keys before the
    query, `2 m_h` after it) and odd heads look right (the mirror image).
    """
    slopes = xp.constant(alibi_slopes(num_heads))
    distance = xp.cast(relative_position, xp.float32)[..., None, :, :]
    if not bidirectional:
        return -slopes[:, None, None] * xp.abs(distance)
    looks_left = (np.arange(num_heads) % 2 == 0).astype(np.float32)
    looks_left = xp.constant(looks_left)
    left_slope = slopes * (2.0 - looks_left)  # slope for keys before the query
    right_slope = slopes * (1.0 + looks_left)  # slope for keys after the query
    before = xp.nn.relu(-distance)
    after = xp.nn.relu(distance)
    return -(left_slope[:, None, None] * before + right_slope[:, None, None] * after)


def clipped_table_mean(
    table, query_length, key_length, start_index=0, causal=False, positions=None
):
    """`mean_j table[clip(j - i, -M, M) + M]` for every query `i`, in O(T*D).

    Equals averaging the dense `(T, S, D)` relative tensor over keys without
    building it: a prefix sum over the `(2M + 1, D)` table gives each query's
    run of unclipped distances, and the clipped tails are counted.

    Args:
        table: float tensor `(2M + 1, D)`, one vector per clipped distance.
        query_length: int or scalar tensor T.
        key_length: int or scalar tensor S, or a `(B,)` tensor of key counts
            (real tokens per example): the result is then `(B, T, D)`.
        start_index: position of the first query (keys are at `0 .. S-1`).
        causal: bool, average over the keys `j <= i` only (`key_length` is
            then unused): the mean no longer depends on later tokens.
        positions: optional int `(B, T)` query positions in place of
            `start_index ...` (packed rows, `ops.segments.positions`), with
            `key_length` then `(B, T)`: each query's own key count.

    Returns:
        A float32 tensor `(T, D)` (`(B, T, D)` for per-example key counts or
        positions).
    """
    table = xp.cast(table, xp.float32)
    rows = table.shape[0]
    m = (rows - 1) // 2
    if positions is None:
        i = xp.range(query_length) + start_index  # (T,)
    else:
        i = xp.cast(positions, xp.int32)  # (B, T)
    keys = xp.convert_to_tensor(key_length)
    if rank(keys) == 1 and positions is None:  # (B, 1) against (T,)
        keys = keys[:, None]
    first, last = -i, keys - 1 - i  # distance range of each query
    count = xp.cast(keys, xp.float32)[..., None]
    if causal:
        last, count = xp.zeros_like(i), xp.cast(i + 1, xp.float32)[..., None]
    left = xp.maximum(0, xp.minimum(last, -m - 1) - first + 1)  # count below -M
    right = xp.maximum(0, last - xp.maximum(first, m + 1) + 1)  # count above M
    lo = xp.clip_by_value(xp.maximum(first, -m), -m, m + 1) + m
    hi = xp.maximum(xp.minimum(last, m) + m + 1, lo)
    lo = xp.broadcast_to(lo, xp.shape(hi))
    prefix = xp.concat([xp.zeros_like(table[:1]), xp.cumsum(table, axis=0)], 0)
    middle = xp.gather(prefix, hi) - xp.gather(prefix, lo)  # (T, D) or (B, T, D)
    tails = (
        xp.cast(left, xp.float32)[..., None] * table[0]
        + xp.cast(right, xp.float32)[..., None] * table[rows - 1]
    )
    return (middle + tails) / count


def dense_relative_table(table, query_length, key_length, start_index=0):
    """The dense relative tensor `table[clip(j - i, -M, M) + M]`, `(T, S, D)`.

    The `(B, T, S, D)`-style input of `GatedPositionFusion` built from a
    `(2M + 1, D)` table (memory T*S*D; `clipped_table_mean` averages it
    without building it). Queries sit at `start_index ...`, keys at `0 ...`.
    """
    m = (table.shape[0] - 1) // 2
    relative = relative_positions(
        position_range(query_length, start_index), position_range(key_length)
    )  # (T, S)
    index = clipped_relative_index(xp.round(relative), m)
    return xp.gather(table, index)  # (T, S, D)


def grid_coordinates(index, grid_shape):
    """Row-major grid coordinates `(..., C)` float32 of flat token indices `(...)`."""
    index = xp.cast(index, xp.int32)
    coordinates = []
    for size in reversed(grid_shape):
        coordinates.append(index % size)
        index //= size
    return xp.cast(xp.stack(coordinates[::-1], axis=-1), xp.float32)
