"""Multi-head attention that adds a position bias to its logits."""

import math

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    incoming_mask,
    keras,
    optional_layer,
    register,
)
from keras_posenc.layers._local_attention import check_local, local_context


@register
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with a position bias: `softmax(QK^T/sqrt(H) + B) V`.

    Queries `(B, T, Dq)`, keys and values `(B, S, Dv)` of any widths are
    projected to `N` heads (`(B, N, T, H)`, `(B, N, S, H)`), the logits
    `(B, N, T, S)` get the bias `B` of `position_bias` (any producer of the
    bias contract: `RelativePositionBias`, `DynamicPositionBias`, ...) plus an
    optional call-time `attention_bias`, and masked logits are replaced by
    `-keras_posenc.ops.MASK_PENALTY` (bounded, so int8 export stays accurate;
    a masked key is then invisible while some real logit in its row exceeds
    about -15, which the unmasked self/diagonal logit of any bias does).
    Softmax runs in float32 even under mixed precision. The output is
    projected to `output_dim` (the query width by default).

    Built from Dense projections, reshapes, transposes and BATCH_MATMUL (no
    einsum, no GELU), so with static shapes it exports to full-int8 TFLite
    and runs on microcontrollers. Keras masks work as in
    `keras.layers.MultiHeadAttention`; a fully masked row gives finite output.

    Args:
        num_heads: int, the number of heads N.
        key_dim: int, the size H of each query/key head.
        value_dim: int, the size of each value head. Defaults to `None`
            (same as `key_dim`).
        output_dim: int, the output width. Defaults to `None` (the query
            width).
        dropout: float, dropout rate on the attention weights.
            Defaults to `0.0`.
        use_bias: bool, whether the projections have biases.
            Defaults to `True`.
        position_bias: a bias-producing layer called as
            `position_bias(query, key)`, or None. Defaults to `None`.
        kernel_initializer: str or initializer for the projection kernels.
            Defaults to `"glorot_uniform"`.
        bias_initializer: str or initializer for the projection biases.
            Defaults to `"zeros"`.
        attention_window: int W for block-local self-attention: the
            sequence is cut into blocks of W and each query block attends to
            its own block and the two neighbouring ones (3W keys), so time and
            memory grow linearly in T and the position bias is evaluated on
            the `(T, 3W)` band only, never on the `(T, S)` grid. Dense
            attention with `keras_posenc.layers._local_attention.band_mask`
            gives the same result. Takes query/key Keras masks and causal
            masking, not a `(B, T, S)` `attention_mask`, `attention_bias` or
            returned scores. LSH attention is not offered: it was neither built
            nor measured here, so nothing shows it beating block-local, which
            is exact on its band and linear in T. Defaults to `None` (dense).

    Call arguments:
        query: tensor `(B, T, Dq)`.
        value: optional tensor `(B, S, Dv)`; defaults to `query`
            (self-attention, also the form quantization-aware training wraps).
        key: optional tensor `(B, S, Dk)`; defaults to `value`.
        attention_mask: optional boolean `(B, T, S)`; True where attention is
            allowed.
        attention_bias: optional precomputed bias broadcastable to
            `(B, N, T, S)`, added to the logits.
        use_causal_mask: bool, mask keys `j > i`. Defaults to `False`.
        return_attention_scores: bool, also return the `(B, N, T, S)`
            attention weights. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        The `(B, T, output_dim)` output, and with `return_attention_scores`
        also the `(B, N, T, S)` weights.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> attention = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4,
    ...     position_bias=keras_posenc.RelativePositionBias(num_heads=2))
    >>> x = tf.random.normal((3, 7, 16))
    >>> attention(x, x).shape
    TensorShape([3, 7, 16])

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        position_bias=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        attention_window=None,
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        key_dim = _checks.positive_int("key_dim", key_dim)
        value_dim = _checks.positive_int("value_dim", value_dim, allow_none=True)
        output_dim = _checks.positive_int("output_dim", output_dim, allow_none=True)
        dropout = _checks.rate("dropout", dropout)
        use_bias = _checks.boolean("use_bias", use_bias)
        attention_window = _checks.positive_int(
            "attention_window", attention_window, allow_none=True
        )
        position_bias = optional_layer("position_bias", position_bias)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.position_bias = position_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.attention_window = attention_window
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout)

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

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
    ):
        # Self-attention when `value` is omitted. Keras 2 converts only the
        # first positional argument.
        value = query if value is None else tf.convert_to_tensor(value)
        key = value if key is None else tf.convert_to_tensor(key)
        self._check_lengths(query, value, key)
        masks = (
            incoming_mask(query, query_mask),
            incoming_mask(value, value_mask),
            incoming_mask(key, key_mask),
        )
        if self.attention_window is not None:
            check_local(
                self.attention_window,
                query,
                key,
                attention_mask=attention_mask,
                attention_bias=attention_bias,
                return_attention_scores=return_attention_scores,
            )
        q = self._split_heads(self._query_dense(query), self.key_dim)  # (B, N, T, H)
        k = self._split_heads(self._key_dense(key), self.key_dim)  # (B, N, S, H)
        v = self._split_heads(self._value_dense(value), self.value_dim or self.key_dim)
        q = q * tf.cast(1.0 / math.sqrt(self.key_dim), q.dtype)
        if self.attention_window is not None:
            context = local_context(
                self, q, k, v, query, key, masks, use_causal_mask, training
            )
            return self._output_dense(self._merge_heads(context))
        mask = ops.combine_masks(
            dim(query, 1), dim(value, 1), *masks, attention_mask, use_causal_mask
        )  # (B, T, S)
        logits = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)  # (B, N, T, S)
        if self.position_bias is not None:
            logits += tf.cast(self.position_bias(query, key), tf.float32)
        if attention_bias is not None:
            logits += tf.cast(attention_bias, tf.float32)
        if mask is not None:
            logits = tf.where(mask[:, None], logits, -ops.MASK_PENALTY)  # (B, N, T, S)
        weights = tf.cast(tf.nn.softmax(logits, axis=-1), self.compute_dtype)
        dropped = self._dropout_layer(weights, training=training)
        context = tf.matmul(dropped, v)  # (B, N, T, Hv)
        output = self._output_dense(self._merge_heads(context))  # (B, T, Dout)
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

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

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "position_bias": None
                if self.position_bias is None
                else keras.layers.serialize(self.position_bias),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "attention_window": self.attention_window,
            }
        )
        return config

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _split_heads(self, x, size):
        """`(B, L, N*size)` -> `(B, N, L, size)`, with static shapes when known."""
        x = tf.reshape(x, [-1, dim(x, 1), self.num_heads, size])
        return tf.transpose(x, [0, 2, 1, 3])

    def _merge_heads(self, x):
        """`(B, N, T, Hv)` -> `(B, T, N*Hv)`."""
        x = tf.transpose(x, [0, 2, 1, 3])
        return tf.reshape(x, [-1, dim(x, 1), x.shape[2] * x.shape[3]])

    @staticmethod
    def _check_lengths(query, value, key):
        s_v, s_k = value.shape[1], key.shape[1]
        if s_v is not None and s_k is not None and s_v != s_k:
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={key.shape}, value.shape={value.shape}"
            )
