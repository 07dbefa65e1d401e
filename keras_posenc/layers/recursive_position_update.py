"""Recursive position update block: x + Attention(x) + PositionUpdate(x)."""

import functools

from keras_posenc import _checks
from keras_posenc._compat import (
    build_sublayer,
    incoming_mask,
    keras,
    optional_layer,
    register,
    serialize_layer,
)
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.ops import quantization

#: The two sums int8 TFLite rounds (`quantize`).
SUM_POINTS = ("attention_sum", "update_sum")


@register
class RecursivePositionUpdate(keras.layers.Layer):
    """`x_{l+1} = LayerNorm(x_l + Attention(x_l) + PositionUpdate(x_l))`.

    The recursive position update of docs/design.md. `Attention` is a content
    multi-head attention (`num_heads` heads of size `key_dim`).
    `PositionUpdate` is a small Transformer module that refines the position
    part of the representation: a narrow attention (`position_heads` heads of
    size `position_key_dim`) carrying a relative position bias, then a ReLU
    feed-forward of width `ff_dim` back to D:
    `PositionUpdate(x) = W2 relu(W1 RelAttn(x) + b1) + b2`. Stacking blocks
    refines positions layer after layer. Inputs and outputs are `(B, T, D)`;
    the LayerNorm is the int8-friendly `keras_posenc.LayerNorm`.

    Args:
        num_heads: int, heads N of the content attention.
        key_dim: int, head size H of the content attention.
        position_heads: int, heads of the narrow position attention.
            Defaults to `1`.
        position_key_dim: int, head size of the position attention.
            Defaults to `None` (`key_dim`).
        ff_dim: int, width of the position feed-forward. Defaults to `None`
            (D).
        dropout: float, attention dropout. Defaults to `0.0`.
        position_bias: bias-producing layer of the position attention.
            Defaults to `None` (a T5 `RelativePositionBias`).
        epsilon: float, the LayerNorm epsilon. Defaults to `1e-5`.
        attention_window: int, block-local window of both attentions (see
            `RelativeMultiHeadAttention`). Defaults to `None` (dense).
        quantize: False, True (fake-quantize what int8 TFLite rounds: both
            attentions, the feed-forward, the sums and the norm) or `"cache"`
            (the attentions' caches too, for causal LMs). Defaults to False.
        kernel_bits: int, with `quantize`, every kernel's grid: 8, or 4 (an
            int4 LM's). Defaults to `8`.

    Call arguments:
        inputs: tensor `(B, T, D)`.
        attention_mask: optional boolean `(B, T, T)`.
        use_causal_mask: bool. Defaults to `False`.
        training: bool, whether dropout is active.
        cache: optional pair `[content, position]` of the two attentions'
            caches (cached decoding, each as `RelativeMultiHeadAttention`'s
            `cache`).
        cache_update_index: int or scalar tensor, the position of the first
            new token; required with `cache`.
        segment_ids: optional int `(B, T)`, a packed row: both attentions
            stay inside each document, at positions that restart at 0 in it
            (`RelativeMultiHeadAttention`'s `segment_ids`).

    Returns:
        A `(B, T, D)` tensor; with `cache`, also the updated pair of caches.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> block = keras_posenc.RecursivePositionUpdate(num_heads=2, key_dim=4)
    >>> block(tf.random.normal((2, 6, 8))).shape
    TensorShape([2, 6, 8])

    References:
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Dehghani et al., 2019 (Universal Transformers)](https://arxiv.org/abs/1807.03819)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        position_heads=1,
        position_key_dim=None,
        ff_dim=None,
        dropout=0.0,
        position_bias=None,
        epsilon=1e-5,
        attention_window=None,
        quantize=False,
        kernel_bits=8,
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        key_dim = _checks.positive_int("key_dim", key_dim)
        position_heads = _checks.positive_int("position_heads", position_heads)
        position_key_dim = _checks.positive_int(
            "position_key_dim", position_key_dim, allow_none=True
        )
        ff_dim = _checks.positive_int("ff_dim", ff_dim, allow_none=True)
        dropout = _checks.rate("dropout", dropout)
        position_bias = optional_layer("position_bias", position_bias)
        epsilon = _checks.positive_float("epsilon", epsilon)
        attention_window = _checks.positive_int(
            "attention_window", attention_window, allow_none=True
        )
        if not (quantize is False or quantize is True or quantize == "cache"):
            _checks.fail("quantize", "False, True or 'cache'", quantize)
        _checks.rounds_on_tensorflow("quantize", quantize)
        kernel_bits = quantization.check_kernel_bits(kernel_bits)
        super().__init__(**kwargs)
        self.kernel_bits = kernel_bits
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.position_heads = position_heads
        self.position_key_dim = position_key_dim
        self.ff_dim = ff_dim
        self.dropout = dropout
        self.position_bias = position_bias
        self.epsilon = epsilon
        self.attention_window = attention_window
        self.quantize = quantize
        self.rounding = rounding_points(self, SUM_POINTS, bool(quantize))
        self.supports_masking = True

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        bias = self.position_bias or RelativePositionBias(
            self.position_heads, dtype=self.dtype_policy, name="position_bias"
        )
        rounding = {}
        if self.quantize:
            # True, or "cache": keys too
            rounding = dict(quantize=self.quantize, kernel_bits=self.kernel_bits)
        self.attention = RelativeMultiHeadAttention(
            self.num_heads,
            self.key_dim,
            dropout=self.dropout,
            attention_window=self.attention_window,
            dtype=self.dtype_policy,
            name="attention",
            **rounding,
        )
        self.position_attention = RelativeMultiHeadAttention(
            self.position_heads,
            self.position_key_dim or self.key_dim,
            dropout=self.dropout,
            position_bias=bias,
            attention_window=self.attention_window,
            dtype=self.dtype_policy,
            name="position_attention",
            **rounding,
        )
        dense = keras.layers.Dense
        if self.quantize:
            dense = functools.partial(QuantizedDense, kernel_bits=self.kernel_bits)
        self.position_hidden = dense(
            self.ff_dim or width,
            "relu",
            dtype=self.dtype_policy,
            name="position_hidden",
        )
        self.position_output = dense(
            width, dtype=self.dtype_policy, name="position_output"
        )
        self.norm = LayerNorm(
            self.epsilon,
            quantize=bool(self.quantize),
            dtype=self.dtype_policy,
            name="norm",
        )
        hidden_shape = tuple(input_shape[:-1]) + (self.ff_dim or width,)
        for layer, shape in (
            (self.attention, (input_shape, input_shape)),
            (self.position_attention, (input_shape, input_shape)),
            (self.position_hidden, (input_shape,)),
            (self.position_output, (hidden_shape,)),
            (self.norm, (input_shape,)),
        ):
            build_sublayer(layer, *shape)
        for point in self.rounding.values():
            build_sublayer(point, ())
        self.built = True

    def call(
        self,
        inputs,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        mask=None,
        cache=None,
        cache_update_index=None,
        segment_ids=None,
    ):
        if cache is not None and segment_ids is not None:
            _checks.fail(
                "segment_ids",
                "None with `cache` (decoding runs one document per row)",
                "a segment_ids tensor",
            )
        if cache is not None:  # both attentions decode causally over a cache
            if not isinstance(cache, (list, tuple)) or len(cache) != 2:
                _checks.fail(
                    "cache",
                    "a [content, position] pair",
                    type(cache).__name__,
                    error=TypeError,
                )
            content, attended = self.attention(
                inputs, cache=cache[0], cache_update_index=cache_update_index
            )
            position, seen = self.position_attention(
                inputs, cache=cache[1], cache_update_index=cache_update_index
            )
            update = self.position_output(self.position_hidden(position))
            return self._sum(inputs, content, update, training), [attended, seen]
        mask = incoming_mask(inputs, mask)  # Keras 3 passes none beside segment_ids
        kwargs = dict(
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            training=training,
            query_mask=mask,
            value_mask=mask,
            segment_ids=segment_ids,
        )
        attended = self.attention(inputs, **kwargs)
        update = self.position_update(inputs, **kwargs)
        return self._sum(inputs, attended, update, training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "position_heads": self.position_heads,
                "position_key_dim": self.position_key_dim,
                "ff_dim": self.ff_dim,
                "dropout": self.dropout,
                "position_bias": serialize_layer(self.position_bias),
                "epsilon": self.epsilon,
                "attention_window": self.attention_window,
                "quantize": self.quantize,
                "kernel_bits": self.kernel_bits,
            }
        )
        return config

    def _sum(self, inputs, attended, update, training=None):
        """`LayerNorm(x + Attention(x) + PositionUpdate(x))`, each sum rounded."""
        r = rounder(self.rounding, training)
        total = r("update_sum", r("attention_sum", inputs + attended) + update)
        return self.norm(total)

    def position_update(self, inputs, **attention_kwargs):
        """`PositionUpdate(x)`: narrow relative attention, then feed-forward."""
        attended = self.position_attention(inputs, **attention_kwargs)
        return self.position_output(self.position_hidden(attended))
