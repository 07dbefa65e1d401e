"""Packed rows for `RelativeMultiHeadAttention` (`segment_ids=`, a mixin).

A packed row holds several documents as runs of segment ids
(`ops.segments`): attention stays inside a run, and the bias and the
rotation read positions that restart at 0 in each run, so every document
gets the attention it gets alone.
"""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc.layers.segment_positions import check_segment_ids


class PackedAttention:
    """The `segment_ids` path of `RelativeMultiHeadAttention` (a mixin).

    It reads the layer's `position_bias`, `rotary` and `_length_dependent`.
    """

    def _segments(self, segment_ids, query, key, call_arguments):
        """`(runs, positions)` int32 `(B, T)` of checked `segment_ids`, or None."""
        if segment_ids is None:
            return None
        segment_ids = xp.convert_to_tensor(segment_ids)
        check_segment_ids(segment_ids)
        for name in ("cache", "positions", "key_positions"):
            if call_arguments[name] is not None:
                _checks.fail(
                    name,
                    "None with `segment_ids` (the segments give every position; "
                    "decoding runs one document per row)",
                    f"a {name}",
                )
        t, s, length = query.shape[1], key.shape[1], segment_ids.shape[1]
        if any(n is not None and length is not None and n != length for n in (t, s)):
            _checks.fail(
                "segment_ids",
                "the length of the query and the key (self-attention over one "
                "packed row)",
                f"shape {segment_ids.shape} for query {query.shape}, key {key.shape}",
            )
        if self.rotary is not None and self._length_dependent():
            _checks.fail(
                "segment_ids",
                "None with a rotary type whose frequencies read the current "
                "length (each document of a packed row has its own)",
                "a segment_ids tensor",
                fix=f"Received rope_type={self.rotary.rope_type!r}",
            )
        return ops.segments.runs(segment_ids), ops.segments.positions(segment_ids)

    def _bias_where(self, where, segments):
        """The position arguments of the bias producer under `segments`.

        A producer that reads `j - i` alone gets the row's positions (equal
        distances inside a run, and a `(1, N, T, S)` bias); any other gets
        the in-run positions `(B, T)`.
        """
        invariant = getattr(self.position_bias, "translation_invariant", False)
        if segments is None or invariant:
            return where
        _, positions = segments
        return dict(where, positions=positions, key_positions=positions)


def segment_mask(segments, attention_mask=None):
    """`attention_mask` (boolean `(B, T, S)` or None) and-ed with the same-run mask."""
    if segments is None:
        return attention_mask
    runs, _ = segments
    same = ops.segments.same_run(runs, runs)  # (B, T, T)
    if attention_mask is None:
        return same
    return xp.logical_and(xp.cast(attention_mask, xp.bool), same)
