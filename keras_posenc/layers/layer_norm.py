"""Layer normalization written with ops that quantize to pure int8."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import (
    build_sublayer,
    keep_float32_inputs,
    keras,
    register,
)
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.ops import quantization

#: The tensors int8 TFLite rounds inside a layer norm, in order.
ROUNDING_POINTS = (
    "mean",
    "centered",
    "square",
    "variance",
    "variance_epsilon",
    "inverse_deviation",
    "normalized",
    "scaled",
    "output",
)


@register
class LayerNorm(keras.layers.Layer):
    """Layer normalization over the last axis, microcontroller friendly.

    `y = d * rsqrt(mean(d * d) + epsilon) * gamma + beta` with `d = x - mean(x)`,
    computed in float32 on `(..., D)` inputs and returned in the compute
    dtype. It equals `keras.layers.LayerNormalization(epsilon=epsilon)` but is
    built from MEAN, SUB, MUL, RSQRT and ADD, which convert to pure int8 (and
    16x8) TFLite and run in TFLM (Keras' own layer leaves a float NEG island,
    and tf_keras' aborts in 16x8 mode).

    Args:
        epsilon: float, added to the variance. Defaults to `1e-5`.
        quantize: bool, fake-quantize every tensor int8 TFLite rounds (each
            op's output on a learned range, `gamma`, `beta` and `epsilon` on
            their own) for quantization-aware training. Defaults to False.

    Call arguments:
        inputs: tensor `(..., D)`.
        training: bool, whether the batch updates the rounding ranges
            (`quantize=True`).

    Returns:
        A tensor of the input's shape.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> y = keras_posenc.LayerNorm()(tf.constant([[1.0, 2.0, 3.0]]))
    >>> [round(float(v), 3) for v in y[0]]
    [-1.225, 0.0, 1.225]

    References:
        - [Ba et al., 2016](https://arxiv.org/abs/1607.06450)
    """

    def __init__(self, epsilon=1e-5, quantize=False, **kwargs):
        epsilon = _checks.positive_float("epsilon", epsilon)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.quantize = quantize
        self.rounding = rounding_points(self, ROUNDING_POINTS, quantize)
        self.supports_masking = True
        keep_float32_inputs(self)  # as Keras' LayerNormalization

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        self.gamma = self.add_weight(name="gamma", shape=(width,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(width,), initializer="zeros")
        for point in self.rounding.values():
            build_sublayer(point, ())
        self.built = True

    def call(self, inputs, training=None):
        r = rounder(self.rounding, training)
        x = xp.cast(inputs, xp.float32)
        centered = r("centered", x - r("mean", xp.reduce_mean(x, -1, keepdims=True)))
        # centered * centered, not SQUARED_DIFFERENCE: LiteRT has no int16
        # kernel for the latter, and 16x8 export needs one.
        square = r("square", centered * centered)
        variance = r("variance", xp.reduce_mean(square, axis=-1, keepdims=True))
        gamma, beta = (xp.cast(w, xp.float32) for w in (self.gamma, self.beta))
        epsilon = xp.constant(self.epsilon, xp.float32)
        if self.quantize:  # constants on their own int8 ranges, as converted
            gamma, beta, epsilon = map(
                quantization.fake_quant_constant, (gamma, beta, epsilon)
            )
        shifted = r("variance_epsilon", variance + epsilon)
        if self.quantize:  # a variance rounded to 0: RSQRT saturates, never inf
            shifted = xp.maximum(shifted, self.epsilon)
        inverse = r("inverse_deviation", xp.math.rsqrt(shifted))
        y = r("scaled", r("normalized", centered * inverse) * gamma)
        return xp.cast(r("output", y + beta), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon, "quantize": self.quantize})
        return config

    @property
    def output_range(self):
        """The `ActivationRange` of the output (`quantize=True`), else None."""
        return self.rounding.get("output")
