"""Block-local attention core: each query block sees its block and both neighbours.

Shapes: B batch, N heads, T length (queries and keys), W window (block size),
nb = ceil(T / W) blocks, Tp = nb * W. Every tensor stays rank <= 4 and padding
is a CONCATENATION with zeros, so the graph exports to TFLM.
"""

import tensorflow as tf

from keras_posenc import ops
from keras_posenc._compat import dim


def band_mask(length, window, causal=False):
    """Boolean `(T, T)` mask of the keys each query sees in block-local attention.

    Query `i` in block `b = i // W` sees keys in blocks `b - 1, b, b + 1`
    (and only keys `j <= i` when causal). Dense attention with this mask
    equals block-local attention.
    """
    index = tf.range(length)
    block = index // window
    distance = block[None, :] - block[:, None]  # (T, T)
    mask = tf.abs(distance) <= 1
    if causal:
        mask = tf.logical_and(mask, index[None, :] <= index[:, None])
    return mask


def local_context(layer, q, k, v, query, key, masks, causal, training):
    """Block-local context `(B, N, T, Hv)` of a `RelativeMultiHeadAttention`."""
    query_mask, value_mask, key_mask = masks
    keys = value_mask if key_mask is None else key_mask
    if value_mask is not None and key_mask is not None:
        keys = tf.logical_and(tf.cast(value_mask, bool), tf.cast(key_mask, bool))
    bias_fn = None
    if layer.position_bias is not None:

        def bias_fn(positions, key_positions):
            bias = layer.position_bias(
                query, key, positions=positions, key_positions=key_positions
            )
            return tf.cast(bias, tf.float32)  # (nb, N, W, 3W)

    weights, values, geometry = block_local_attention(
        q, k, v, layer.attention_window, bias_fn, keys, query_mask, causal
    )
    weights = tf.cast(weights, layer.compute_dtype)
    dropped = layer._dropout_layer(weights, training=training)
    return merge_blocks(tf.matmul(dropped, values), *geometry)


def check_local(window, query, key, **call_arguments):
    """Errors for calls that block-local attention cannot honour."""
    t, s = query.shape[1], key.shape[1]
    if t is not None and s is not None and t != s:
        raise ValueError(
            "`attention_window` needs self-attention (equal query and key "
            f"lengths). Received: query.shape={query.shape}, key.shape={key.shape}"
        )
    if call_arguments.get("return_attention_scores"):
        raise ValueError(
            "`return_attention_scores` needs the dense (T, S) weights, which "
            "local attention never builds. Received: return_attention_scores="
            f"True with attention_window={window}"
        )
    for name in ("attention_mask", "attention_bias"):
        if call_arguments.get(name) is not None:
            raise ValueError(
                f"`{name}` is a (B, T, S) tensor, which local attention never "
                f"builds. Received: {name} with attention_window={window}; use "
                "query/key masks instead"
            )


def block_local_attention(q, k, v, window, bias_fn, key_mask, query_mask, causal):
    """Softmax weights over the band, the banded values, and the block geometry.

    Args:
        q, k, v: `(B, N, T, H)`, `(B, N, T, H)`, `(B, N, T, Hv)`; q is scaled.
        window: int W.
        bias_fn: `bias_fn(positions, key_positions)` -> `(nb, N, W, 3W)` float32
            for per-block positions `(nb, W)` and `(nb, 3W)`, or None.
        key_mask, query_mask: boolean `(B, T)` or None.
        causal: bool.

    Returns:
        `(weights, values, geometry)`: weights `(B, N*nb, W, 3W)`, banded
        values `(B, N*nb, 3W, Hv)` and `(N, nb, W, T)` for `merge_blocks`,
        which turns `weights @ values` back into `(B, N, T, Hv)`.
    """
    length = dim(q, 2)
    heads = q.shape[1]
    blocks = -(-length // window)  # ceil
    padded = blocks * window
    qb = _blocks(_pad_to(q, padded), blocks, window)  # (B, N*nb, W, H)
    kb = _band(k, padded, blocks, window)  # (B, N*nb, 3W, H)
    vb = _band(v, padded, blocks, window)  # (B, N*nb, 3W, Hv)
    logits = tf.cast(tf.matmul(qb, kb, transpose_b=True), tf.float32)
    query_pos = tf.reshape(tf.range(padded), [blocks, window])  # (nb, W)
    key_pos = tf.concat([query_pos - window, query_pos, query_pos + window], 1)
    if bias_fn is not None:
        bias = bias_fn(query_pos, key_pos)  # (nb, N, W, 3W)
        bias = tf.transpose(bias, [1, 0, 2, 3])  # (N, nb, W, 3W)
        logits += tf.reshape(bias, [1, heads * blocks, window, 3 * window])
    allowed = tf.logical_and(key_pos >= 0, key_pos < length)[:, None, :]
    if causal:
        allowed = tf.logical_and(allowed, key_pos[:, None, :] <= query_pos[:, :, None])
    allowed = tf.broadcast_to(allowed, [blocks, window, 3 * window])[None, None]
    if key_mask is not None:
        keys = _band_mask(key_mask, padded, blocks, window)  # (B, nb, 3W)
        allowed = tf.logical_and(allowed, keys[:, None, :, None, :])
    if query_mask is not None:
        rows = tf.reshape(_pad_mask(query_mask, padded), [-1, blocks, window])
        allowed = tf.logical_and(allowed, rows[:, None, :, :, None])
    allowed = tf.broadcast_to(
        allowed, [tf.shape(allowed)[0], heads, blocks, window, 3 * window]
    )
    allowed = tf.reshape(allowed, [-1, heads * blocks, window, 3 * window])
    logits = tf.where(allowed, logits, -ops.MASK_PENALTY)
    weights = tf.nn.softmax(logits, axis=-1)  # (B, N*nb, W, 3W)
    return weights, vb, (heads, blocks, window, length)


def merge_blocks(context, heads, blocks, window, length):
    """`(B, N*nb, W, Hv)` -> `(B, N, T, Hv)`."""
    context = tf.reshape(context, [-1, heads, blocks * window, context.shape[-1]])
    return context[:, :, :length]


def _pad_to(x, padded):
    """Zero-pads axis 2 of `(B, N, T, H)` to `padded` with a concatenation."""
    extra = padded - dim(x, 2)
    if isinstance(extra, int) and extra == 0:
        return x
    shape = tf.concat([tf.shape(x)[:2], [extra], tf.shape(x)[3:]], 0)
    return tf.concat([x, tf.zeros(shape, x.dtype)], axis=2)


def _blocks(x, blocks, window):
    """`(B, N, Tp, H)` -> `(B, N*nb, W, H)`."""
    return tf.reshape(x, [-1, x.shape[1] * blocks, window, x.shape[-1]])


def _band(x, padded, blocks, window):
    """Keys of the previous, own and next block: `(B, N*nb, 3W, H)`."""
    zeros = tf.zeros_like(x[:, :, :window])
    if x.shape[2] is not None and x.shape[2] < window:
        shape = tf.concat([tf.shape(x)[:2], [window], tf.shape(x)[3:]], 0)
        zeros = tf.zeros(shape, x.dtype)
    framed = tf.concat([zeros, _pad_to(x, padded), zeros], axis=2)  # Tp + 2W
    views = [
        _blocks(framed[:, :, start : start + padded], blocks, window)
        for start in (0, window, 2 * window)
    ]
    return tf.concat(views, axis=2)


def _pad_mask(mask, padded):
    mask = tf.cast(mask, tf.bool)
    extra = padded - dim(mask, 1)
    return tf.concat([mask, tf.zeros([tf.shape(mask)[0], extra], tf.bool)], 1)


def _band_mask(mask, padded, blocks, window):
    """`(B, T)` key mask -> `(B, nb, 3W)` for the band."""
    mask = _pad_mask(mask, padded)
    edge = tf.zeros([tf.shape(mask)[0], window], tf.bool)
    framed = tf.concat([edge, mask, edge], axis=1)
    views = [
        tf.reshape(framed[:, start : start + padded], [-1, blocks, window])
        for start in (0, window, 2 * window)
    ]
    return tf.concat(views, axis=2)
