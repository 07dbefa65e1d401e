"""LSH attention as pure functions (Kitaev et al. 2020, Reformer).

Shared query-key heads are hashed by random rotations into K buckets
(`argmax([xR, -xR])`), sorted by (bucket, position), cut into chunks of C
(the bucket size); each chunk's queries attend to the keys of their own
chunk and of the chunk before it in the sorted order, the sort is undone,
and the `num_hashes` rounds are combined by their log-sum-exp. Time and
memory grow as `T log T` (the sort) plus `T C` (the chunks).

Conventions (Reformer's): keys are the queries' unit vectors; a query scores
itself at `SELF_VALUE` so it attends to itself only when nothing else is
allowed; masked keys (Keras masks, padding) sort past every bucket, so they
never take a real token's place in a chunk; the first chunk has no chunk
before it (no wrap-around); and each row hashes into the bucket count of
its real tokens (`bucket_count` of their number), so padding never changes
a real token's bucket, chunk or output.
"""

import numpy as np
import tensorflow as tf

from keras_posenc._backend import IS_TENSORFLOW, xp
from keras_posenc._compat import dim, dtype_name, is_integer, rank
from keras_posenc.ops.attention import FLOAT_MASK_VALUE

#: The logit of a query against itself (Reformer's self mask): above a
#: masked key, so a query with nothing else to see attends to itself.
SELF_VALUE = -1e5


def bucket_count(length, bucket_size):
    """K, the number of hash buckets of a length: the chunk count, even, >= 2.

    `ceil(T / C)` rounded up to even (the rotations hash into `[xR, -xR]`),
    2 at least; int for a static length, else a tensor of the lengths' shape.
    """
    chunks = -(-length // bucket_size)
    return (
        xp.maximum(chunks + chunks % 2, 2)
        if xp.is_tensor(chunks)
        else max(chunks + chunks % 2, 2)
    )


def random_rotations(num_hashes, head_dim, buckets, seed):
    """Float32 `(R, H, K/2)` rotations of the hashing, a function of the seed.

    Column `k` does not depend on K: the rotations of fewer buckets are the
    first columns of those of more (drawn `(K/2, R, H)`, a counter-based
    generator's prefix), so a padded row hashes its real tokens as the
    same row unpadded does (`hash_buckets`' `row_buckets`).
    """
    shape = [buckets // 2, num_hashes, head_dim]
    if xp.is_tensor(buckets):
        shape = xp.stack(shape)
    # Philox by name: the default algorithm differs under XLA.
    drawn = tf.random.stateless_normal(
        shape, seed=tf.constant([seed, 0], tf.int32), alg="philox"
    )
    if not IS_TENSORFLOW:  # TensorFlow's Philox draws, the same on every backend
        drawn = xp.constant(drawn.numpy())
    return xp.transpose(drawn, [1, 2, 0])


def hash_buckets(vectors, rotations, row_buckets=None):
    """int32 buckets `(B, N, R, T)` of vectors `(B, N, T, H)`.

    In `[0, K)` of the rotations' K; with `row_buckets` (int `(B,)`, even,
    at most K) row b hashes into its own `row_buckets[b]`, on the first
    `row_buckets[b] / 2` rotation columns, as it would alone.
    """
    rotated = xp.einsum("bnth,rhk->bnrtk", xp.cast(vectors, xp.float32), rotations)
    if row_buckets is None:
        both = xp.concat([rotated, -rotated], axis=-1)  # (B, N, R, T, K)
        return xp.argmax(both, axis=-1, output_type=xp.int32)
    half = dim(rotations, 2)
    row_half = xp.reshape(xp.cast(row_buckets, xp.int32) // 2, [-1, 1, 1, 1, 1])
    kept = xp.range(half) < row_half  # (B, 1, 1, 1, K/2)
    lowest = float(np.finfo(np.float32).min)
    both = xp.concat(
        [xp.where(kept, rotated, lowest), xp.where(kept, -rotated, lowest)], axis=-1
    )
    index = xp.argmax(both, axis=-1, output_type=xp.int32)  # (B, N, R, T)
    return xp.where(index < half, index, index - half + row_half[..., 0])


def lsh_attention(
    query,
    key,
    value,
    num_hashes,
    bucket_size,
    seed,
    key_mask=None,
    causal=False,
    runs=None,
    pair_bias=None,
    dropout=None,
):
    """Context `(B, N, T, Hv)` of LSH attention over heads-first heads.

    Args:
        query: `(B, N, T, H)` scaled query heads.
        key: `(B, N, T, H)` the shared query-key heads (normalised here).
        value: `(B, N, T, Hv)` value heads.
        num_hashes: int R, the hashing rounds.
        bucket_size: int C, the chunk length of the sorted order.
        seed: int, the rotations' seed (`random_rotations`).
        key_mask: boolean `(B, T)` or None, True at real keys.
        causal: bool, hide keys at later positions than the query.
        runs: int `(B, T)` or None, the documents of packed rows
            (`ops.segments.runs`): hide keys of another run.
        pair_bias: None, or a function of the chunks' query and key token
            indices `(B, N, R, nc, C)`, `(B, N, R, nc, 2C)` returning a float32
            bias broadcastable to `(B, N, R, nc, C, 2C)`.
        dropout: None or a function applied to the attention weights.
    """
    query, key, value = (xp.convert_to_tensor(x) for x in (query, key, value))
    if key_mask is not None:
        key_mask = xp.convert_to_tensor(key_mask, xp.bool)
    if runs is not None:
        runs = xp.convert_to_tensor(runs, xp.int32)
    length = dim(query, 2)
    chunks = -(-length // bucket_size)
    padded = chunks * bucket_size
    real = xp.ones_like(query[:, 0, :, 0], xp.bool) if key_mask is None else key_mask
    real = _pad(real, padded, axis=1, value=False)  # (B, Tp)
    query, key, value = (_pad(x, padded, axis=2) for x in (query, key, value))
    key = xp.math.l2_normalize(xp.cast(key, xp.float32), axis=-1)
    order = _hash_order(key, real, (num_hashes, bucket_size, seed), length)

    def by_order(x):  # (B, N, Tp, ...) -> sorted (B, N, R, nc, C, ...)
        gathered = xp.gather(x, order, axis=2, batch_dims=2)  # (B, N, R, Tp, ...)
        return _chunked(gathered, chunks, bucket_size)

    q_index = _chunked(order, chunks, bucket_size)  # (B, N, R, nc, C)
    k_index = _band(q_index)  # -1 before the first chunk
    allowed = _allowed(by_order, (q_index, k_index), real, runs, causal)
    sorted_query = by_order(xp.cast(query, xp.float32))
    logits = xp.matmul(sorted_query, _band(by_order(key)), transpose_b=True)
    if pair_bias is not None:
        last = length - 1
        clip = [xp.clip_by_value(x, 0, last) for x in (q_index, k_index)]
        logits = logits + pair_bias(*clip)
    self_pair = k_index[..., None, :] == q_index[..., :, None]
    logits = xp.where(self_pair, SELF_VALUE, logits)  # (B, N, R, nc, C, 2C)
    logits = xp.where(allowed, logits, FLOAT_MASK_VALUE)
    total = xp.reduce_logsumexp(logits, axis=-1, keepdims=True)
    weights = xp.exp(logits - total)
    if dropout is not None:
        weights = dropout(weights)
    values = _band(by_order(value))
    context = xp.matmul(xp.cast(weights, values.dtype), values)
    return _combine_rounds(context, total, order, padded)[:, :, :length]


def _hash_order(key, real, hashing, length):
    """The sorted token indices `(B, N, R, Tp)` of every hashing round:
    by bucket (each row hashing into the buckets of its real length, so
    padding never changes a real token's bucket; masked keys last), then
    by position."""
    num_hashes, bucket_size, seed = hashing
    padded = dim(key, 2)
    buckets = bucket_count(length, bucket_size)
    rotations = random_rotations(num_hashes, key.shape[-1], buckets, seed)
    real_count = xp.reduce_sum(xp.cast(real, xp.int32), axis=1)  # (B,)
    row_buckets = bucket_count(real_count, bucket_size)
    hashed = hash_buckets(key, rotations, row_buckets)  # (B, N, R, Tp)
    hashed = xp.where(real[:, None, None, :], hashed, buckets)  # masked: last
    # (bucket, position) as one unique int64 key: a total order, no overflow.
    ticket = xp.cast(hashed, xp.int64) * xp.cast(padded, xp.int64)
    ticket = ticket + xp.range(padded, dtype=xp.int64)
    return xp.argsort(ticket, axis=-1)


def _band(x):
    """Each chunk with the chunk before it: `(.., nc, C, ..)` -> `(.., nc, 2C, ..)`."""
    first = xp.fill(xp.shape(x[:, :, :, :1]), _blank(x))
    before = xp.concat([first, x[:, :, :, :-1]], axis=3)
    return xp.concat([before, x], axis=4)


def _allowed(by_order, indices, real, runs, causal):
    """Which scored pairs `(B, N, R, nc, C, 2C)` a query may read: real keys
    of its band, earlier ones when `causal`, its own run's in packed rows."""
    q_index, k_index = indices
    every = xp.shape(q_index)[:2]
    every = xp.concat([every, xp.shape(real)[1:]], 0)  # (B, N, Tp)
    allowed = _band(by_order(xp.broadcast_to(real[:, None, :], every)))
    allowed = allowed & (k_index >= 0)
    allowed = allowed[..., None, :]  # (B, N, R, nc, 1, 2C)
    if causal:
        allowed = allowed & (k_index[..., None, :] <= q_index[..., :, None])
    if runs is not None:
        runs = _pad(runs, dim(real, 1), axis=1, value=-1)[:, None]  # (B, 1, Tp)
        q_run = by_order(xp.broadcast_to(runs, every))
        allowed = allowed & (_band(q_run)[..., None, :] == q_run[..., :, None])
    return allowed


def _combine_rounds(context, total, order, padded):
    """Each token's context `(B, N, Tp, Hv)`: its rounds' contexts back in
    token order, weighted by each round's share of the softmax mass."""
    undo = xp.argsort(order, axis=-1)  # the place of each token in the sort
    context = _unchunked(context, padded)  # (B, N, R, Tp, Hv)
    context = xp.gather(context, undo, axis=3, batch_dims=3)
    total = xp.gather(_unchunked(total, padded)[..., 0], undo, axis=3, batch_dims=3)
    share = xp.nn.softmax(total, axis=2)[..., None]  # (B, N, R, Tp, 1)
    return xp.reduce_sum(xp.cast(share, context.dtype) * context, axis=2)


def _pad(x, padded, axis, value=0):
    """`x` padded with `value` on `axis` to the length `padded`."""
    extra = padded - dim(x, axis)
    widths = [[0, 0]] * rank(x)
    widths[axis] = [0, extra]
    return xp.pad(x, widths, constant_values=value)


def _chunked(x, chunks, size):
    """`(B, N, R, Tp, ...)` -> `(B, N, R, nc, C, ...)`."""
    shape = xp.concat([xp.shape(x)[:3], [chunks, size], xp.shape(x)[4:]], 0)
    out = xp.reshape(x, shape)
    static = list(x.shape[:3]) + [
        chunks if isinstance(chunks, int) else None,
        size,
    ]
    return xp.ensure_shape(out, static + list(x.shape[4:]))


def _unchunked(x, padded):
    """`(B, N, R, nc, C, ...)` -> `(B, N, R, Tp, ...)`."""
    shape = xp.concat([xp.shape(x)[:3], [padded], xp.shape(x)[5:]], 0)
    return xp.reshape(x, shape)


def _blank(x):
    """What stands before the first chunk: index -1, mask False, zeros."""
    if dtype_name(x.dtype) == "bool":
        return False
    if is_integer(x):
        return xp.constant(-1, x.dtype)
    return xp.constant(0, x.dtype)
