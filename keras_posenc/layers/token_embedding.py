"""Token embedding that exports to a plain GATHER (microcontroller friendly)."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import keras, not_equal, register
from keras_posenc.ops import quantization


@register
class TokenEmbedding(keras.layers.Layer):
    """Token embedding `E[ids]`: integer ids `(B, T)` to vectors `(B, T, D)`.

    The same as `keras.layers.Embedding`, built on `tf.gather` alone. Keras
    3's `Embedding` remaps negative ids with LESS and SELECT ops, which TFLM
    does not have, so a model using it cannot run on a microcontroller; this
    layer exports to a single GATHER. With `mask_zero`, id 0 is padding and
    produces a Keras mask.

    Args:
        vocab_size: int, the number of token ids.
        output_dim: int, the embedding width D.
        mask_zero: bool, whether id 0 is padding. Defaults to `False`.
        embeddings_initializer: str or initializer. Defaults to `"uniform"`.
        quantize: bool, gather from the table rounded to int8 (symmetric, per
            tensor) for quantization-aware training. Defaults to False.

    Call arguments:
        inputs: integer tensor `(B, T)` of ids in `[0, vocab_size)`, or with
            `reverse` vectors `(B, T, D)`.
        reverse: bool, the tied output head: `x E^T`, logits `(B, T, V)`
            (keras-hub's `ReversibleEmbedding`). Defaults to `False`.

    Returns:
        A `(B, T, D)` tensor (`reverse`: `(B, T, V)`).

    Example:

    >>> import numpy as np
    >>> import keras_posenc
    >>> layer = keras_posenc.TokenEmbedding(vocab_size=10, output_dim=4)
    >>> layer(np.array([[1, 2, 3]])).shape
    TensorShape([1, 3, 4])

    References:
        - [Mikolov et al., 2013](https://arxiv.org/abs/1301.3781)
    """

    def __init__(
        self,
        vocab_size,
        output_dim,
        mask_zero=False,
        embeddings_initializer="uniform",
        quantize=False,
        **kwargs,
    ):
        vocab_size = _checks.positive_int("vocab_size", vocab_size)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        output_dim = _checks.positive_int("output_dim", output_dim)
        mask_zero = _checks.boolean("mask_zero", mask_zero)
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.output_dim = output_dim
        self.mask_zero = mask_zero
        self.quantize = quantize
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = mask_zero

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.output_dim),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def call(self, inputs, reverse=False):
        table = self.embeddings
        if self.quantize:  # the int8 table, rows gathered as they are
            table = quantization.fake_quant_weight(table)
        if reverse:  # tied output head: (B, T, D) -> (B, T, V)
            x = xp.cast(inputs, table.dtype)
            logits = xp.matmul(x, xp.cast(table, x.dtype), transpose_b=True)
            return xp.cast(logits, self.compute_dtype)
        ids = xp.cast(inputs, xp.int32)
        return xp.cast(xp.gather(table, ids), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def compute_output_spec(self, inputs, reverse=False):
        # Keras 3 only: the symbolic output of either direction.
        shape = tuple(inputs.shape[:-1]) + (self.vocab_size,)
        if not reverse:
            shape = self.compute_output_shape(inputs.shape)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def compute_mask(self, inputs, mask=None, reverse=False):
        if reverse or not self.mask_zero:
            return None
        return not_equal(inputs, 0)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "output_dim": self.output_dim,
                "mask_zero": self.mask_zero,
                "quantize": self.quantize,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
