"""Block-local attention as pure functions: blocking, the band, unblocking.

The sequence is cut into nb = ceil(T / W) blocks of W (padded to Tp = nb W);
each query block sees the keys of its own block and of both neighbours, a
band of 3W keys. Heads and blocks share one axis so every tensor stays rank
<= 4, and padding is a CONCATENATION with zeros, so the graph exports to TFLM.
Dense attention under `keras_posenc.ops.band_mask` gives the same result.
"""

from keras_posenc._backend import xp
from keras_posenc._compat import dim


def block_positions(length, window):
    """int32 positions of each block's queries `(nb, W)` and band keys `(nb, 3W)`."""
    blocks = -(-length // window)  # ceil
    query_pos = xp.reshape(xp.range(blocks * window), [blocks, window])
    key_pos = xp.concat([query_pos - window, query_pos, query_pos + window], 1)
    return query_pos, key_pos


def to_blocks(x, window):
    """Queries `(B, N, T, H)` -> `(B, N*nb, W, H)`."""
    blocks = -(-dim(x, 2) // window)
    return _fold(_pad_to(x, blocks * window), blocks, window)


def to_band(x, window):
    """Keys or values `(B, N, T, H)` -> their band `(B, N*nb, 3W, H)`."""
    blocks = -(-dim(x, 2) // window)
    padded = blocks * window
    zeros = xp.zeros_like(x[:, :, :window])  # (B, N, W, H) when T >= W
    if x.shape[2] is None or x.shape[2] < window:  # T may be shorter than W
        shape = xp.concat([xp.shape(x)[:2], [window], xp.shape(x)[3:]], 0)
        zeros = xp.zeros(shape, x.dtype)
    framed = xp.concat([zeros, _pad_to(x, padded), zeros], axis=2)  # Tp + 2W
    views = [
        _fold(framed[:, :, start : start + padded], blocks, window)
        for start in (0, window, 2 * window)
    ]
    return xp.concat(views, axis=2)


def fold_bias(bias):
    """A per-block bias `(nb, N, W, 3W)` -> `(1, N*nb, W, 3W)`."""
    bias = xp.transpose(bias, [1, 0, 2, 3])  # (N, nb, W, 3W)
    return xp.reshape(bias, [1, -1, bias.shape[2], bias.shape[3]])


def band_allowed(
    query_pos,
    key_pos,
    length,
    num_heads,
    key_mask=None,
    query_mask=None,
    causal=False,
    runs=None,
):
    """Boolean `(B or 1, N*nb, W, 3W)`: which band keys each query may see.

    Args:
        query_pos, key_pos: `block_positions(length, window)`.
        length: int or scalar tensor T.
        num_heads: int N.
        key_mask, query_mask: boolean `(B, T)` or None.
        causal: bool, also hide keys `j > i`.
        runs: int `(B, T)` or None, the documents of packed rows
            (`ops.segments.runs`): also hide keys of another run.
    """
    blocks, window = query_pos.shape[0], query_pos.shape[1]
    if blocks is None:
        blocks = xp.shape(query_pos)[0]
    allowed = xp.logical_and(key_pos >= 0, key_pos < length)[:, None, :]
    if causal:
        allowed = xp.logical_and(allowed, key_pos[:, None, :] <= query_pos[:, :, None])
    allowed = xp.broadcast_to(allowed, [blocks, window, 3 * window])[None, None]
    padded = blocks * window
    if key_mask is not None:
        keys = band_of_rows(xp.cast(key_mask, xp.bool), window, False)  # (B, nb, 3W)
        allowed = xp.logical_and(allowed, keys[:, None, :, None, :])
    if query_mask is not None:
        rows = xp.reshape(_pad_mask(query_mask, padded), [-1, blocks, window])
        allowed = xp.logical_and(allowed, rows[:, None, :, :, None])
    if runs is not None:
        query_runs = rows_of_blocks(runs, window, -1)  # (B, nb, W)
        key_runs = band_of_rows(runs, window, -1)  # (B, nb, 3W)
        same = xp.equal(query_runs[:, :, :, None], key_runs[:, :, None, :])
        allowed = xp.logical_and(allowed, same[:, None])  # (B, 1, nb, W, 3W)
    allowed = xp.broadcast_to(
        allowed, [xp.shape(allowed)[0], num_heads, blocks, window, 3 * window]
    )
    return xp.reshape(allowed, [-1, num_heads * blocks, window, 3 * window])


def from_blocks(context, num_heads, length):
    """`(B, N*nb, W, Hv)` -> `(B, N, T, Hv)`."""
    blocks = dim(context, 1) // num_heads
    context = xp.reshape(
        context, [-1, num_heads, blocks * context.shape[2], context.shape[-1]]
    )
    return context[:, :, :length]


def _fold(x, blocks, window):
    """`(B, N, Tp, H)` -> `(B, N*nb, W, H)`."""
    return xp.reshape(x, [-1, x.shape[1] * blocks, window, x.shape[-1]])


def _pad_to(x, padded):
    """Zero-pads axis 2 of `(B, N, T, H)` to `padded` with a concatenation."""
    extra = padded - dim(x, 2)
    if isinstance(extra, int) and extra == 0:
        return x
    shape = xp.concat([xp.shape(x)[:2], [extra], xp.shape(x)[3:]], 0)
    return xp.concat([x, xp.zeros(shape, x.dtype)], axis=2)


def band_of_rows(values, window, fill):
    """Per-token values `(B, T)` -> each block's band of them `(B, nb, 3W)`.

    Slots before the first and past the last token hold `fill`.
    """
    blocks = -(-dim(values, 1) // window)
    padded = blocks * window
    values = _pad_values(values, padded, fill)
    edge = xp.fill([xp.shape(values)[0], window], xp.cast(fill, values.dtype))
    framed = xp.concat([edge, values, edge], axis=1)
    views = [
        xp.reshape(framed[:, start : start + padded], [-1, blocks, window])
        for start in (0, window, 2 * window)
    ]
    return xp.concat(views, axis=2)


def rows_of_blocks(values, window, fill):
    """Per-token values `(B, T)` -> each block's queries' values `(B, nb, W)`."""
    blocks = -(-dim(values, 1) // window)
    return xp.reshape(_pad_values(values, blocks * window, fill), [-1, blocks, window])


def _pad_values(values, padded, fill):
    """Pads axis 1 of `(B, T)` to `padded` with `fill`."""
    extra = padded - dim(values, 1)
    tail = xp.fill([xp.shape(values)[0], extra], xp.cast(fill, values.dtype))
    return xp.concat([values, tail], 1)


def _pad_mask(mask, padded):
    return _pad_values(xp.cast(mask, xp.bool), padded, False)
