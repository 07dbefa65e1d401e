"""Models of packed rows: `{"token_ids", "segment_ids"}` whose ids stay integers.

A functional model casts each input to its `keras.Input`'s dtype before
its layers run, so float segment ids (1.6 and 1.2) would be truncated to
the same document (1) and merge two documents without a word. These models
refuse them first.
"""

import numpy as np

from keras_posenc import _checks
from keras_posenc._compat import dtype_name, keras, register


def check_segment_ids(inputs):
    """A `ValueError` if `inputs["segment_ids"]` holds non-integer values.

    Read from the dtype, before any work (a symbolic tensor's too).
    """
    if not isinstance(inputs, dict) or "segment_ids" not in inputs:
        return
    segments = inputs["segment_ids"]
    dtype = getattr(segments, "dtype", None)
    if dtype is None:
        dtype = np.asarray(segments).dtype
    if not dtype_name(dtype).startswith(("int", "uint")):
        _checks.fail(
            "segment_ids",
            "integer document ids (the model would truncate floats, and 1.6 "
            "and 1.2 would become one document)",
            f"dtype {dtype_name(dtype)}",
            fix="Pass them as int32, e.g. segment_ids.astype('int32')",
        )


class SegmentIdsCheck:
    """A functional model's `call` that first refuses float segment ids."""

    def call(self, inputs, training=None, mask=None):
        check_segment_ids(inputs)
        return super().call(inputs, training=training, mask=mask)


@register
class PackedModel(SegmentIdsCheck, keras.Model):
    """A functional `keras.Model` of packed rows that refuses float segment ids.

    What `build_encoder(packed=True)` and the classifiers built on it return:
    called, fitted and saved as any functional model, with inputs
    `{"token_ids": (B, T), "segment_ids": (B, T)}`; float `segment_ids`
    raise a `ValueError` instead of being truncated.

    Example:
    >>> import numpy as np
    >>> from keras_posenc import models
    >>> model = models.build_encoder(vocab_size=9, hidden_dim=8, num_layers=1,
    ...                              num_heads=2, packed=True)
    >>> type(model).__name__
    'PackedModel'
    >>> rows = {"token_ids": np.ones((1, 4), "int32"),
    ...         "segment_ids": np.array([[1, 1, 2, 2]], "int32")}
    >>> model(rows).shape
    TensorShape([1, 4, 8])
    """
