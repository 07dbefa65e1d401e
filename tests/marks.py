"""Parameter lists: which values run in `make check`, and in the Keras 2 pass."""

import pytest
from layer_checks import PRODUCER_KINDS

from keras_posenc import IS_KERAS_3


def per_kind_in_keras2(values, keep=()):
    """`values` in the Keras 3 pass; in the Keras 2 pass only one builder
    method per kind of position producer (`PRODUCER_KINDS`) and `keep`.

    For model-level contracts run once per method (fit, save, cache, pad):
    each layer's own contract (round trip, masking, mixed precision) runs in
    both passes in `tests/layers`, so the Keras 2 pass needs one model per
    kind of producer to meet every layer in a model.
    """
    if IS_KERAS_3:
        return list(values)
    return [value for value in values if value in PRODUCER_KINDS or value in keep]


def split_between_passes(values, keras2):
    """Per-method TFLite checks: the Keras 2 pass runs `keras2`, the Keras 3
    pass the other `values`.

    The TFLite graph is built from the same TensorFlow ops in both modes, so
    the two passes together convert every value once and each pass converts
    through its own Keras (`keras2` holds one method per kind of producer).
    """
    unknown = set(keras2) - set(values)
    if unknown:
        raise ValueError(
            f"`keras2` must be among `values`. Received: {sorted(unknown)}"
        )
    return [value for value in values if (value in keras2) != IS_KERAS_3]


def fast_only(values, fast, per_kind=False):
    """`values` as pytest parameters, those not in `fast` marked slow.

    `make check` then runs one value of each kind (`fast`), and `make test`
    runs them all (with `per_kind`: in the Keras 2 pass, those of
    `per_kind_in_keras2`). A value may be a tuple of parameters: its first
    one (a builder method) is what `fast` and `per_kind` read.
    """

    def first(value):
        return value[0] if isinstance(value, tuple) else value

    unknown = set(fast) - {first(value) for value in values}
    if unknown:
        raise ValueError(f"`fast` must be among `values`. Received: {sorted(unknown)}")
    if per_kind:
        kept = set(per_kind_in_keras2([first(value) for value in values], keep=fast))
        values = [value for value in values if first(value) in kept]
    return [
        value
        if first(value) in fast
        else pytest.param(
            *(value if isinstance(value, tuple) else (value,)), marks=pytest.mark.slow
        )
        for value in values
    ]


def kinds_fast(values, per_kind=False):
    """`fast_only` with the methods of `values` that are `PRODUCER_KINDS` fast."""
    return fast_only(
        values, [kind for kind in PRODUCER_KINDS if kind in values], per_kind
    )
