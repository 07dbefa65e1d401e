"""Fixed sinusoidal position encoding (Vaswani et al.)."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import keras, register
from keras_posenc.layers._positions import resolve_positions
from keras_posenc.ops import quantization


@register
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding of Vaswani et al.

    Feature `i` of position `p` is `sin(p / max_wavelength ** (2 * (i // 2) / D))`
    for even `i` and `cos(...)` for odd `i`, the values of keras-hub's
    `SinePositionEncoding`. The layer reads only the shape of its `(B, T, D)`
    input and returns the `(B, T, D)` encoding, computed in float32 and cast to
    the layer's compute dtype. Add it to the token embeddings. With static
    shapes it folds to a constant in TFLite.

    Args:
        max_wavelength: float, the longest wavelength of the sinusoids.
            Defaults to `10000.0`.
        quantize: bool, round the encoding to the int8 grid of [-1, 1]
            (the range of every sine and cosine, at any length or start) for
            quantization-aware training. Defaults to False.

    Call arguments:
        inputs: tensor `(B, T, D)`; only its shape is used.
        start_index: int or scalar tensor, the position of the first token
            (decoding with a cache). Defaults to `0`.
        positions: optional integer or float tensor `(T,)` or `(B, T)` of
            explicit positions (packing, left padding); overrides `start_index`.

    Returns:
        A `(B, T, D)` tensor.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> x = tf.zeros((2, 5, 8))
    >>> keras_posenc.SinusoidalPositionEncoding()(x).shape
    TensorShape([2, 5, 8])

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(self, max_wavelength=10000.0, quantize=False, **kwargs):
        max_wavelength = _checks.positive_float("max_wavelength", max_wavelength)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.quantize = quantize
        self.supports_masking = True

    def call(self, inputs, start_index=0, positions=None):
        width = _checks.known_width(inputs.shape)
        pos = resolve_positions(inputs, start_index, positions)
        encoding = ops.sinusoid(pos, width, self.max_wavelength)  # (T, D)/(B, T, D)
        encoding = xp.broadcast_to(encoding, xp.shape(inputs))  # (B, T, D)
        if self.quantize:  # a constant of sines and cosines: int8 on [-1, 1]
            encoding = quantization.fake_quant(encoding, -1.0, 1.0)
        return xp.cast(encoding, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"quantize": self.quantize, "max_wavelength": self.max_wavelength}
        )
        return config
