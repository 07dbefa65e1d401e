"""Multi-head attention that adds a position bias to its logits."""

import tensorflow as tf

from keras_posenc import _checks
from keras_posenc._compat import (
    incoming_mask,
    keras,
    optional_layer,
    register,
    serialize_layer,
)
from keras_posenc.layers._attention_checks import check_call, check_heads
from keras_posenc.layers._projected_attention import ProjectedAttention
from keras_posenc.layers.rotary_embedding import RotaryEmbedding


@register
class RelativeMultiHeadAttention(ProjectedAttention):
    """Multi-head attention with a position bias: `softmax(QK^T/sqrt(H) + B) V`.

    Queries `(B, T, Dq)`, keys and values `(B, S, Dv)` of any widths are
    projected to `N` heads (`(B, T, N, H)`, `(B, S, N, H)`), the logits
    `(B, N, T, S)` get the bias `B` of `position_bias` (any producer of the
    bias contract: `RelativePositionBias`, `DynamicPositionBias`, ...) plus an
    optional call-time `attention_bias`; masked keys get exactly zero weight
    (a bounded penalty inside int8 exports, `ops.bounded_masking`). Softmax
    runs in float32 under mixed precision; the output is projected to `output_dim`
    (the query width by default). The projections are public, named as in
    Keras' layer: `query_dense`, `key_dense`, `value_dense`, `output_dense`.

    Subclasses change how attention is computed by overriding one method,
    `compute_attention(query, key, value, bias, mask, training)` (as Keras'
    `_compute_attention`): it takes projected, scaled heads-first heads (last
    two axes `(T, H)` / `(S, H)`; the `(T, 3W)` band in block-local mode),
    and returns the context `(..., T, Hv)` and the weights `(..., T, S)`.

    Built from Dense projections, reshapes and einsums on the heads-last
    `(B, T, N, H)` layout of Keras' layer (no GELU); the TFLite converter
    lowers the einsums to BATCH_MATMUL and TRANSPOSE, so with static shapes
    it exports to full-int8 TFLite and runs on microcontrollers. Keras masks work as in
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
        attention_window: int W for block-local self-attention: each block
            of W queries attends to its own and both neighbouring blocks (3W
            keys), so time and memory grow linearly in T and the bias is
            evaluated on the band (one band if it reads `j - i` only). It equals
            dense attention under `keras_posenc.ops.band_mask`. It takes Keras
            masks and causal masking, not an `attention_mask`, `attention_bias`,
            explicit positions or returned scores (no LSH attention: nothing
            here shows it beating this exact band). Defaults to `None` (dense).
        rotary: a `RotaryEmbedding` turning the projected queries and keys at
            their true positions, or None. Defaults to `None`.

    Call arguments:
        query: tensor `(B, T, Dq)`.
        value: optional tensor `(B, S, Dv)`; defaults to `query`
            (self-attention, also the form quantization-aware training wraps).
        key: optional tensor `(B, S, Dk)`; defaults to `value`.
        attention_mask: optional boolean `(B, T, S)`; True where attention is
            allowed.
        attention_bias: optional precomputed bias broadcastable to
            `(B, N, T, S)` (`(B, N, T, S_max)` with `cache`), added to the logits.
        use_causal_mask: bool, mask keys `j > i`. Defaults to `False`.
        return_attention_scores: bool, also return the `(B, N, T, S)`
            attention weights. Defaults to `False`.
        training: bool, whether dropout is active.
        query_mask, value_mask, key_mask: optional booleans `(B, T)`, `(B, S)`,
            `(B, S)`, True at real tokens; Keras passes the inputs' masks here
            (masked queries still get a finite output).
        start_index: int or scalar tensor, the position of the first query
            (decoding with a cache); keys sit at `0 .. S-1`. Defaults to `0`.
        positions: optional query positions `(T,)` or `(B, T)` (`(..., C)`
            coordinates for an N-D rotary) for the bias and the rotation.
        key_positions: optional key positions of the same form.
        cache: optional `(B, 2, S_max, N, H)` keys and values of positions
            `0 .. S_max - 1` (keras-hub's `CachedMultiHeadAttention` layout):
            the new tokens' keys and values are written at
            `cache_update_index`, the queries (at positions
            `cache_update_index + t`) attend causally over the cache with the
            bias and rotation at their true positions, and the call returns
            `(output, updated_cache)`.
        cache_update_index: int or scalar tensor, the position of the first
            new token; required with `cache`.

    Returns:
        The `(B, T, output_dim)` output; with `return_attention_scores` also
        the `(B, N, T, S)` weights; with `cache` also the updated cache.

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
        rotary=None,
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
        check_heads("position_bias", position_bias, num_heads)
        rotary = optional_layer("rotary", rotary, RotaryEmbedding)
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
        self.rotary = rotary
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

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
        start_index=0,
        positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
    ):
        self_attention = value is None and key is None  # Keras 2 converts query only
        value = query if value is None else tf.convert_to_tensor(value)
        key = value if key is None else tf.convert_to_tensor(key)
        check_call(
            self.attention_window,
            query,
            key,
            value,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            positions=positions,
            key_positions=key_positions,
            cache=cache,
            cache_update_index=cache_update_index,
            self_attention=self_attention,
            heads=(self.num_heads, self.key_dim, self.value_dim),
        )
        where = dict(
            start_index=start_index, positions=positions, key_positions=key_positions
        )
        pairs = ((query, query_mask), (value, value_mask), (key, key_mask))
        masks = [incoming_mask(tensor, mask) for tensor, mask in pairs]
        if cache is not None:  # decoding: self-attention over the cache
            extra = dict(attention_mask=attention_mask, attention_bias=attention_bias)
            return self.decode(query, cache, cache_update_index, **extra)
        q, k, v = self.project(query, key, value)  # (B, T|S, N, H)
        if self.rotary is not None:
            q, k = self.rotate(q, k, query, key, **where)
        context, weights = self.attend(
            (query, key),
            (q, k, v),
            masks,
            use_causal_mask,
            training,
            where,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
        )
        output = self.merge(context)  # (B, T, Dout)
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
                "position_bias": serialize_layer(self.position_bias),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "attention_window": self.attention_window,
                "rotary": serialize_layer(self.rotary),
            }
        )
        return config
