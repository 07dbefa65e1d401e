"""Learned-kernel relative biases: KERPLE's kernels, FIRE's distances, DAPE's MLP.

Pure float32 functions of relative positions and of the (already positive)
parameters; the layers `KerpleBias` and `FireBias` own the weights.
"""

import tensorflow as tf

#: KERPLE's kernels, by name: `-r1 log(1 + r2 d)` and `-r1 d^r2`.
KERPLE_KERNELS = ("log", "power")


def kerple_bias(relative_position, r1, r2, kernel="log"):
    """KERPLE bias `(..., N, T, S)` from relative positions `j - i` `(..., T, S)`.

    `r1` and `r2` are `(N,)` (one kernel for both directions) or `(2, N)`:
    row 0 for keys before the query (`j < i`), row 1 for keys after it. The
    distance is `d = |j - i|`; `"log"`: `-r1 log(1 + r2 d)`; `"power"`:
    `-r1 d^r2`. Both are 0 at `d = 0` and fall with distance.
    """
    if kernel not in KERPLE_KERNELS:
        raise ValueError(
            f"`kernel` must be one of {KERPLE_KERNELS}. Received: kernel={kernel!r}"
        )
    relative = tf.cast(relative_position, tf.float32)[..., None, :, :]  # (..., 1, T, S)
    distance = tf.abs(relative)
    r1 = tf.cast(r1, tf.float32)
    r2 = tf.cast(r2, tf.float32)
    if r1.shape.rank == 2:  # per direction: pick the row of each pair's side
        after = relative > 0
        r1 = tf.where(after, r1[1][:, None, None], r1[0][:, None, None])
        r2 = tf.where(after, r2[1][:, None, None], r2[0][:, None, None])
    else:
        r1, r2 = r1[:, None, None], r2[:, None, None]
    if kernel == "log":
        return -r1 * tf.math.log1p(r2 * distance)
    return -r1 * tf.pow(distance, r2)


def fire_distances(query_positions, key_positions, c, threshold, bidirectional):
    """FIRE's normalized distances `(..., T, S)` (Li et al. 2024, eq. 5).

    `psi(x) = log(|c x| + 1)` of the distance `i - j`, divided by
    `psi(max(i, L))` of the query position (`L = threshold`, plus `1e-6`):
    progressive interpolation, so a query far past the training length sees
    its keys on the range it trained on. Bidirectional, the sign of `i - j`
    is kept (keys after the query get negative values); causal, only keys at
    or before the query matter and `|i - j|` is used, as in the paper.
    """
    q = tf.cast(query_positions, tf.float32)
    k = tf.cast(key_positions, tf.float32)
    c = tf.cast(c, tf.float32)
    relative = q[..., :, None] - k[..., None, :]  # (..., T, S): i - j
    psi = tf.math.log1p(tf.abs(c * relative))
    if bidirectional:
        psi *= tf.sign(relative)
    normalizer = tf.maximum(q, tf.cast(threshold, tf.float32))  # (..., T)
    normalizer = tf.math.log1p(tf.abs(c * normalizer))[..., :, None]  # (..., T, 1)
    return psi / (normalizer + 1e-6)


def data_adaptive_term(logits, bias, weights, num_heads, negative_slope=0.01):
    """DAPE's `f([A, B])`: an MLP over each pair's logits and bias of all heads.

    `logits` `(B, M, T, S)` and `bias` `(1 or B, M, T, S)` are heads-first
    with `M = N * X` (N-major: a block-local band folds its blocks after the
    heads); `weights` are `(logit_kernel (N, W), bias_kernel (N, W),
    hidden_bias (W,), output_kernel (W, N), output_bias (N,))`. Each
    (query, key) pair's `2N` values go through `W` leaky-ReLU units to `N`
    outputs: `W2 leaky_relu(A W1a + B W1b + b1) + b2`, the first layer split
    in two so the bias half runs at its own batch (1: a constant in TFLite).
    Returns the float32 term `(B, M, T, S)`.
    """
    logit_kernel, bias_kernel, hidden_bias, output_kernel, output_bias = (
        tf.cast(w, tf.float32) for w in weights
    )
    logits = tf.cast(logits, tf.float32)
    shape = tf.shape(logits)
    if bias.shape[1:].as_list() != logits.shape[1:].as_list():
        bias = tf.broadcast_to(bias, tf.concat([tf.shape(bias)[:1], shape[1:]], 0))
    hidden = _pairs_through(logits, logit_kernel, num_heads)  # (B, P, W)
    hidden += _pairs_through(tf.cast(bias, tf.float32), bias_kernel, num_heads)
    hidden = tf.nn.leaky_relu(hidden + hidden_bias, alpha=negative_slope)
    width = hidden.shape[-1]
    rows = tf.reshape(hidden, [-1, width])  # (B * P, W)
    term = tf.matmul(rows, output_kernel) + output_bias  # (B * P, N)
    term = tf.reshape(term, [shape[0], -1, num_heads])  # (B, P, N)
    return tf.reshape(tf.transpose(term, [0, 2, 1]), shape)  # (B, M, T, S)


def _pairs_through(x, kernel, num_heads):
    """Heads-first `(b, M, T, S)` through `kernel (N, W)` on the heads: `(b, P, W)`."""
    batch = tf.shape(x)[0]
    pairs = tf.transpose(tf.reshape(x, [batch, num_heads, -1]), [0, 2, 1])  # (b, P, N)
    out = tf.matmul(tf.reshape(pairs, [-1, num_heads]), kernel)  # (b * P, W)
    return tf.reshape(out, [batch, -1, kernel.shape[-1]])
