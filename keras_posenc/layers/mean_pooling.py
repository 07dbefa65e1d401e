"""Mean pooling over the real tokens, defined for all-padding rows."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import build_sublayer, keras, register
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.ops import quantization


@register
class MeanPooling(keras.layers.Layer):
    """Mean over time of `(B, T, D)` inputs, counting only unmasked tokens.

    As `keras.layers.GlobalAveragePooling1D` with a Keras mask, except for a
    row with no real token: Keras divides 0 by 0 (NaN logits, and a division
    by zero that breaks int8 exports), this layer returns zeros (the divisor
    is at least 1). Masked inputs are zeroed first, so a NaN in a padded
    position never reaches the output (with `quantize=True` they are
    weighted by 0 instead, as the int8 model sums them).

    Args:
        quantize: bool, fake-quantize the sum and the mean as int8 TFLite
            rounds them, for quantization-aware training. Defaults to False.

    Call arguments:
        inputs: tensor `(B, T, D)`.
        mask: optional boolean `(B, T)`, True at real tokens (Keras passes it).
        training: bool, whether the batch updates the rounding ranges.

    Returns:
        A `(B, D)` tensor.

    Example:

    >>> import numpy as np
    >>> import keras_posenc
    >>> pool = keras_posenc.MeanPooling()
    >>> x = np.ones((2, 3, 4), "float32")
    >>> pool(x, mask=np.array([[True, True, False], [False, False, False]])).numpy()
    array([[1., 1., 1., 1.],
           [0., 0., 0., 0.]], dtype=float32)

    References:
        - [Lin et al., 2013 (global average pooling)](https://arxiv.org/abs/1312.4400)
    """

    def __init__(self, quantize=False, **kwargs):
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.quantize = quantize
        self.supports_masking = True
        self.rounding = rounding_points(self, ("sum", "output"), quantize)

    def build(self, input_shape):
        for point in self.rounding.values():
            build_sublayer(point, ())
        self.built = True

    def call(self, inputs, mask=None, training=None):
        r = rounder(self.rounding, training)
        if mask is None:
            return r("output", xp.reduce_mean(inputs, axis=1))
        mask = xp.cast(mask, xp.bool)[:, :, None]  # (B, T, 1)
        real = xp.where(mask, 1.0, 0.0)  # no bool-to-float cast: int8 SELECT
        if self.quantize:
            # The 0/1 weights on their exact grid, whole counts on a fixed
            # one (exact up to 255), the sum a BATCH_MATMUL by the weights:
            # a SELECT of the input would need its scale twice, which the
            # converter recomputes and then refuses as unequal.
            real = quantization.fake_quant(real, 0.0, 1.0)
            high = xp.maximum(255.0, _length(inputs))
            count = quantization.fake_quant(xp.reduce_sum(real, axis=1), 0.0, high)
            weights = xp.cast(xp.transpose(real, [0, 2, 1]), inputs.dtype)  # (B, 1, T)
            summed = xp.matmul(weights, inputs)[:, 0]
        else:
            count = xp.reduce_sum(real, axis=1)  # (B, 1)
            summed = xp.reduce_sum(xp.where(mask, inputs, xp.zeros_like(inputs)), 1)
        count = xp.cast(xp.maximum(count, 1.0), inputs.dtype)
        return r("output", r("sum", summed) / count)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"quantize": self.quantize})
        return config


def _length(inputs):
    """T of `(B, T, D)` as a float32 scalar."""
    return xp.cast(xp.shape(inputs)[1], xp.float32)
