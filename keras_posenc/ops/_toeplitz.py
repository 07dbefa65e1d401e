"""The Toeplitz expansion of a bias on distinct distances, with a light gradient."""

import tensorflow as tf

from keras_posenc._backend import xp
from keras_posenc.ops._gradient import registered_gradient

#: Elements per head of the largest block of rows whose diagonals the
#: gradient of `toeplitz` sums at once: its skew copies twice that.
TOEPLITZ_BLOCK = 2**20


@tf.autograph.experimental.do_not_convert
def toeplitz(row, query_length, key_length):
    """`(N, T, S)` with `out[n, i, j] = row[n, j - i + T - 1]`, from `(N, T + S - 1)`.

    Expands a bias on the distinct distances to the query-key grid: the
    forward gathers whole `(N,)` columns. The backward sums each diagonal of
    the upstream gradient with a skew (rows reversed, each padded by T, so
    that a reshape turns diagonals into columns) and one reduction, instead
    of a gather's scatter: in a plain graph 2.6x faster forward+backward at
    T=2048. Under XLA the scatter alone is faster
    (`benchmarks/results/profile_attention.md`), but not in the attention
    layer, where it also has XLA copy the logits' gradient to the gather's
    `(T, S, N)` layout: a T5 layer's forward+backward at B=8 T=512 D=256
    N=8, 83 -> 74 ms with the skew (`docs/measurements.md`). With static
    lengths, the skew runs on blocks of at most `TOEPLITZ_BLOCK` elements
    per head, so its copies stay small next to the `(N, T, S)` gradient.
    """
    t, s = query_length, key_length
    index = xp.range(s)[None, :] - xp.range(t)[:, None] + (t - 1)  # (T, S)

    def forward(row):
        return xp.transpose(xp.gather(xp.transpose(row), index), [2, 0, 1])

    return _expand(forward, row)


@registered_gradient("KerasPosencToeplitz")
def _expand(upstream):
    """`(N, T, S)` upstream -> `[(N, T + S - 1)]`, its diagonal sums; with
    static lengths, on blocks of at most `TOEPLITZ_BLOCK` elements per head."""
    t, s = upstream.shape[1], upstream.shape[2]
    if t is None or s is None:
        shape = xp.shape(upstream)
        return [_diagonal_sums(upstream, shape[1], shape[2])]
    rows = max(1, min(t, TOEPLITZ_BLOCK // s))
    blocks = []
    for start in range(0, t, rows):  # block distances -(c-1)-start ..
        c = min(rows, t - start)
        sums = _diagonal_sums(upstream[:, start : start + c], c, s)
        blocks.append(xp.pad(sums, [[0, 0], [t - c - start, start]]))
    return [xp.add_n(blocks)]


def _diagonal_sums(upstream, t, s):
    """`(N, T, S)` -> `(N, T + S - 1)`: the sum of each diagonal `j - i`."""
    heads = xp.shape(upstream)[0]
    skewed = xp.pad(xp.reverse(upstream, [1]), [[0, 0], [0, 0], [0, t]])
    skewed = xp.reshape(skewed, [heads, -1])[:, : t * (s + t - 1)]
    return xp.reduce_sum(xp.reshape(skewed, [heads, t, s + t - 1]), axis=1)
