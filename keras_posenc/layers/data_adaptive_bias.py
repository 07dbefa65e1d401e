"""DAPE: a static bias refined by an MLP of what attention itself sees."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    add_float32_weight,
    build_sublayer,
    keras,
    optional_layer,
    register,
    serialize_layer,
)
from keras_posenc.layers._bias_layer import BiasLayer


@register
class DataAdaptiveBias(BiasLayer):
    """Bias `B + f([A, B])`: a static bias refined per pair from the logits `A`.

    DAPE (Zheng et al. 2024, "Data-Adaptive Positional Encoding for Length
    Extrapolation"): for every (query, key) pair, the logits `A = QK^T/sqrt(H)`
    of all N heads and the static bias `B` of all heads (`static_bias`, e.g. a
    `KerpleBias`) go through one small MLP, `f(x) = W2 leaky_relu(W1 x + b1) +
    b2` (`2N -> hidden_dim -> N`, negative slope 0.01), whose N outputs are
    added to the bias: the attention then adds `B + f([A, B])` to its logits.
    The position bias is computed from what attention itself reads. Called
    like any producer it returns the static bias `(1, N, T, S)`; the attention
    adds `adapt(logits, bias)` to it where its logits and bias meet (every
    path but LSH: dense, block-local, cached, rolling; an attention refuses a
    call-time `attention_bias` beside it, which the MLP would read as
    position). `f` runs per pair, so a causal mask still hides every later
    key and cached decoding equals a recompute. The MLP costs `T S (3N W)`
    multiplies per example and layer; it exports to int8 (TFLite's
    FULLY_CONNECTED and LEAKY_RELU; the bias half folds into a constant),
    and its rounding is not modelled for quantization-aware training.

    Args:
        num_heads: int, the number of attention heads N.
        static_bias: a bias producer (a `KerpleBias`, `RelativePositionBias`,
            `FireBias` or `DynamicPositionBias` of `num_heads` heads), or its
            serialized dict.
        hidden_dim: int, the MLP width W. Defaults to `32`.
        kernel_initializer: str or initializer, for the MLP kernels.
            Defaults to `"glorot_uniform"`.

    Call arguments:
        query: tensor `(B, T, ...)`; only its length is used.
        key: optional tensor `(B, S, ...)`; defaults to `query`.
        start_index: int or scalar tensor, the first query's position.
            Defaults to `0`.
        positions: optional tensor `(T,)` or `(B, T)` of query positions.
        key_positions: optional tensor `(S,)` or `(B, S)` of key positions.

    Returns:
        The static bias `(1, N, T, S)` (or `(B, N, T, S)`); `adapt(logits,
        bias)` gives the term `(B, N, T, S)`, float32.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> dape = keras_posenc.DataAdaptiveBias(
    ...     2, keras_posenc.KerpleBias(2, bidirectional=False), hidden_dim=8)
    >>> attention = keras_posenc.RelativeMultiHeadAttention(
    ...     2, 4, position_bias=dape)
    >>> x = tf.random.normal((3, 7, 8))
    >>> attention(x, x, use_causal_mask=True).shape
    TensorShape([3, 7, 8])

    References:
        - [Zheng et al., 2024 (DAPE)](https://arxiv.org/abs/2405.14722)
    """

    #: Attention calls `adapt(logits, bias)` where its logits meet the bias.
    reads_logits = True

    def __init__(
        self,
        num_heads,
        static_bias,
        hidden_dim=32,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        static_bias = optional_layer("static_bias", static_bias, BiasLayer)
        if static_bias is None or isinstance(static_bias, DataAdaptiveBias):
            _checks.fail(
                "static_bias",
                "a bias producer that does not read the logits (KerpleBias, "
                "RelativePositionBias, FireBias, DynamicPositionBias)",
                static_bias,
                error=TypeError,
            )
        if static_bias.num_heads != num_heads:
            _checks.fail(
                "static_bias",
                f"a producer of num_heads={num_heads} heads",
                f"{static_bias.num_heads} heads",
            )
        hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.static_bias = static_bias
        self.hidden_dim = hidden_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, query_shape=None, key_shape=None):
        if not self.static_bias.built:
            build_sublayer(self.static_bias, query_shape)
        heads, width = self.num_heads, self.hidden_dim
        shapes = {
            "logit_kernel": (heads, width),
            "bias_kernel": (heads, width),
            "hidden_bias": (width,),
            "output_kernel": (width, heads),
            "output_bias": (heads,),
        }
        for name, shape in shapes.items():
            initializer = "zeros" if name.endswith("_bias") else self.kernel_initializer
            weight = add_float32_weight(
                self, name=name, shape=shape, initializer=initializer, trainable=True
            )
            setattr(self, name, weight)
        self.built = True

    def call(self, query, key=None, start_index=0, positions=None, key_positions=None):
        bias = self.static_bias(
            query,
            key,
            start_index=start_index,
            positions=positions,
            key_positions=key_positions,
        )
        return xp.cast(bias, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "static_bias": serialize_layer(self.static_bias),
                "hidden_dim": self.hidden_dim,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config

    @property
    def translation_invariant(self):
        """Whether the static bias depends on `j - i` alone."""
        return getattr(self.static_bias, "translation_invariant", False)

    def bias_between(self, query_positions, key_positions):
        """The static bias between positions (`BiasLayer.bias_between`)."""
        return self.static_bias.bias_between(query_positions, key_positions)

    def adapt(self, logits, bias):
        """`f([A, B])`, float32 `(B, M, T, S)`, of heads-first logits and bias."""
        weights = (
            self.logit_kernel,
            self.bias_kernel,
            self.hidden_bias,
            self.output_kernel,
            self.output_bias,
        )
        return ops.kernels.data_adaptive_term(logits, bias, weights, self.num_heads)
