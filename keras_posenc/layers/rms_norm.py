"""Root-mean-square normalization (Llama, Qwen, Gemma), int8 friendly."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import keep_float32_inputs, keras, register


@register
class RMSNorm(keras.layers.Layer):
    """RMS normalization over the last axis: `x * rsqrt(mean(x^2) + eps) * w`.

    Computed in float32 on `(..., D)` inputs and returned in the compute
    dtype, as HF transformers' `LlamaRMSNorm` and keras-hub's
    `LlamaLayerNorm` compute it. With `unit_offset` the scale is `1 + w`
    with `w` starting at zero (Gemma's `GemmaRMSNorm`). Built from MUL,
    MEAN, ADD and RSQRT, all with int8 kernels in TFLite and TFLM. Also the
    per-head query/key norm of Qwen 3 and Gemma 3 (`(B, T, N, H)` inputs,
    a scale of H).

    Args:
        epsilon: float, added to the mean square. Defaults to `1e-6`.
        unit_offset: bool, scale by `1 + w` (Gemma) instead of `w`.
            Defaults to `False`.

    Call arguments:
        inputs: tensor `(..., D)`.

    Returns:
        A tensor of the input's shape.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> y = keras_posenc.RMSNorm(epsilon=1e-6)(tf.constant([[3.0, 4.0]]))
    >>> [round(float(v), 3) for v in y[0]]
    [0.849, 1.131]

    References:
        - [Zhang and Sennrich, 2019](https://arxiv.org/abs/1910.07467)
    """

    def __init__(self, epsilon=1e-6, unit_offset=False, **kwargs):
        epsilon = _checks.positive_float("epsilon", epsilon)
        unit_offset = _checks.boolean("unit_offset", unit_offset)
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.unit_offset = unit_offset
        self.supports_masking = True
        keep_float32_inputs(self)

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        initializer = "zeros" if self.unit_offset else "ones"
        self.scale = self.add_weight(
            name="scale", shape=(width,), initializer=initializer
        )
        self.built = True

    def call(self, inputs):
        x = xp.cast(inputs, xp.float32)
        mean_square = xp.reduce_mean(x * x, axis=-1, keepdims=True)
        normalized = x * xp.math.rsqrt(mean_square + self.epsilon)
        scale = xp.cast(self.scale, xp.float32)
        if self.unit_offset:
            scale = scale + 1.0
        return xp.cast(normalized * scale, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon, "unit_offset": self.unit_offset})
        return config
