"""Learned-kernel relative biases: KERPLE's kernels and FIRE's distances.

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
