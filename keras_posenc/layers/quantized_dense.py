"""A Dense layer trained as int8 TFLite runs it."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import build_sublayer, keras, rank, register
from keras_posenc.layers.activation_range import ActivationRange
from keras_posenc.ops import quantization


@register
class QuantizedDense(keras.layers.Dense):
    """`keras.layers.Dense` with its kernel and output fake-quantized to int8.

    The kernel is rounded symmetrically to [-127, 127] steps of `max |W| / 127`
    (per tensor, as TFLite's fully connected kernel; with `kernel_bits=4`,
    [-7, 7] steps of `max |W| / 7`, as an INT4 export stores it) and the output, after
    the activation, on a learned range (`ActivationRange`). It takes every
    `Dense` argument; `tflite_export.quantize_aware` puts one in place of
    each `Dense` of a model, with its weights. A `Dense` that reads a float
    model input also rounds its input (`quantize_inputs=True`), as the int8
    model quantizes the features it is given.

    Args:
        units: int, the output width.
        activation: the activation, as `keras.layers.Dense` takes it (second
            positional argument there too). Defaults to `None`.
        momentum: float in [0, 1), the ranges' moving-average momentum.
            Defaults to `0.99`.
        quantize_inputs: bool, also round the input on a learned range.
            Defaults to `False`.
        kernel_bits: int, the kernel's grid: 8, or 4 (int4 LMs' projections).
            Defaults to `8`.
        **kwargs: the other `keras.layers.Dense` arguments.

    Call arguments:
        inputs: `(..., D_in)`.
        training: bool, whether the batch updates the output range.

    Returns:
        `(..., units)`.

    Example:
    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> dense = keras_posenc.layers.QuantizedDense(4, activation="relu")
    >>> dense(tf.ones((2, 3)), training=True).shape
    TensorShape([2, 4])

    References:
        - [Jacob et al., 2018](https://arxiv.org/abs/1712.05877)
    """

    def __init__(
        self,
        units,
        activation=None,
        momentum=0.99,
        quantize_inputs=False,
        kernel_bits=8,
        **kwargs,
    ):
        _checks.rounding_layer(self)
        momentum = _checks.rate("momentum", momentum)
        quantize_inputs = _checks.boolean("quantize_inputs", quantize_inputs)
        kernel_bits = quantization.check_kernel_bits(kernel_bits)
        super().__init__(units, activation, **kwargs)
        self.momentum = momentum
        self.quantize_inputs = quantize_inputs
        self.kernel_bits = kernel_bits
        self.input_range = (
            ActivationRange(momentum, name="input_range", dtype=self.dtype_policy)
            if quantize_inputs
            else None
        )
        self.output_range = ActivationRange(
            momentum, name="output_range", dtype=self.dtype_policy
        )

    def build(self, input_shape):
        super().build(input_shape)
        if self.input_range is not None:
            build_sublayer(self.input_range, tuple(input_shape))
        build_sublayer(self.output_range, tuple(input_shape[:-1]) + (self.units,))

    def call(self, inputs, training=None):
        if self.input_range is not None:
            inputs = self.input_range(inputs, training=training)
        kernel = quantization.fake_quant_weight(self.kernel, self.kernel_bits)
        kernel = xp.cast(kernel, inputs.dtype)
        if rank(inputs) > 2:
            outputs = xp.tensordot(inputs, kernel, [[rank(inputs) - 1], [0]])
        else:
            outputs = xp.matmul(inputs, kernel)
        if self.use_bias:
            outputs = outputs + xp.cast(self.bias, outputs.dtype)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return self.output_range(outputs, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "quantize_inputs": self.quantize_inputs,
                "kernel_bits": self.kernel_bits,
            }
        )
        return config
