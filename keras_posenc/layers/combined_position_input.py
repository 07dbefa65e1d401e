"""Joint position-content input: concatenate positions to the embeddings."""

import functools

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import build_sublayer, keras, rank, register
from keras_posenc.layers.activation_range import ActivationRange
from keras_posenc.ops import quantization


@register
class CombinedPositionInput(keras.layers.Layer):
    """Joint position-content input: `concat([words, positions], axis=-1)`.

    The `combined_attention_input` of docs/design.md: word embeddings
    `(B, T, D)` and position embeddings `(B, T, P)` (or `(1, T, P)`, broadcast
    over the batch) become one `(B, T, D + P)` input for the attention, whose
    projections then mix content and position. The Keras mask of the words
    passes through.

    With `quantize=True` the joined tensor is rounded on one range learned in
    training (quantization-aware training): the int8 model rescales both
    parts to it, which the rounding models.

    Args:
        quantize: bool, round the output on a learned int8 range.
            Defaults to `False`.

    Call arguments:
        word_embeddings: tensor `(B, T, D)`.
        pos_embeddings: tensor `(B, T, P)` or `(1, T, P)`.
        training: bool, whether the batch updates the range (`quantize`).

    Returns:
        A `(B, T, D + P)` tensor.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> words, pos = tf.ones((2, 5, 8)), tf.zeros((2, 5, 8))
    >>> keras_posenc.CombinedPositionInput()(words, pos).shape
    TensorShape([2, 5, 16])

    References:
        - [Ke et al., 2020 (TUPE)](https://arxiv.org/abs/2006.15595)
    """

    def __init__(self, quantize=False, **kwargs):
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.quantize = quantize
        self.supports_masking = True
        self.output_range = None
        if quantize:
            self.output_range = ActivationRange(
                name="output_range", dtype=self.dtype_policy
            )

    def build(self, word_embeddings_shape, pos_embeddings_shape=None):
        if self.output_range is not None:
            build_sublayer(self.output_range, (None,))
        self.built = True

    def call(self, word_embeddings, pos_embeddings, training=None):
        pos_embeddings = xp.convert_to_tensor(pos_embeddings)  # Keras 2 passes numpy
        self._check_shapes(word_embeddings.shape, pos_embeddings.shape)
        pos = xp.cast(pos_embeddings, word_embeddings.dtype)
        if pos.shape[0] == 1 and word_embeddings.shape[0] != 1:
            batch = xp.shape(word_embeddings)[:1]
            pos = xp.broadcast_to(pos, xp.concat([batch, xp.shape(pos)[1:]], 0))
        if self.output_range is None:
            return xp.concat([word_embeddings, pos], axis=-1)  # (B, T, D + P)
        # The range learns from the joined tensor; the int8 model computes it
        # as each part placed by a product with a slice of the identity
        # (exact on the int8 grid), rounded on the output's range, and their
        # sum: FULLY_CONNECTED and ADD rescale to the output's range, where a
        # CONCATENATION (or PAD) holds its operands to one scale and the
        # converter refuses the words' when it equals the output's.
        joined = xp.concat([word_embeddings, pos], axis=-1)  # (B, T, D + P)
        if training:
            self.output_range(joined, training=True)
        words_width = word_embeddings.shape[-1]
        place = xp.eye(joined.shape[-1], dtype=xp.float32)
        place = xp.cast(quantization.fake_quant_weight(place), joined.dtype)
        words = xp.tensordot(word_embeddings, place[:words_width], [[2], [0]])
        pos = xp.tensordot(pos, place[words_width:], [[2], [0]])
        rounded = functools.partial(self.output_range, training=False)  # learned
        return rounded(rounded(words) + rounded(pos))

    def compute_output_shape(self, word_embeddings_shape, pos_embeddings_shape=None):
        width = None
        if pos_embeddings_shape is not None:
            widths = (word_embeddings_shape[-1], pos_embeddings_shape[-1])
            width = None if None in widths else sum(widths)
        return tuple(word_embeddings_shape[:-1]) + (width,)

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        config = super().get_config()
        config.update({"quantize": self.quantize})
        return config

    @staticmethod
    def _check_shapes(word_shape, pos_shape):
        if rank(word_shape) != 3 or rank(pos_shape) != 3:
            raise ValueError(
                "`word_embeddings` and `pos_embeddings` must both have rank 3 "
                f"(B, T, D). Received: word_embeddings.shape={word_shape}, "
                f"pos_embeddings.shape={pos_shape}"
            )
        for axis, name in ((0, "batch"), (1, "length")):
            a, b = word_shape[axis], pos_shape[axis]
            if axis == 0 and b == 1:
                continue
            if a is not None and b is not None and a != b:
                raise ValueError(
                    f"`pos_embeddings` must match the {name} of `word_embeddings`"
                    f" (or have batch 1). Received: word_embeddings.shape="
                    f"{word_shape}, pos_embeddings.shape={pos_shape}"
                )


def combined_attention_input(word_embeddings, pos_embeddings):
    """Concatenates word and position embeddings: `(B, T, D + P)`.

    Works on eager tensors and on symbolic inputs of a functional model in
    both Keras modes (it calls a `CombinedPositionInput` layer).

    Example:

    >>> import tensorflow as tf
    >>> from keras_posenc import combined_attention_input
    >>> combined_attention_input(tf.ones((2, 5, 8)), tf.zeros((2, 5, 4))).shape
    TensorShape([2, 5, 12])
    """
    return CombinedPositionInput()(word_embeddings, pos_embeddings)
