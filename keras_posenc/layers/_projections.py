"""The query, key, value and output projections of the attention layers."""

import math

import tensorflow as tf

from keras_posenc import _checks
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    keras,
)

#: The public names of the projections, as in `keras.layers.MultiHeadAttention`.
PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")


class Projections(keras.layers.Layer):
    """The projections of a subclass that stores the arguments of
    `RelativeMultiHeadAttention`, exposed under Keras' names, and the
    heads-last layout `(B, T, N, H)` they produce and consume."""

    def build(self, query_shape, value_shape=None, key_shape=None):
        width = _checks.known_width(query_shape, "query")
        heads_v = self.num_heads * (self.value_dim or self.key_dim)
        self._query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self._key_dense = self._dense(self.num_heads * self.key_dim, "key")
        self._value_dense = self._dense(heads_v, "value")
        self._output_dense = self._dense(self.output_dim or width, "attention_output")
        build_sublayer(self._query_dense, query_shape)
        if value_shape is None and IS_KERAS_3:
            value_shape = query_shape  # Keras 3 passes it unless self-attention
        # Keras 2 passes only the query shape: key/value build on first call.
        if value_shape is not None:
            build_sublayer(self._value_dense, value_shape)
            key_shape = key_shape if key_shape is not None else value_shape
            build_sublayer(self._key_dense, key_shape)
        build_sublayer(self._output_dense, tuple(query_shape[:-1]) + (heads_v,))
        if self.position_bias is not None and not self.position_bias.built:
            build_sublayer(self.position_bias, query_shape)
        if self.rotary is not None and not self.rotary.built:
            heads_shape = (None, None, self.num_heads, self.key_dim)
            build_sublayer(self.rotary, heads_shape)  # (B, T, N, H)
        self.built = True

    def compute_output_spec(
        self, query, value=None, key=None, return_attention_scores=False, **kwargs
    ):
        # Keras 3 only: the symbolic output, including the optional scores.
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        keys = (query if value is None else value).shape[1]
        scores_shape = (query.shape[0], self.num_heads, query.shape[1], keys)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def __dir__(self):
        # tf_keras' saver walks dir() in reverse order, so it would store the
        # projections under these public names; files have always stored them
        # under the private ones (Keras 3 walks in order and sees those first).
        names = super().__dir__()
        if IS_KERAS_3:
            return names
        return [name for name in names if name not in PROJECTIONS]

    @property
    def query_dense(self):
        """The query projection (a Dense layer), once built."""
        return getattr(self, "_query_dense", None)

    @property
    def key_dense(self):
        """The key projection (a Dense layer), once built."""
        return getattr(self, "_key_dense", None)

    @property
    def value_dense(self):
        """The value projection (a Dense layer), once built."""
        return getattr(self, "_value_dense", None)

    @property
    def output_dense(self):
        """The output projection (a Dense layer), once built."""
        return getattr(self, "_output_dense", None)

    def project(self, query, key, value):
        """Heads-last query, key, value `(B, T|S, N, H)`; queries scaled by 1/sqrt(H).

        Heads stay where the projection puts them (as in Keras'
        `MultiHeadAttention`): no transpose, which XLA cannot fuse away. When
        a rotary layer rotates every feature, `rotate` scales the queries
        (on their cos and sin, `(T, r/2)`, one product fewer per call).
        """
        q, k, v = (
            tf.reshape(dense(x), [-1, dim(x, 1), self.num_heads, size])
            for dense, x, size in (
                (self._query_dense, query, self.key_dim),
                (self._key_dense, key, self.key_dim),
                (self._value_dense, value, self.value_dim or self.key_dim),
            )
        )
        if self._scale_in_rotation():
            return q, k, v
        return q * tf.cast(self.query_scale, q.dtype), k, v

    @property
    def query_scale(self):
        """1/sqrt(H), the factor on the queries."""
        return 1.0 / math.sqrt(self.key_dim)

    def _scale_in_rotation(self):
        rotary = self.rotary
        return rotary is not None and rotary.rotary_width == self.key_dim

    def merge(self, context):
        """Heads-last context `(B, T, N, Hv)` -> the output `(B, T, output_dim)`."""
        shape = [-1, dim(context, 1), context.shape[2] * context.shape[3]]
        return self._output_dense(tf.reshape(context, shape))

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
