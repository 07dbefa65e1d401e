"""An Add layer whose sum is rounded as int8 TFLite rounds it."""

from keras_posenc._compat import build_sublayer, keras, register
from keras_posenc.layers.activation_range import ActivationRange, Momentum


@register
class QuantizedAdd(Momentum, keras.layers.Add):
    """`keras.layers.Add` with its sum fake-quantized on a learned range.

    `tflite_export.quantize_aware` puts one in place of each `Add` (residual
    connections) of a model.

    Args:
        momentum: float in [0, 1), the range's moving-average momentum.
            Defaults to `0.99`.

    Call arguments:
        inputs: a list of tensors of one shape.
        training: bool, whether the batch updates the range.

    Returns:
        Their sum, rounded to int8 levels.

    Example:
    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> add = keras_posenc.layers.QuantizedAdd()
    >>> add([tf.ones((1, 2)), tf.ones((1, 2))], training=True).shape
    TensorShape([1, 2])

    References:
        - [Jacob et al., 2018](https://arxiv.org/abs/1712.05877)
    """

    def __init__(self, momentum=0.99, **kwargs):
        super().__init__(momentum, **kwargs)
        self.output_range = ActivationRange(
            momentum, name="output_range", dtype=self.dtype_policy
        )

    def build(self, input_shape):
        super().build(input_shape)
        build_sublayer(self.output_range, tuple(input_shape[0]))

    def call(self, inputs, training=None):
        return self.output_range(super().call(inputs), training=training)
