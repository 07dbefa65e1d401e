"""Fake quantization of an activation on a range learned while training."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import (
    add_float32_weight,
    keep_float32_inputs,
    keras,
    register,
)
from keras_posenc.ops import quantization


class Momentum:
    """The `momentum` argument of a layer whose ranges learn by a moving
    average (`ActivationRange`, `QuantizedAdd`): checked, stored, configured."""

    def __init__(self, momentum=0.99, **kwargs):
        _checks.rounding_layer(self)
        momentum = _checks.rate("momentum", momentum)
        super().__init__(**kwargs)
        self.momentum = momentum

    def get_config(self):
        config = super().get_config()
        config.update({"momentum": self.momentum})
        return config


@register
class ActivationRange(Momentum, keras.layers.Layer):
    """Rounds its input to the int8 grid of a range learned from the batches.

    In training the range is the first batch's own (widened to hold 0), then
    an exponential moving average of each batch's minimum and maximum
    (`momentum` of the old range); outside training the learned range is
    used unchanged. The rounding is `tf.quantization.fake_quant_with_min_max_vars`,
    which the TFLite converter reads as the int8 scale and zero point of the
    tensor, so a model whose every rounded tensor passes one of these converts
    to full int8 without a representative dataset
    (`tflite_export.quantize_aware`). Until it has seen a training batch the
    range is [0, 1e-6] and the output is (nearly) zeros.

    Args:
        momentum: float in [0, 1), the share of the old range kept per batch.
            Defaults to `0.99`.

    Call arguments:
        inputs: a float tensor.
        training: bool, whether the batch updates the range.

    Returns:
        The input rounded to 256 levels of the range.

    Example:
    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> rounding = keras_posenc.layers.ActivationRange()
    >>> _ = rounding(tf.constant([0.0, 1.0]), training=True)  # range [0, 1]
    >>> round(float(rounding(tf.constant([0.25]))[0]) * 255, 3)  # on the grid
    64.0

    References:
        - [Jacob et al., 2018](https://arxiv.org/abs/1712.05877)
    """

    def __init__(self, momentum=0.99, **kwargs):
        super().__init__(momentum, **kwargs)
        self.supports_masking = True
        keep_float32_inputs(self)  # rounds in the dtype it is given

    def build(self, input_shape):
        for name in ("minimum", "maximum", "batches"):
            weight = add_float32_weight(
                self, name=name, shape=(), initializer="zeros", trainable=False
            )
            setattr(self, name, weight)
        self.built = True

    def call(self, inputs, training=None):
        if training:
            low, high = quantization.moving_range(
                self.minimum,
                self.maximum,
                inputs,
                xp.equal(self.batches, 0.0),
                self.momentum,
            )
            self.minimum.assign(low)
            self.maximum.assign(high)
            self.batches.assign_add(1.0)
            return quantization.fake_quant(inputs, low, high)
        return quantization.fake_quant(inputs, self.minimum, self.maximum)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)
