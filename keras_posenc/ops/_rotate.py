"""The rotation of RoPE: `x * cos + swap(x) * sin` over feature pairs."""

import numpy as np
import tensorflow as tf


def rotate(x, cos, sin, interleaved=False):
    """Rotates the first r features of `x` `(..., r + rest)` by angle pairs.

    `cos`, `sin` `(..., r/2)` broadcast against `x`'s leading axes. Rotate-half
    (HF, keras-hub): feature `i` pairs with `i + r/2`; interleaved (RoFormer,
    GPT-J): features `2i` and `2i + 1` pair. Features past r pass unchanged.
    Computed as `x * cos' + swap(x) * sin'` with cos and sin widened to r and
    sin signed: three products and one permutation, a single roll when the
    shape is static (fastest in graph mode; the TFLite converter lowers it to
    SLICE + CONCATENATION).
    """
    half = cos.shape[-1]
    width = 2 * half
    rotary = x if x.shape[-1] == width else x[..., :width]
    cos, sin = tf.cast(cos, x.dtype), tf.cast(sin, x.dtype)
    sign = np.tile([-1.0, 1.0], [half, 1]).T  # (2, r/2): first of a pair gets -sin
    if interleaved:
        sign = sign.T
    sign = tf.constant(sign.reshape(width), x.dtype)
    rotated = rotary * _widen(cos, interleaved) + _swap_pairs(
        rotary, half, interleaved
    ) * (_widen(sin, interleaved) * sign)
    if x.shape[-1] == width:
        return rotated
    return tf.concat([rotated, x[..., width:]], axis=-1)


def _widen(angles, interleaved):
    """`(..., r/2)` -> `(..., r)` with each value at both features of its pair."""
    if not interleaved:
        return tf.concat([angles, angles], axis=-1)
    pairs = tf.stack([angles, angles], axis=-1)  # (..., r/2, 2)
    return tf.reshape(pairs, tf.concat([tf.shape(angles)[:-1], [-1]], 0))


def _swap_pairs(x, half, interleaved):
    """`x` `(..., r)` with the two features of every pair exchanged."""
    static = x.shape.is_fully_defined()
    if not interleaved:
        if static:
            return tf.roll(x, half, axis=-1)
        return tf.concat([x[..., half:], x[..., :half]], axis=-1)
    shape = tf.shape(x)
    pairs = tf.reshape(x, tf.concat([shape[:-1], [half, 2]], 0))
    if static:
        swapped = tf.roll(pairs, 1, axis=-1)
    else:
        swapped = tf.stack([pairs[..., 1], pairs[..., 0]], axis=-1)
    return tf.reshape(swapped, shape)
