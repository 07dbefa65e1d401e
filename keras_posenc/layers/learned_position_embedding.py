"""Trainable absolute position table."""

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import keras, register
from keras_posenc.ops import quantization


@register
class LearnedPositionEmbedding(keras.layers.Layer):
    """Trainable absolute position embedding: one learned vector per position.

    A `(max_length, D)` table; the layer reads the shape of its `(B, T, D)` input
    and returns rows `start_index .. start_index + T - 1` (or the rows at
    explicit `positions`), broadcast to `(B, T, D)`. Positions past
    `max_length` have no row: use a relative method (`RelativePositionBias`)
    for longer sequences.

    Args:
        max_length: int, the number of positions K in the table.
        initializer: str or initializer, for the table.
            Defaults to `"glorot_uniform"`.
        quantize: bool, read the table's rows rounded to int8 (symmetric,
            one grid for every slice), for quantization-aware training.
            Defaults to False.

    Call arguments:
        inputs: tensor `(B, T, D)`; only its shape is used.
        start_index: int or scalar int tensor, the first position.
            Defaults to `0`.
        positions: optional integer tensor `(T,)` or `(B, T)`; overrides
            `start_index`.

    Returns:
        A `(B, T, D)` tensor.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> layer = keras_posenc.LearnedPositionEmbedding(max_length=16)
    >>> layer(tf.zeros((2, 5, 8))).shape
    TensorShape([2, 5, 8])

    References:
        - [Devlin et al., 2018](https://arxiv.org/abs/1810.04805)
    """

    def __init__(
        self, max_length, initializer="glorot_uniform", quantize=False, **kwargs
    ):
        max_length = _checks.positive_int("max_length", max_length)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.max_length = max_length
        self.quantize = quantize
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        self._check_length(input_shape[1])
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, width),
            initializer=self.initializer,
            trainable=True,
        )
        super().build(input_shape)

    def call(self, inputs, start_index=0, positions=None):
        table = self.embeddings
        if self.quantize:  # the int8 table, rows read as they are
            table = quantization.fake_quant_weight(table)
        table = xp.cast(table, self.compute_dtype)  # (K, D)
        if positions is not None:
            encoding = xp.gather(table, xp.cast(positions, xp.int32))
        else:
            length = inputs.shape[1]
            if isinstance(start_index, int) and length is not None:
                self._check_length(length, start_index)
                encoding = table[start_index : start_index + length]  # (T, D)
            else:
                length = xp.shape(inputs)[1]
                encoding = xp.slice(table, [start_index, 0], [length, -1])
        return xp.broadcast_to(encoding, xp.shape(inputs))  # (B, T, D)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "initializer": keras.initializers.serialize(self.initializer),
                "quantize": self.quantize,
            }
        )
        return config

    def _check_length(self, length, start_index=0):
        if length is not None and start_index + length > self.max_length:
            raise ValueError(
                f"`max_length` must cover the sequence. Received: max_length="
                f"{self.max_length} for positions {start_index}..."
                f"{start_index + length - 1}. Use a relative method such as "
                "RelativePositionBias for sequences longer than max_length"
            )
