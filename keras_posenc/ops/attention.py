"""Attention plumbing: masks, the block-local band mask, head layout.

Shape letters (docs/glossary.md): B batch, T query length, S key length, N heads,
H head size, W attention window.
"""

import contextlib
import contextvars

import numpy as np
import tensorflow as tf

from keras_posenc._backend import IS_TENSORFLOW, xp
from keras_posenc._compat import dim, rank

#: In float, masked logits become FLOAT_MASK_VALUE: the float32 softmax gives
#: them exactly zero weight, as in Keras' MultiHeadAttention.
FLOAT_MASK_VALUE = -1e9
#: Inside `bounded_masking()` (int8 export) they become -MASK_PENALTY: int8
#: calibration of the logits spans this constant, and -1e9 wrecks int8 accuracy
#: (docs/edge.md). A masked key then gets e^-30 ~ 1e-13 of the weight of a real
#: key whose logit is 0.
MASK_PENALTY = 30.0
#: ... or MASK_GAP below the row's smallest logit, where that is lower
#: (`masked_logit`): e^-16 ~ 1e-7.
MASK_GAP = 16.0
_BOUNDED = contextvars.ContextVar("keras_posenc_bounded_masking", default=False)


@contextlib.contextmanager
def bounded_masking():
    """Graphs traced inside mask logits with `-MASK_PENALTY` (for int8 export)."""
    token = _BOUNDED.set(True)
    try:
        yield
    finally:
        _BOUNDED.reset(token)


def mask_value():
    """What masked logits become now: `FLOAT_MASK_VALUE`, or bounded."""
    return -MASK_PENALTY if _BOUNDED.get() else FLOAT_MASK_VALUE


def masked_logit(logits):
    """What the masked entries of float32 `logits (..., S)` become now.

    `FLOAT_MASK_VALUE`; inside `bounded_masking()`, `-MASK_PENALTY`, or
    `MASK_GAP` below the row's smallest logit where that is lower, `(..., 1)`:
    a masked key then gets at most e^-16 of the weight of any real key,
    however negative the real logits are (a fixed -30 gave the empty slots
    of a decoding step's cache the weight of rows whose real logits all lay
    below it), and rows of ordinary logits keep the -30 and its int8 range.
    """
    if not _BOUNDED.get():
        return FLOAT_MASK_VALUE
    lowest = xp.reduce_min(logits, axis=-1, keepdims=True) - MASK_GAP
    return xp.minimum(lowest, -MASK_PENALTY)


def causal_mask(query_length, key_length):
    """Boolean `(T, S)` mask, True where key `j <= i` (Keras' `tril` convention).

    With static lengths it is a constant (it folds away in TFLite).
    """
    if isinstance(query_length, int) and isinstance(key_length, int):
        return xp.constant(np.tril(np.ones((query_length, key_length), dtype=bool)))
    rows = xp.range(query_length)[:, None]
    cols = xp.range(key_length)[None, :]
    return cols <= rows


def sliding_window_mask(query_positions, key_positions, window):
    """Boolean mask, True where a key lies fewer than `window` places back.

    `query_positions` `(..., T)` and `key_positions` `(..., S)` integers;
    `(..., T, S)` True where `i - j < window` (HF transformers' sliding
    window: a query sees itself and the `window - 1` keys before it once a
    causal mask is added). Static positions give a constant.
    """
    q = xp.cast(query_positions, xp.int32)[..., :, None]
    k = xp.cast(key_positions, xp.int32)[..., None, :]
    return (q - k) < window


def band_mask(length, window, causal=False):
    """Boolean `(T, T)` mask of the keys each query sees in block-local attention.

    Query `i` in block `b = i // W` sees keys in blocks `b - 1, b, b + 1`
    (and only keys `j <= i` when causal). Dense attention with this mask
    equals block-local attention (`keras_posenc.ops.blocks`).
    """
    index = xp.range(length)
    block = index // window
    distance = block[None, :] - block[:, None]  # (T, T)
    mask = xp.abs(distance) <= 1
    if causal:
        mask = xp.logical_and(mask, index[None, :] <= index[:, None])
    return mask


def combine_masks(
    query_length,
    key_length,
    query_mask=None,
    value_mask=None,
    key_mask=None,
    attention_mask=None,
    causal=False,
):
    """Boolean `(B, T, S)` attention mask from Keras masks, or None if none.

    Args:
        query_length, key_length: ints or scalar tensors T and S.
        query_mask: `(B, T)`; value_mask, key_mask: `(B, S)`;
            attention_mask: `(B, T, S)`; True where allowed.
        causal: bool, also mask keys `j > i`.
    """
    mask = None
    parts = [
        (query_mask, lambda m: m[:, :, None]),  # (B, T, 1)
        (value_mask, lambda m: m[:, None, :]),  # (B, 1, S)
        (key_mask, lambda m: m[:, None, :]),  # (B, 1, S)
        (attention_mask, lambda m: m),  # (B, T, S)
    ]
    if causal:
        parts.append((causal_mask(query_length, key_length), lambda m: m[None]))
    for part, expand in parts:
        if part is not None:
            part = expand(xp.cast(part, xp.bool))
            mask = part if mask is None else xp.logical_and(mask, part)
    return mask


def swap_heads(x):
    """Swaps axes 1 and 2 of a 4-D tensor: `(B, N, T, H) <-> (B, T, N, H)`."""
    return xp.transpose(x, [0, 2, 1, 3])


def head_logits(q, k):
    """`Q K^T` per head: heads-last `(B, T, N, H)`, `(B, S, N, H)` -> `(B, N, T, S)`.

    In a plain graph (and for the TFLite converter), two transposes of the
    small heads and one batched matmul of the keys' transpose
    (`transpose_b`): TensorFlow's Einsum kernel is slower there. Traced for
    XLA (`jit_compile=True` in `tf.function` or `compile`), the keys move
    to `(B, N, H, S)` themselves, as Keras 3's `ops.einsum` lowers Keras'
    own equation: XLA then keeps one layout of each head tensor, where an
    Einsum (or `transpose_b`) had it copy the keys, the values and the
    context's gradient into a second one. Forward+backward under XLA, 3-30%
    faster than the Einsum (B=4 T=256 D=128 N=8 and B=8 T=512 D=256 N=8;
    `docs/measurements.md`, attention rows).
    """
    if in_xla():
        return xp.matmul(swap_heads(q), xp.transpose(k, [0, 2, 3, 1]))
    return xp.matmul(swap_heads(q), swap_heads(k), transpose_b=True)


def head_context(weights, v):
    """Weights `(B, N, T, S)` times values `(B, S, N, Hv)`: `(B, T, N, Hv)`.

    In a plain graph, a transpose of the values, a batched matmul and a
    transpose of the context; under XLA one Einsum, which XLA turns into a
    dot with the heads as batch axes (with `head_logits`' XLA form, 11-17%
    faster forward+backward than this form's transposes and matmul there).
    """
    if in_xla():
        return xp.einsum("bnts,bsnh->btnh", weights, v)
    return swap_heads(xp.matmul(weights, swap_heads(v)))


def cached_logits(q, keys, step=False):
    """`Q K^T` of heads-last queries `(B, T, N, H)` over cached keys `(B, N_kv, S, H)`.

    The cache's heads-first keys are read where they lie (a batched matmul's
    own layout: no cached key moves); the `T` queries move. With fewer key
    heads (`N = G * N_kv`, grouped-query attention) query head `n` reads key
    head `n // G`: the queries of a group fold into one matmul's rows.
    `step` (one query in a plain graph): a product and a sum over `H` on
    the keys' layout, which oneDNN runs faster than a one-row matmul.
    Returns `(B, N, T, S)`.
    """
    return heads_first_logits(swap_heads(q), keys, step)


def heads_first_logits(q, keys, step=False):
    """`cached_logits` of heads-first queries `(B, N, T, H)`: `(B, N, T, S)`."""
    shape = xp.shape(q)
    batch, heads, length, size = shape[0], q.shape[1], dim(q, 2), q.shape[3]
    kv_heads, slots = keys.shape[1], xp.shape(keys)[2]
    groups = heads // kv_heads
    if groups > 1:
        q = xp.reshape(q, [batch, kv_heads, groups * length, size])
    if step and groups == 1:
        products = xp.cast(q, xp.float32) * xp.cast(keys, xp.float32)  # (B,N,S,H)
        logits = xp.cast(xp.reduce_sum(products, -1, keepdims=True), q.dtype)
        logits = xp.transpose(logits, [0, 1, 3, 2])  # (B, N, 1, S)
    else:
        logits = xp.matmul(q, keys, transpose_b=True)  # (B, N_kv, G*T, S)
    if groups > 1:
        logits = xp.reshape(logits, [batch, heads, length, slots])
    return logits


def cached_context(weights, values, step=False):
    """Weights `(B, N, T, S)` times cached values `(B, N_kv, S, Hv)`: `(B, T, N, Hv)`.

    `cached_logits`' layout: the weights of a group fold into one matmul's
    rows; `step` (one query in a plain graph) a product and a sum over `S`.
    """
    shape = xp.shape(weights)
    batch, heads, length = shape[0], weights.shape[1], dim(weights, 2)
    kv_heads, size = values.shape[1], values.shape[3]
    groups = heads // kv_heads
    if groups > 1:
        weights = xp.reshape(weights, [batch, kv_heads, groups * length, -1])
    if step and groups == 1:
        w = xp.transpose(weights, [0, 1, 3, 2])  # (B, N, S, 1)
        products = xp.cast(w, xp.float32) * xp.cast(values, xp.float32)
        context = xp.cast(xp.reduce_sum(products, 2, keepdims=True), values.dtype)
    else:
        context = xp.matmul(weights, values)  # (B, N_kv, G*T, Hv)
    if groups > 1:
        context = xp.reshape(context, [batch, heads, length, size])
    return swap_heads(context)


def in_xla():
    """Whether the function being traced is compiled by XLA.

    `tf.function(jit_compile=True)` traces inside an XLA context; TensorFlow
    says so only through `control_flow_util` (not a public module: without
    it, the plain-graph form is used everywhere, which is correct, only
    slower under XLA).
    """
    if not IS_TENSORFLOW:  # JAX traces with static sizes; PyTorch takes them too
        return True
    if not tf.inside_function():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without the module
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def split_heads(x, num_heads):
    """`(B, L, N*H)` -> `(B, N, L, H)`, with static shapes when known."""
    x = xp.reshape(x, [-1, dim(x, 1), num_heads, x.shape[-1] // num_heads])
    return xp.transpose(x, [0, 2, 1, 3])


def merge_heads(x):
    """`(B, N, L, H)` -> `(B, L, N*H)`."""
    x = xp.transpose(x, [0, 2, 1, 3])
    return xp.reshape(x, [-1, dim(x, 1), x.shape[2] * x.shape[3]])


def heads_first(bias):
    """`(..., T, S, N)` -> `(..., N, T, S)`."""
    ndim = rank(bias)
    return xp.transpose(bias, list(range(ndim - 3)) + [ndim - 1, ndim - 3, ndim - 2])
