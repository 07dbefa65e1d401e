"""Projections and the attention computation shared by attention layers."""

import math

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    keras,
)

#: The public names of the projections, as in `keras.layers.MultiHeadAttention`.
PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")


class ProjectedAttention(keras.layers.Layer):
    """Query/key/value/output projections and `compute_attention`.

    The subclass stores `num_heads`, `key_dim`, `value_dim`, `output_dim`,
    `use_bias`, the initializers, `attention_window`, `position_bias` and a
    `_dropout_layer`; this base builds the projections, exposes them under
    Keras' names and runs logits -> weights -> context, dense or block-local.
    """

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
        """Query, key, value heads `(B, N, T|S, H)`; queries scaled by 1/sqrt(H)."""
        q = ops.split_heads(self._query_dense(query), self.num_heads)
        k = ops.split_heads(self._key_dense(key), self.num_heads)
        v = ops.split_heads(self._value_dense(value), self.num_heads)
        return q * tf.cast(1.0 / math.sqrt(self.key_dim), q.dtype), k, v

    def compute_attention(self, query, key, value, bias=None, mask=None, training=None):
        """Logits -> weights -> context: the one override point.

        Args:
            query: `(..., T, H)` scaled query heads.
            key: `(..., S, H)` key heads.
            value: `(..., S, Hv)` value heads.
            bias: float32 tensor broadcastable to `(..., T, S)`, or None.
            mask: boolean tensor broadcastable to `(..., T, S)`, or None.
            training: bool, whether dropout is active.

        Returns:
            `(context (..., T, Hv), weights (..., T, S))`.
        """
        logits = tf.cast(tf.matmul(query, key, transpose_b=True), tf.float32)
        if bias is not None:
            logits += bias
        if mask is not None:
            logits = tf.where(mask, logits, -ops.MASK_PENALTY)
        weights = tf.cast(tf.nn.softmax(logits, axis=-1), self.compute_dtype)
        dropped = self._dropout_layer(weights, training=training)
        return tf.matmul(dropped, value), weights

    def local_context(self, inputs, heads, key_mask, query_mask, causal, training):
        """Block-local context `(B, N, T, Hv)`: the band, then `compute_attention`.

        `inputs` are the `(query, key)` tensors the position bias reads,
        `heads` the projected `(q, k, v)`; the bias is evaluated at each
        block's true query and key positions, `(nb, N, W, 3W)`.
        """
        q, k, v = heads
        window, length = self.attention_window, dim(q, 2)
        query_pos, key_pos = ops.blocks.block_positions(length, window)
        bias = None
        if self.position_bias is not None:
            bias = self.position_bias(
                *inputs, positions=query_pos, key_positions=key_pos
            )  # (nb, N, W, 3W)
            bias = ops.blocks.fold_bias(tf.cast(bias, tf.float32))  # (1, N*nb, W, 3W)
        allowed = ops.blocks.band_allowed(
            query_pos, key_pos, length, self.num_heads, key_mask, query_mask, causal
        )  # (B or 1, N*nb, W, 3W)
        context, _ = self.compute_attention(
            ops.blocks.to_blocks(q, window),
            ops.blocks.to_band(k, window),
            ops.blocks.to_band(v, window),
            bias,
            allowed,
            training,
        )
        return ops.blocks.from_blocks(context, self.num_heads, length)

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _check_call(self, query, key, value, **call_arguments):
        """Errors for calls the layer cannot honour, before any work."""
        s_v, s_k = value.shape[1], key.shape[1]
        if s_v is not None and s_k is not None and s_v != s_k:
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={key.shape}, value.shape={value.shape}"
            )
        window = self.attention_window
        if window is None:
            return
        t, s = query.shape[1], key.shape[1]
        if t is not None and s is not None and t != s:
            raise ValueError(
                "`attention_window` needs self-attention (equal query and key "
                f"lengths). Received: query.shape={query.shape}, key.shape={key.shape}"
            )
        if call_arguments["return_attention_scores"]:
            raise ValueError(
                "`return_attention_scores` needs the dense (T, S) weights, which "
                "local attention never builds. Received: return_attention_scores="
                f"True with attention_window={window}"
            )
        for name in ("attention_mask", "attention_bias"):
            if call_arguments[name] is not None:
                raise ValueError(
                    f"`{name}` is a (B, T, S) tensor, which local attention never "
                    f"builds. Received: {name} with attention_window={window}; use "
                    "query/key masks instead"
                )
