"""Resolving `start_index` / `positions` call arguments (shared by layers)."""

import tensorflow as tf

from keras_posenc import ops
from keras_posenc._compat import dim


def query_positions(inputs, start_index=0, positions=None):
    """Float32 positions `(T,)` or `(B, T)` for `inputs` of shape `(B, T, ...)`."""
    if positions is not None:
        positions = tf.cast(positions, tf.float32)
        if positions.shape.rank not in (None, 1, 2):
            raise ValueError(
                "`positions` must have shape (T,) or (B, T). "
                f"Received: positions.shape={positions.shape}"
            )
        return positions
    return ops.position_range(dim(inputs, 1), start_index)
