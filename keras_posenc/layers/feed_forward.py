"""The feed-forward block of a decoder layer: plain or gated (SwiGLU, GeGLU)."""

from keras_posenc import _checks
from keras_posenc._compat import build_sublayer, clone_initializer, keras, register
from keras_posenc.ops.activations import ACTIVATIONS


@register
class FeedForward(keras.layers.Layer):
    """A position-wise feed-forward block: `down(act(x W_up))`, or gated.

    Plain: `down_dense(act(up_dense(x)))`. Gated (`gated=True`, Shazeer
    2020's GLU variants: SwiGLU with `"silu"`, GeGLU with `"gelu_tanh"`):
    `down_dense(act(gate_dense(x)) * up_dense(x))`. Inputs `(..., D)`, the
    hidden width I = `intermediate_dim`, outputs `(..., output_dim or D)`.
    The activations are written out (`keras_posenc.ops.activations`) so
    that the int8 export keeps kernels TFLM has.

    Args:
        intermediate_dim: int, the hidden width I.
        output_dim: int or None, the output width. Defaults to `None` (D).
        activation: str, one of `ops.activations.ACTIVATIONS` (`"relu"`,
            `"gelu"`, `"gelu_tanh"`, `"silu"`). Defaults to `"relu"`.
        gated: bool, multiply the activation by a second projection.
            Defaults to `False`.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        dropout: float, dropout on the output. Defaults to `0.0`.
        kernel_initializer: the kernels' initializer. Defaults to
            `"glorot_uniform"`.

    Call arguments:
        inputs: tensor `(..., D)`.
        training: bool, whether dropout is active.

    Returns:
        A tensor `(..., output_dim or D)`.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> ffn = keras_posenc.FeedForward(32, activation="silu", gated=True)
    >>> ffn(tf.ones((2, 5, 8))).shape
    TensorShape([2, 5, 8])

    References:
        - [Shazeer, 2020](https://arxiv.org/abs/2002.05202)
    """

    def __init__(
        self,
        intermediate_dim,
        output_dim=None,
        activation="relu",
        gated=False,
        use_bias=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        intermediate_dim = _checks.positive_int("intermediate_dim", intermediate_dim)
        output_dim = _checks.positive_int("output_dim", output_dim, allow_none=True)
        activation = _checks.choice("activation", activation, tuple(ACTIVATIONS))
        gated = _checks.boolean("gated", gated)
        use_bias = _checks.boolean("use_bias", use_bias)
        dropout = _checks.rate("dropout", dropout)
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.output_dim = output_dim
        self.activation = activation
        self.gated = gated
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        hidden_shape = tuple(input_shape[:-1]) + (self.intermediate_dim,)
        self.gate_dense = None
        if self.gated:
            self.gate_dense = self._dense(self.intermediate_dim, "gate")
            build_sublayer(self.gate_dense, input_shape)
        self.up_dense = self._dense(self.intermediate_dim, "up")
        self.down_dense = self._dense(self.output_dim or width, "down")
        build_sublayer(self.up_dense, input_shape)
        build_sublayer(self.down_dense, hidden_shape)
        self._dropout_layer = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy
        )
        self.built = True

    def call(self, inputs, training=None):
        act = ACTIVATIONS[self.activation]
        if self.gated:
            hidden = act(self.gate_dense(inputs)) * self.up_dense(inputs)
        else:
            hidden = act(self.up_dense(inputs))
        return self._dropout_layer(self.down_dense(hidden), training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "output_dim": self.output_dim,
                "activation": self.activation,
                "gated": self.gated,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config

    @property
    def integer_blocker(self):
        """Why an int8 export of this layer has no integer kernels, or None."""
        if self.activation == "gelu":
            return (
                "the exact GELU's error function (ERF) has no integer kernel; "
                "use activation='gelu_tanh' (TANH, MUL and ADD)"
            )
        return None

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
