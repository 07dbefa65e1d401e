"""The rotation of RoPE: `x * cos + swap(x) * sin` over feature pairs."""

import numpy as np

from keras_posenc._backend import xp


def rotate(x, cos, sin, interleaved=False):
    """Rotates the first r features of `x` `(..., r + rest)` by angle pairs.

    `cos`, `sin` `(..., r/2)` broadcast against `x`'s leading axes. Rotate-half
    (HF, keras-hub): feature `i` pairs with `i + r/2`; interleaved (RoFormer,
    GPT-J): features `2i` and `2i + 1` pair. Features past r pass unchanged.
    Computed as `x * cos' + swap(x) * sin'` with cos and sin widened to r and
    sin signed (`rotation_tables`): three products and one permutation, a
    single roll when the shape is static (fastest in graph mode; the TFLite
    converter lowers it to SLICE + CONCATENATION).
    """
    cos, sin = rotation_tables(cos, sin, interleaved, x.dtype)
    return rotate_widened(x, cos, sin, interleaved)


def rotation_tables(cos, sin, interleaved=False, dtype=xp.float32):
    """`(cos', sin')` `(..., r)` from cos and sin `(..., r/2)`.

    Each value sits at both features of its pair; sin' carries the sign of
    the rotation (the first feature of a pair gets -sin).
    """
    half = cos.shape[-1]
    cos, sin = xp.cast(cos, dtype), xp.cast(sin, dtype)
    sign = np.tile([-1.0, 1.0], [half, 1]).T  # (2, r/2): first of a pair gets -sin
    if interleaved:
        sign = sign.T
    sign = xp.constant(sign.reshape(2 * half), dtype)
    return _widen(cos, interleaved), _widen(sin, interleaved) * sign


def rotate_widened(x, cos, sin, interleaved=False, rounding=None):
    """`x * cos' + swap(x) * sin'` on the first r features, tables `(..., r)`.

    `rounding(name, tensor)`, when given, rounds the two products (`"cos"`,
    `"sin"`) and their sum (`"rotated"`) as an int8 model does
    (quantization-aware training).
    """
    x = xp.convert_to_tensor(x)
    width = cos.shape[-1]
    half = width // 2
    round_ = rounding or (lambda name, tensor: tensor)
    rotary = x if x.shape[-1] == width else x[..., :width]
    cos, sin = xp.cast(cos, x.dtype), xp.cast(sin, x.dtype)
    swapped = _swap_pairs(rotary, half, interleaved)
    rotated = round_(
        "rotated", round_("cos", rotary * cos) + round_("sin", swapped * sin)
    )
    if x.shape[-1] == width:
        return rotated
    return xp.concat([rotated, x[..., width:]], axis=-1)


def _widen(angles, interleaved):
    """`(..., r/2)` -> `(..., r)` with each value at both features of its pair."""
    if not interleaved:
        return xp.concat([angles, angles], axis=-1)
    pairs = xp.stack([angles, angles], axis=-1)  # (..., r/2, 2)
    width = 2 * angles.shape[-1]  # static: the rotation reads it
    return xp.reshape(pairs, xp.concat([xp.shape(angles)[:-1], [width]], 0))


def _swap_pairs(x, half, interleaved):
    """`x` `(..., r)` with the two features of every pair exchanged."""
    static = None not in tuple(x.shape)
    if not interleaved:
        if static:
            return xp.roll(x, half, axis=-1)
        return xp.concat([x[..., half:], x[..., :half]], axis=-1)
    shape = xp.shape(x)
    pairs = xp.reshape(x, xp.concat([shape[:-1], [half, 2]], 0))
    if static:
        swapped = xp.roll(pairs, 1, axis=-1)
    else:
        swapped = xp.stack([pairs[..., 1], pairs[..., 0]], axis=-1)
    return xp.reshape(swapped, shape)
