"""Contextual position encoding (CoPE): the attention counts its own positions."""

from keras_posenc import _checks, ops
from keras_posenc._compat import add_float32_weight, keras, register


@register
class ContextualPosition(keras.layers.Layer):
    """Logit term `q_i . e[p_ij]`, `p_ij = sum_{t=j..i} sigmoid(q_i . k_t)`.

    Contextual position encoding (Golovneva et al. 2024, CoPE): a position is
    not a token count but a count of what the query finds relevant. Every
    key `t` between the key `j` and the query `i` adds its gate
    `sigmoid(q_i . k_t)` (the attention's own scaled logit), so "the third
    sentence back" can be a position when the gates fire on sentence ends.
    The position `p_ij` (clamped to `max_position`) is fractional; the term
    interpolates between the learned embeddings `e` `(H, max_position + 1)`
    of its floor and ceiling and is added to the logit. It is not a bias
    producer: it needs the queries and the (masked) logits, which
    `RelativeMultiHeadAttention(contextual_position=...)` hands it (masked
    keys get gate 0, so padding and the causal mask count nothing);
    block-local attention hands it each band, whose counts are the dense
    ones under the band mask (every key between a band key and its query is
    in the band). Causal,
    as in the paper. Without a causal mask the one-sided count runs to the
    last key, so an encoder would measure positions from the sequence end,
    not from the query (measured: as `none`, `docs/measurements.md`);
    `bidirectional=True` (the encoder builders' choice) counts from the
    query to the key on each side instead, `sum_{t=j..i}` before it and
    `sum_{t=i..j}` after it, each side with its own embeddings
    (`benchmarks/results/content_positions.md`: the best row at unseen
    spacing). Decoding needs no state: each new query recounts over the
    cached keys (O(S) per step; one-sided only). Embeddings start small and
    random (the paper's code starts them at zero, which leaves a fresh model
    blind to order). Position math in float32.

    Args:
        max_position: int, the largest position counted (the paper's
            `npos_max - 1`). Defaults to `16`.
        initializer: str or initializer, for the embeddings.
            Defaults to `"truncated_normal"`.
        bidirectional: bool, count on both sides of the query (in encoders,
            later keys get their own embeddings). Defaults to `False` (the
            paper's causal count).

    Call arguments:
        queries: `(B, T, N, H)` scaled query heads (heads-last).
        logits: `(B, N, T, S)` query-key logits before any bias.
        mask: optional boolean, broadcastable to `(B, N, T, S)`: keys each
            query may attend to.
        query_offset: optional int, the key index of the first query (query
            `i` is key `i + query_offset`); read by the two-sided count only.
            Defaults to `S - T` (the queries are the last keys; a
            block-local band's W queries are its keys `W .. 2W - 1`).
        training: bool or None, Keras' training flag. In training the
            interpolation runs as one XLA-compiled function
            (`ops.contextual.interpolated_logits(fused=True)`, the same values
            and gradients; XLA's gathers and scatters run several times
            faster than TensorFlow's here); outside training (inference, every export)
            plain ops.

    Returns:
        A float32 term `(B, N, T, S)` to add to the logits.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> cope = keras_posenc.ContextualPosition(max_position=8)
    >>> attention = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4, contextual_position=cope
    ... )
    >>> attention(tf.random.normal((1, 6, 8)), use_causal_mask=True).shape
    TensorShape([1, 6, 8])

    In an encoder, count from the query on both sides:

    >>> both = keras_posenc.ContextualPosition(max_position=8, bidirectional=True)
    >>> encoder = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4, contextual_position=both
    ... )
    >>> encoder(tf.random.normal((1, 6, 8))).shape
    TensorShape([1, 6, 8])
    >>> both.embeddings.shape  # (H, 2 (max_position + 1)): one half per side
    TensorShape([4, 18])

    References:
        - [Golovneva et al., 2024 (CoPE)](https://arxiv.org/abs/2405.18719)
    """

    def __init__(
        self,
        max_position=16,
        initializer="truncated_normal",
        bidirectional=False,
        **kwargs,
    ):
        max_position = _checks.positive_int("max_position", max_position)
        bidirectional = _checks.boolean("bidirectional", bidirectional)
        super().__init__(**kwargs)
        self.max_position = max_position
        self.initializer = keras.initializers.get(initializer)
        self.bidirectional = bidirectional

    def build(self, queries_shape, logits_shape=None, mask_shape=None):
        head_dim = _checks.known_width(queries_shape, "queries")
        self.embeddings = add_float32_weight(
            self,
            name="embeddings",
            shape=(head_dim, (self.max_position + 1) * (1 + self.bidirectional)),
            initializer=self.initializer,
            trainable=True,
        )
        self.built = True

    def call(self, queries, logits, mask=None, query_offset=None, training=None):
        positions = self.positions(logits, mask, query_offset)
        return ops.contextual.interpolated_logits(
            queries, self.embeddings, positions, fused=training is True
        )

    def compute_output_shape(self, queries_shape, logits_shape=None, mask_shape=None):
        return tuple(logits_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_position": self.max_position,
                "initializer": keras.initializers.serialize(self.initializer),
                "bidirectional": self.bidirectional,
            }
        )
        return config

    def positions(self, logits, mask=None, query_offset=None):
        """The float32 positions `p` `(B, N, T, S)` the term reads (for plots).

        Bidirectional: a key after the query reads `max_position + 1 + p`.
        """
        return ops.contextual.contextual_positions(
            logits, mask, self.max_position, self.bidirectional, query_offset
        )
