"""Multi-head attention that adds a position bias to its logits."""

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import dim, incoming_mask, keras, optional_layer, register
from keras_posenc.layers._projected_attention import ProjectedAttention


@register
class RelativeMultiHeadAttention(ProjectedAttention):
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
    projected to `output_dim` (the query width by default). The projections
    are public, named as in `keras.layers.MultiHeadAttention`: `query_dense`,
    `key_dense`, `value_dense`, `output_dense`.

    Subclasses change how attention is computed by overriding one method,
    `compute_attention(query, key, value, bias, mask, training)` (as Keras'
    `_compute_attention`): it takes projected, scaled heads whose last two
    axes are `(T, H)` / `(S, H)` (the `(T, 3W)` band in block-local mode),
    and returns the context `(..., T, Hv)` and the weights `(..., T, S)`.

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
            the `(T, 3W)` band only (at the keys' true positions), never on the
            `(T, S)` grid. Dense attention with `keras_posenc.ops.band_mask`
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
        query_mask: optional boolean `(B, T)`, True at real query tokens;
            Keras passes the query's mask here (masked queries still get a
            finite output).
        value_mask: optional boolean `(B, S)`, True at real value tokens;
            Keras passes the value's mask here.
        key_mask: optional boolean `(B, S)`, True at real key tokens; Keras
            passes the key's mask here.

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
        self._check_call(
            query,
            key,
            value,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
        )
        query_mask = incoming_mask(query, query_mask)
        value_mask = incoming_mask(value, value_mask)
        key_mask = incoming_mask(key, key_mask)
        q, k, v = self.project(query, key, value)  # (B, N, T|S, H)
        if self.attention_window is not None:
            keys = ops.combine_masks(1, 1, value_mask=value_mask, key_mask=key_mask)
            keys = None if keys is None else keys[:, 0]  # (B, S)
            context = self.local_context(
                (query, key), (q, k, v), keys, query_mask, use_causal_mask, training
            )
            return self._output_dense(ops.merge_heads(context))
        bias = None
        if self.position_bias is not None:
            bias = tf.cast(self.position_bias(query, key), tf.float32)
        if attention_bias is not None:
            extra = tf.cast(attention_bias, tf.float32)
            bias = extra if bias is None else bias + extra  # (B or 1, N, T, S)
        mask = ops.combine_masks(
            dim(query, 1),
            dim(value, 1),
            query_mask,
            value_mask,
            key_mask,
            attention_mask,
            use_causal_mask,
        )  # (B, T, S)
        mask = None if mask is None else mask[:, None]  # (B, 1, T, S)
        context, weights = self.compute_attention(q, k, v, bias, mask, training)
        output = self._output_dense(ops.merge_heads(context))  # (B, T, Dout)
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

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
