"""Rotary positions inside `RelativeMultiHeadAttention` (a mixin).

Turns the projected queries and keys at their positions (`rotary`), and with
`quantize=True` rounds the cos and sin tables, each side's products and their
sum as int8 TFLite does (`ROTARY_POINTS`; xPos' key tables on a learned bound,
`XPOS_POINT`).
"""

from keras_posenc import ops
from keras_posenc._backend import xp
from keras_posenc._compat import rank
from keras_posenc.layers._rounding import rounder
from keras_posenc.ops import quantization

#: With a rotary layer (`quantize=True`): the two products and the sum of
#: each side (the queries' sum replaces `scaled_query`: the rotation scales).
ROTARY_POINTS = tuple(
    f"{side}_{name}" for side in ("query", "key") for name in ("cos", "sin", "rotated")
)
#: With xPos: the bound of the keys' tables, which grows with the position
#: (learned from the tables of the lengths trained on).
XPOS_POINT = "key_table"


class RotaryAttention:
    """The rotary path of `RelativeMultiHeadAttention`: `_rotate` and its
    int8 rounding. It reads the layer's `rotary`, `quantize` and `rounding`."""

    def _rotate(
        self,
        q,
        k,
        query,
        key,
        start_index=0,
        positions=None,
        key_positions=None,
        max_length=None,
        length=None,
        training=None,
        rows=None,
    ):
        """`rotary` applied to heads-last `(B, T|S, N, H)` at their true positions.

        Scales the queries by 1/sqrt(H) when `project` left it to the rotation.
        A length-dependent rotary type reads one current length for both
        sides: `length` when given (a decoding step: the tokens so far), else
        the largest position + 1.
        `max_length` is the cache length S_max of a decoding step: inside
        `ops.cache.static_decoding()`, the cos and sin of every cached
        position then fold into a constant and the step gathers the rows of
        its runtime positions (no SIN, COS or EXP on the device) when the
        rotary layer is `position_only`: at the integer `rows` when given
        (one tensor for both sides, or a pair: the queries' and the keys',
        as a rolling cache's places), so no float position enters the export.
        """
        q_pos = self.rotary.resolve(query, start_index, positions)  # (..., T, C)
        k_pos = self.rotary.resolve(key, 0, key_positions)  # (..., S, C)
        # One current length for both sides keeps q.k relative.
        if not self._length_dependent():
            length = None
        elif length is None:
            length = xp.maximum(xp.reduce_max(q_pos), xp.reduce_max(k_pos)) + 1.0
        tabulate = max_length is not None and ops.cache.is_static()
        tabulate = tabulate and self.rotary.position_only and rank(q_pos) == 2
        side_rows = {"query": rows, "key": rows}  # integer rows, never rounded
        if isinstance(rows, tuple):  # (query rows, key rows)
            side_rows = dict(zip(("query", "key"), rows))
            rows = None
        if self.quantize:
            rows = rows if tabulate else None
            return [
                self._rotate_rounded(x, where, side, max_length, rows, training)
                for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key"))
            ]
        rotated = []
        for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key")):
            if tabulate:  # (T, 1) positions: rows of a constant table
                at = side_rows[side]
                at = xp.cast(where[:, 0], xp.int32) if at is None else at
                rotated.append(self._rotate_rows(x, side, at, max_length))
            else:
                cos, sin = self.rotary.cos_sin(where, side, length)
                rotated.append(self._turn(x, side, cos, sin))
        return rotated

    def _rotate_rows(self, x, side, rows, table_length, heads_first=False):
        """`x` `(B, T, N, H)` (or `(B, N, T, H)`) of one side rotated at
        integer `rows` `(T,)` of a constant table of positions `0 ..
        table_length - 1` (exports: no SIN, COS or EXP on the device, no
        float position)."""
        every = ops.position_range(table_length)[:, None]  # (S_max, 1)
        cos, sin = (xp.gather(t, rows) for t in self.rotary.cos_sin(every, side))
        return self._turn(x, side, cos, sin, heads_first)

    def _turn(self, x, side, cos, sin, heads_first=False):
        """`x` of one side turned by `cos`, `sin` `(..., T, r/2)`."""
        if side == "query" and self._scale_in_rotation():
            cos, sin = cos * self._query_scale, sin * self._query_scale
        if not (self.rotary.learned_frequencies or heads_first):  # one per head
            cos, sin = cos[..., None, :], sin[..., None, :]
        return ops.rotary.rotate(x, cos, sin, self.rotary.interleaved)

    def _table_rows(self, length, index):
        """Integer rows `index .. index + T - 1` of the rotation tables.

        An export gathers the rows at these integers: a position cast to
        float on its way would be an activation the int8 converter rounds
        (to its calibrated range's 255 steps), and a row read one off.
        """
        return xp.range(length) + xp.cast(index, xp.int32)

    def _rotate_rounded(self, x, where, side, max_length, rows, training):
        """`_rotate` of one side as the int8 model computes it (`quantize`).

        The widened, signed cos and sin tables are rounded on their fixed
        range (the attention factor, times 1/sqrt(H) for the queries): a
        constant of the int8 model, of every cached position when the
        decoding step gives its integer `rows` (it gathers them: no float op
        on positions); the two products and their sum pass their learned
        ranges (`ROTARY_POINTS`).
        """
        limit = abs(self.rotary.attention_factor)
        if side == "query":
            limit = limit * self._query_scale
        if rows is not None:
            where = ops.position_range(max_length)[:, None]  # (S_max, 1)
        cos, sin = self.rotary.cos_sin(where, side)
        if side == "query":
            cos, sin = cos * self._query_scale, sin * self._query_scale
        tables = ops.rotary.rotation_tables(cos, sin, self.rotary.interleaved)
        if side == "key" and XPOS_POINT in self.rounding:  # xPos: scales >= 1
            bound = self.rounding[XPOS_POINT]
            bound(xp.reduce_max(xp.abs(xp.stack(tables)))[None], training=training)
            limit = bound.maximum  # the largest |entry| of the tables trained on
        tables = [quantization.fake_quant_symmetric(t, limit) for t in tables]
        if rows is not None:
            tables = [xp.gather(t, rows) for t in tables]
        cos, sin = (t[..., None, :] for t in tables)  # one table for every head
        r = rounder(self.rounding, training)
        return ops.rotary.rotate_widened(
            x,
            cos,
            sin,
            self.rotary.interleaved,
            lambda name, tensor: r(f"{side}_{name}", tensor),
        )

    def _length_dependent(self):
        """Whether the rotary type's frequencies read the current length."""
        return ops.rotary.ROPE_TYPES[self.rotary.rope_type].length_dependent

    def _scale_in_rotation(self):
        """Whether the rotation turns every feature (then it scales the queries)."""
        rotary = self.rotary
        return rotary is not None and rotary.rotary_width == self.key_dim
