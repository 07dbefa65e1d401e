"""The bias contract shared by every relative-position producer (STYLE.md)."""

import tensorflow as tf

from keras_posenc._compat import keras


class BiasLayer(keras.layers.Layer):
    """Base of bias producers: `(query, key, ...) -> (1, N, T, S)` or `(B, N, T, S)`.

    Subclasses set `num_heads` and compute the float32 bias; `finish` gives it
    the contract's shape and dtype. A bias has no tokens, so no mask passes on.
    """

    def compute_output_shape(self, query_shape, key_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        return (1, self.num_heads, query_shape[1], key_shape[1])

    def compute_mask(self, query, mask=None):
        return None

    def finish(self, bias):
        """`(N, T, S)` -> `(1, N, T, S)` (a batched bias stays), compute dtype."""
        if bias.shape.rank == 3:
            bias = bias[None]  # (1, N, T, S)
        return tf.cast(bias, self.compute_dtype)
