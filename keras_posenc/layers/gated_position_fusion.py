"""Gated fusion of absolute and relative positions."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    build_sublayer,
    dim,
    incoming_mask,
    keras,
    rank,
    register,
)
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.layers.segment_positions import check_segment_ids


@register
class GatedPositionFusion(keras.layers.Layer):
    """Gated fusion: `g * abs + (1 - g) * mean_j rel`, `g = sigmoid(W abs + b)`.

    The `gated_position_fusion` of docs/design.md, made a layer so the gate's
    Dense is created once (the sketch created a new one on every call). The
    absolute encoding `abs_pos` is `(B, T, D)`; the relative term is either
    a dense `(B, T, S, D)` tensor (memory `B*T*S*D`), or a relative *table*
    `(2M + 1, D)` with one vector per clipped distance `clip(j - i, -M, M)`,
    whose mean over the `S` keys is computed in O(T*D) with prefix sums
    (`keras_posenc.ops.clipped_table_mean`) and agrees with the dense form.
    With `max_distance` set and no `rel_pos` given, the layer learns its own
    table. Gate math runs in float32.

    Args:
        max_distance: int, the clipping distance M of the layer's own learned
            relative table; `None` means `rel_pos` is always passed.
            Defaults to `None`.
        kernel_initializer: str or initializer, for the gate kernel.
            Defaults to `"glorot_uniform"`.
        table_initializer: str or initializer, for the own relative table.
            Defaults to `"glorot_uniform"`.
        causal: bool, the relative term averages over the keys `j <= i` only
            (causal language models: no position sees a later one).
            Defaults to `False` (all `S` keys).
        quantize: bool, round the fused encoding on a learned range (QAT;
            int8 TFLite holds it as a constant), without a Keras mask or
            `segment_ids`. Defaults to False.

    Call arguments:
        abs_pos: tensor `(B, T, D)`, absolute position encoding.
        rel_pos: optional tensor `(B, T, S, D)` (dense) or `(2M + 1, D)`
            (table).
        key_length: int, S for the table paths, or a `(B,)` tensor of key
            counts. Defaults to T.
        mask: optional boolean `(B, T)` Keras mask of `abs_pos`: the keys
            averaged are the real tokens (right padding), so padding never
            changes the output at real tokens.
        start_index: int or scalar tensor, the position of the first query
            (decoding with a cache; keys start at 0). Defaults to `0`.
        segment_ids: optional int `(B, T)`, a packed row
            (`keras_posenc.ops.segments`): each query averages over the keys
            of its own document, at positions that restart at 0 in it (as
            the document alone). Self-attention shapes (S = T).
        training: bool, whether the batch updates the rounding range
            (`quantize`).

    Returns:
        A `(B, T, D)` tensor.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> fusion = keras_posenc.GatedPositionFusion()
    >>> abs_pos = tf.random.normal((2, 5, 8))
    >>> rel_table = tf.random.normal((7, 8))  # M = 3
    >>> fusion(abs_pos, rel_table).shape
    TensorShape([2, 5, 8])

    References:
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Ke et al., 2020 (TUPE)](https://arxiv.org/abs/2006.15595)
    """

    def __init__(
        self,
        max_distance=None,
        kernel_initializer="glorot_uniform",
        table_initializer="glorot_uniform",
        causal=False,
        quantize=False,
        **kwargs,
    ):
        max_distance = _checks.positive_int("max_distance", max_distance, True)
        causal = _checks.boolean("causal", causal)
        quantize = _checks.rounds_on_tensorflow(
            "quantize", _checks.boolean("quantize", quantize)
        )
        super().__init__(**kwargs)
        self.causal = causal
        self.quantize = quantize
        self.rounding = rounding_points(self, ("output",), quantize)
        self.max_distance = max_distance
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.table_initializer = keras.initializers.get(table_initializer)
        self.supports_masking = True

    def build(self, abs_pos_shape, rel_pos_shape=None):
        width = _checks.known_width(abs_pos_shape, "abs_pos")
        self.gate = keras.layers.Dense(
            width,
            kernel_initializer=self.kernel_initializer,
            dtype="float32",
            name="gate",
        )
        build_sublayer(self.gate, abs_pos_shape)
        if self.max_distance is not None:
            self.table = self.add_weight(
                name="table",
                shape=(2 * self.max_distance + 1, width),
                initializer=self.table_initializer,
            )
        for point in self.rounding.values():
            build_sublayer(point, ())
        self.built = True

    def call(
        self,
        abs_pos,
        rel_pos=None,
        key_length=None,
        start_index=0,
        mask=None,
        segment_ids=None,
        training=None,
    ):
        if self.quantize and (mask is not None or segment_ids is not None):
            given = "a Keras mask" if segment_ids is None else "segment_ids"
            _checks.fail(
                "quantize",
                "False with a Keras mask or segment_ids (the mean over the real "
                "keys is computed at run time; its int8 rounding is not modelled)",
                True,
                fix=f"Received {given}",
            )
        absolute = xp.cast(abs_pos, xp.float32)  # (B, T, D)
        gate = xp.sigmoid(self.gate(absolute))  # (B, T, D)
        if segment_ids is not None:  # Keras 3 passes no mask beside segment_ids
            mask = incoming_mask(abs_pos, mask)
            relative = self._packed_mean(abs_pos, rel_pos, segment_ids, mask)
            fused = gate * absolute + (1.0 - gate) * relative
            return xp.cast(fused, self.compute_dtype)
        if mask is not None and key_length is None:  # only real tokens are keys
            key_length = xp.reduce_sum(xp.cast(mask, xp.int32), axis=1)  # (B,)
            key_length = xp.maximum(key_length, 1)  # an all-padding row stays finite
        relative = self.relative_mean(abs_pos, rel_pos, key_length, start_index)
        fused = gate * absolute + (1.0 - gate) * relative
        fused = rounder(self.rounding, training)("output", fused)
        return xp.cast(fused, self.compute_dtype)

    def compute_output_shape(self, abs_pos_shape, rel_pos_shape=None):
        return tuple(abs_pos_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_distance": self.max_distance,
                "causal": self.causal,
                "quantize": self.quantize,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "table_initializer": keras.initializers.serialize(
                    self.table_initializer
                ),
            }
        )
        return config

    def _packed_mean(self, abs_pos, rel_pos, segment_ids, mask=None):
        """`relative_mean` of a packed row: each query over the real keys
        of its own run."""
        segment_ids = xp.convert_to_tensor(segment_ids)
        check_segment_ids(segment_ids)
        rel_pos = self._relative(rel_pos)
        if rank(rel_pos) == 4:  # (B, T, S, D)
            runs = ops.segments.runs(segment_ids)
            seen = ops.segments.same_run(runs, runs)  # (B, T, S)
            if mask is not None:
                seen = xp.logical_and(seen, xp.cast(mask, xp.bool)[:, None, :])
            if self.causal:
                causal = ops.causal_mask(dim(rel_pos, 1), dim(rel_pos, 2))
                seen = xp.logical_and(seen, causal[None])
            seen = xp.cast(seen, xp.float32)[..., None]
            count = xp.maximum(xp.reduce_sum(seen, axis=2), 1.0)
            return xp.reduce_sum(rel_pos * seen, axis=2) / count
        return ops.clipped_table_mean(
            rel_pos,
            dim(abs_pos, 1),
            ops.segments.lengths(segment_ids, mask),
            causal=self.causal,
            positions=ops.segments.positions(segment_ids),
        )  # (B, T, D)

    def relative_mean(self, abs_pos, rel_pos=None, key_length=None, start_index=0):
        """The float32 relative term `mean_j rel[:, :, j]`: `(B, T, D)` or `(T, D)`."""
        rel_pos = self._relative(rel_pos)
        if rank(rel_pos) == 4:
            seen = xp.ones_like(rel_pos[:1, :, :, :1])  # (1, T, S, 1)
            if self.causal:
                seen = ops.cache.cache_mask(
                    start_index, dim(rel_pos, 1), dim(rel_pos, 2)
                )
                seen = xp.cast(seen, xp.float32)[None, :, :, None]
            if key_length is not None and not isinstance(key_length, int):
                keys = xp.range(dim(rel_pos, 2))[None, :] < key_length[:, None]
                seen = seen * xp.cast(keys, xp.float32)[:, None, :, None]
            count = xp.maximum(xp.reduce_sum(seen, axis=2), 1.0)
            return xp.reduce_sum(rel_pos * seen, axis=2) / count
        length = dim(abs_pos, 1)
        keys = length if key_length is None else key_length
        return ops.clipped_table_mean(
            rel_pos, length, keys, start_index, self.causal
        )  # (T, D)

    def _relative(self, rel_pos):
        """Float32 `rel_pos` (the own table when None), its shape checked."""
        if rel_pos is None:
            if self.max_distance is None:
                raise ValueError(
                    "`rel_pos` is required when the layer has no table of its "
                    "own. Received: rel_pos=None with max_distance=None. Pass a "
                    "relative tensor or table, or set max_distance"
                )
            rel_pos = self.table
        rel_pos = xp.cast(rel_pos, xp.float32)
        ndim = rank(rel_pos)
        if ndim != 4 and (
            ndim != 2 or rel_pos.shape[0] is None or rel_pos.shape[0] % 2 == 0
        ):
            raise ValueError(
                "`rel_pos` must be a dense (B, T, S, D) tensor or a (2M + 1, D) "
                f"table with an odd row count. Received: rel_pos.shape="
                f"{rel_pos.shape}"
            )
        return rel_pos


def gated_position_fusion(abs_pos, rel_pos):
    """`g * abs_pos + (1 - g) * mean_j rel_pos`, as in docs/design.md.

    Builds a `GatedPositionFusion` layer, so it works on symbolic inputs of a
    functional model in both Keras modes. Each call creates a new gate: in an
    eager loop, create one `GatedPositionFusion` and reuse it instead.

    Example:

    >>> import tensorflow as tf
    >>> from keras_posenc import gated_position_fusion
    >>> out = gated_position_fusion(tf.ones((2, 4, 8)), tf.ones((2, 4, 4, 8)))
    >>> out.shape
    TensorShape([2, 4, 8])
    """
    return GatedPositionFusion()(abs_pos, rel_pos)
