"""Key/value cache of cached decoding, as pure functions.

The cache follows keras-hub's `CachedMultiHeadAttention`: one tensor
`(B, 2, S_max, N, H)` holding the keys (index 0) and values (index 1) of
positions `0 .. S_max - 1`; new tokens are written at `cache_update_index`.
"""

import tensorflow as tf
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice


def update_cache(cache, key, value, index):
    """Writes key/value heads `(B, N, T, H)` into `cache` at `index`.

    Returns:
        `(keys, values, cache)`: all cached keys and values heads-first
        `(B, N, S_max, H)` and the updated `(B, 2, S_max, N, H)` cache.
    """
    index = tf.cast(index, tf.int32)
    new = tf.stack([key, value], axis=1)  # (B, 2, N, T, H)
    new = tf.transpose(new, [0, 1, 3, 2, 4])  # (B, 2, T, N, H)
    cache = dynamic_update_slice(cache, tf.cast(new, cache.dtype), [0, 0, index, 0, 0])
    heads_first = tf.transpose(cache, [1, 0, 3, 2, 4])  # (2, B, N, S_max, H)
    return heads_first[0], heads_first[1], cache


def cache_mask(index, query_length, max_length, window=None):
    """Boolean `(T, S_max)`: query `index + t` sees the cached keys `j <= index + t`.

    Causal over the cache (slots after the query are empty or in its future);
    with `window`, also only the keys of block-local attention's band.
    """
    query = tf.range(query_length) + tf.cast(index, tf.int32)  # (T,)
    keys = tf.range(max_length)  # (S_max,)
    mask = keys[None, :] <= query[:, None]
    if window is not None:
        near = tf.abs(keys[None, :] // window - query[:, None] // window) <= 1
        mask = tf.logical_and(mask, near)
    return mask
