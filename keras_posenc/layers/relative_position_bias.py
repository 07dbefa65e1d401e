"""Relative position bias for attention logits: T5 buckets, Shaw clipping, ALiBi."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import keras, rank, register
from keras_posenc.layers._bias_layer import BiasLayer

MODES = ("t5", "clipped", "alibi")


@register
class RelativePositionBias(BiasLayer):
    """Per-head bias `B[h, i, j]` that depends only on the distance `j - i`.

    Follows the package's bias contract: called with the query `(B, T, ...)`
    and key `(B, S, ...)` (only their lengths are read) or with explicit
    positions, it returns a `(1, N, T, S)` bias (`(B, N, T, S)` for per-example
    positions `(B, T)`) that `RelativeMultiHeadAttention` adds to the logits:
    `softmax(Q K^T / sqrt(H) + B) V`.

    - `"t5"`: a learned `(num_buckets, num_heads)` table indexed by the T5 /
      Mesh TensorFlow bucket of `j - i` (exact for short distances,
      logarithmic up to `max_distance`).
    - `"clipped"`: Shaw et al.; one learned scalar per head and distance
      `clip(j - i, -max_distance, max_distance)` (`[-max_distance, 0]` when
      not bidirectional), a `(2 * max_distance + 1, N)` or
      `(max_distance + 1, N)` table.
    - `"alibi"`: no weights; `-m_h |j - i|` with the fixed slopes of Press et
      al. With `bidirectional=True`, heads alternate direction so attention
      can tell left from right: even heads look left (slope `m_h` before the
      query, `2 m_h` after) and odd heads look right (the mirror image).

    The bias grows without bound with distance only in `"alibi"` mode, which
    therefore extrapolates to any length; `"t5"` and `"clipped"` are constant
    beyond `max_distance`.

    Args:
        num_heads: int, the number of attention heads N.
        mode: str, one of `"t5"`, `"clipped"`, `"alibi"`. Defaults to `"t5"`.
        num_buckets: int, the T5 bucket count K (even when bidirectional).
            Defaults to `32`.
        max_distance: int, the T5 saturation distance or the clipping
            distance. Defaults to `128`.
        bidirectional: bool, whether keys after the query are told apart
            from keys before it (False for causal models). Defaults to `True`.
        initializer: str or initializer, for the learned table (small random
            values, so position matters from the first step).
            Defaults to `"truncated_normal"`.

    Call arguments:
        query: tensor `(B, T, ...)`; only its length is used.
        key: optional tensor `(B, S, ...)`; defaults to `query`.
        start_index: int or scalar tensor, the position of the first query
            token; keys are at `0 .. S-1` (decoding with a cache).
            Defaults to `0`.
        positions: optional tensor `(T,)` or `(B, T)` of query positions;
            overrides `start_index`.
        key_positions: optional tensor `(S,)` or `(B, S)` of key positions.

    Returns:
        A `(1, N, T, S)` (or `(B, N, T, S)`) bias in the compute dtype.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> bias = keras_posenc.RelativePositionBias(num_heads=4, mode="alibi")
    >>> bias(tf.zeros((2, 6, 8))).shape
    TensorShape([1, 4, 6, 6])

    References:
        - [Raffel et al., 2020 (T5)](https://arxiv.org/abs/1910.10683)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Press et al., 2022 (ALiBi)](https://arxiv.org/abs/2108.12409)
    """

    def __init__(
        self,
        num_heads,
        mode="t5",
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        initializer="truncated_normal",
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        mode = _checks.choice("mode", mode, MODES)
        bidirectional = _checks.boolean("bidirectional", bidirectional)
        num_buckets = _checks.positive_int("num_buckets", num_buckets, minimum=2)
        max_distance = _checks.positive_int("max_distance", max_distance)
        if mode == "t5" and bidirectional and num_buckets % 2:
            _checks.fail(
                "num_buckets",
                "an even integer >= 2 when bidirectional",
                num_buckets,
            )
        smallest = num_buckets // 2 if bidirectional else num_buckets
        if mode == "t5" and max_distance <= smallest // 2:
            _checks.fail(
                "max_distance",
                f"greater than the exact-bucket range {smallest // 2}",
                max_distance,
            )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.mode = mode
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, query_shape=None, key_shape=None):
        if self.mode == "t5":
            rows = self.num_buckets
        elif self.mode == "clipped":
            rows = self.max_distance * (2 if self.bidirectional else 1) + 1
        else:
            rows = None
        if rows is not None:
            self.table = self.add_weight(
                name="table",
                shape=(rows, self.num_heads),
                initializer=self.initializer,
                trainable=True,
            )
        self.built = True

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mode": self.mode,
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config

    def bias_between(self, query_positions, key_positions):
        """Float32 bias `(..., N, T, S)` between positions `(..., T)`, `(..., S)`."""
        relative = ops.relative_positions(query_positions, key_positions)
        if self.mode == "alibi":
            return ops.alibi_bias(relative, self.num_heads, self.bidirectional)
        relative = xp.cast(xp.round(relative), xp.int32)
        if self.mode == "t5":
            index = ops.t5_relative_position_bucket(
                relative, self.bidirectional, self.num_buckets, self.max_distance
            )
        else:
            index = ops.clipped_relative_index(
                relative, self.max_distance, self.bidirectional
            )
        table = xp.transpose(xp.cast(self.table, xp.float32))  # (N, K)
        if rank(index) == 2:
            return xp.gather(table, index, axis=1)  # (N, T, S), no transpose
        bias = xp.gather(table, index, axis=1)  # (N, B, T, S)
        return xp.transpose(bias, [1, 0, 2, 3])  # (B, N, T, S)
