"""Layer normalization written with ops that quantize to pure int8."""

import tensorflow as tf

from keras_posenc import _checks
from keras_posenc._compat import keep_float32_inputs, keras, register


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

    Call arguments:
        inputs: tensor `(..., D)`.

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

    def __init__(self, epsilon=1e-5, **kwargs):
        epsilon = _checks.positive_float("epsilon", epsilon)
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.supports_masking = True
        keep_float32_inputs(self)  # as Keras' LayerNormalization

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        self.gamma = self.add_weight(name="gamma", shape=(width,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(width,), initializer="zeros")
        self.built = True

    def call(self, inputs):
        x = tf.cast(inputs, tf.float32)
        centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        # centered * centered, not SQUARED_DIFFERENCE: LiteRT has no int16
        # kernel for the latter, and 16x8 export needs one.
        variance = tf.reduce_mean(centered * centered, axis=-1, keepdims=True)
        y = centered * tf.math.rsqrt(variance + self.epsilon)
        y = y * tf.cast(self.gamma, tf.float32) + tf.cast(self.beta, tf.float32)
        return tf.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon})
        return config
