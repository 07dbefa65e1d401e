"""Test shorthand for the builders' options.

A test helper may take `max_length=`, `grid_shape=` and `share_position_bias=`
as keywords; `builder_kwargs` moves them into `position_options`, the
builders' one form of them, before the builder sees them.
"""

from keras_posenc.models.options import POSITION_KEYS


def builder_kwargs(**kwargs):
    """`kwargs` with the `POSITION_KEYS` moved into `position_options`."""
    position = dict(kwargs.pop("position_options", None) or {})
    for key in POSITION_KEYS:
        if key in kwargs:
            position[key] = kwargs.pop(key)
    if position:
        kwargs["position_options"] = position
    return kwargs
