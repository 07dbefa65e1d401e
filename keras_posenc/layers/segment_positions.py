"""Positions that restart at 0 in each document of a packed row."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import dtype_name, is_integer, keras, rank, register


@register
class SegmentPositions(keras.layers.Layer):
    """int32 positions `(B, T)` inside each run of segment ids (packed rows).

    A packed row holds several documents as contiguous runs of one id (0 is
    padding; a new run starts wherever the id changes,
    `keras_posenc.ops.segments`). Each token's position is its distance to
    the first token of its run, so an absolute encoding read at these
    positions (`SinusoidalPositionEncoding(positions=...)`,
    `LearnedPositionEmbedding(positions=...)`) gives every document the
    positions it has alone.

    Call arguments:
        segment_ids: int tensor `(B, T)`.

    Returns:
        An int32 tensor `(B, T)`.

    Example:

    >>> import numpy as np
    >>> import keras_posenc
    >>> ids = np.array([[1, 1, 1, 2, 2, 0]])
    >>> keras_posenc.SegmentPositions()(ids).numpy()
    array([[0, 1, 2, 0, 1, 0]], dtype=int32)

    References:
        - [Krell et al., 2021 (packing without cross-contamination)](https://arxiv.org/abs/2107.02027)
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)

    def call(self, segment_ids):
        segment_ids = xp.convert_to_tensor(segment_ids)
        check_segment_ids(segment_ids)
        return ops.segments.positions(segment_ids)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_mask(self, inputs, mask=None):
        return None


def check_segment_ids(segment_ids):
    """`TypeError`/`ValueError` unless `segment_ids` is an integer `(B, T)` tensor."""
    if not is_integer(segment_ids):
        _checks.fail(
            "segment_ids",
            "an integer tensor (B, T)",
            f"dtype {dtype_name(segment_ids.dtype)}",
            error=TypeError,
        )
    if rank(segment_ids) != 2:
        _checks.fail("segment_ids", "of shape (B, T)", f"shape {segment_ids.shape}")
