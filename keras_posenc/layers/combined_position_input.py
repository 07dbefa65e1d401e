"""Joint position-content input: concatenate positions to the embeddings."""

import tensorflow as tf

from keras_posenc._compat import keras, register


@register
class CombinedPositionInput(keras.layers.Layer):
    """Joint position-content input: `concat([words, positions], axis=-1)`.

    The `combined_attention_input` of docs/design.md: word embeddings
    `(B, T, D)` and position embeddings `(B, T, P)` (or `(1, T, P)`, broadcast
    over the batch) become one `(B, T, D + P)` input for the attention, whose
    projections then mix content and position. The Keras mask of the words
    passes through.

    Call arguments:
        word_embeddings: tensor `(B, T, D)`.
        pos_embeddings: tensor `(B, T, P)` or `(1, T, P)`.

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

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, word_embeddings, pos_embeddings):
        pos_embeddings = tf.convert_to_tensor(pos_embeddings)  # Keras 2 passes numpy
        self._check_shapes(word_embeddings.shape, pos_embeddings.shape)
        pos = tf.cast(pos_embeddings, word_embeddings.dtype)
        if pos.shape[0] == 1 and word_embeddings.shape[0] != 1:
            batch = tf.shape(word_embeddings)[:1]
            pos = tf.broadcast_to(pos, tf.concat([batch, tf.shape(pos)[1:]], 0))
        return tf.concat([word_embeddings, pos], axis=-1)  # (B, T, D + P)

    def compute_output_shape(self, word_embeddings_shape, pos_embeddings_shape=None):
        width = None
        if pos_embeddings_shape is not None:
            widths = (word_embeddings_shape[-1], pos_embeddings_shape[-1])
            width = None if None in widths else sum(widths)
        return tuple(word_embeddings_shape[:-1]) + (width,)

    def compute_mask(self, inputs, mask=None):
        return mask

    @staticmethod
    def _check_shapes(word_shape, pos_shape):
        if word_shape.rank != 3 or pos_shape.rank != 3:
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
