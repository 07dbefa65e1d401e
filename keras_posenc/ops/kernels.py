"""Learned-kernel relative biases: KERPLE's kernels, FIRE's distances, DAPE's MLP.

Pure float32 functions of relative positions and of the (already positive)
parameters; the layers `KerpleBias` and `FireBias` own the weights.
"""

from keras_posenc._backend import xp
from keras_posenc._compat import rank

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
    relative = xp.cast(relative_position, xp.float32)[..., None, :, :]  # (..., 1, T, S)
    distance = xp.abs(relative)
    r1 = xp.cast(r1, xp.float32)
    r2 = xp.cast(r2, xp.float32)
    if rank(r1) == 2:  # per direction: pick the row of each pair's side
        after = relative > 0
        r1 = xp.where(after, r1[1][:, None, None], r1[0][:, None, None])
        r2 = xp.where(after, r2[1][:, None, None], r2[0][:, None, None])
    else:
        r1, r2 = r1[:, None, None], r2[:, None, None]
    if kernel == "log":
        return -r1 * xp.math.log1p(r2 * distance)
    return -r1 * xp.pow(distance, r2)


def fire_distances(query_positions, key_positions, c, threshold, bidirectional):
    """FIRE's normalized distances `(..., T, S)` (Li et al. 2024, eq. 5).

    `psi(x) = log(|c x| + 1)` of the distance `i - j`, divided by
    `psi(max(i, L))` of the query position (`L = threshold`, plus `1e-6`):
    progressive interpolation, so a query far past the training length sees
    its keys on the range it trained on. Bidirectional, the sign of `i - j`
    is kept (keys after the query get negative values); causal, only keys at
    or before the query matter and `|i - j|` is used, as in the paper.
    """
    q = xp.cast(query_positions, xp.float32)
    k = xp.cast(key_positions, xp.float32)
    c = xp.cast(c, xp.float32)
    relative = q[..., :, None] - k[..., None, :]  # (..., T, S): i - j
    psi = xp.math.log1p(xp.abs(c * relative))
    if bidirectional:
        psi = psi * xp.sign(relative)
    normalizer = xp.maximum(q, xp.cast(threshold, xp.float32))  # (..., T)
    normalizer = xp.math.log1p(xp.abs(c * normalizer))[..., :, None]  # (..., T, 1)
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
        xp.cast(w, xp.float32) for w in weights
    )
    logits = xp.cast(logits, xp.float32)
    shape = xp.shape(logits)
    if list(bias.shape[1:]) != list(logits.shape[1:]):
        bias = xp.broadcast_to(bias, xp.concat([xp.shape(bias)[:1], shape[1:]], 0))
    hidden = _pairs_through(logits, logit_kernel, num_heads)  # (B, P, W)
    hidden = hidden + _pairs_through(xp.cast(bias, xp.float32), bias_kernel, num_heads)
    hidden = xp.nn.leaky_relu(hidden + hidden_bias, alpha=negative_slope)
    width = hidden.shape[-1]
    rows = xp.reshape(hidden, [-1, width])  # (B * P, W)
    term = xp.matmul(rows, output_kernel) + output_bias  # (B * P, N)
    term = xp.reshape(term, [shape[0], -1, num_heads])  # (B, P, N)
    return xp.reshape(xp.transpose(term, [0, 2, 1]), shape)  # (B, M, T, S)


def _pairs_through(x, kernel, num_heads):
    """Heads-first `(b, M, T, S)` through `kernel (N, W)` on the heads: `(b, P, W)`."""
    batch = xp.shape(x)[0]
    pairs = xp.transpose(xp.reshape(x, [batch, num_heads, -1]), [0, 2, 1])  # (b, P, N)
    out = xp.matmul(xp.reshape(pairs, [-1, num_heads]), kernel)  # (b * P, W)
    return xp.reshape(out, [batch, -1, kernel.shape[-1]])
