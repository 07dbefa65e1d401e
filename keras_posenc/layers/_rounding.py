"""Named int8 rounding points inside a layer (quantization-aware training)."""

from keras_posenc.layers.activation_range import ActivationRange


def rounding_points(layer, names, enabled):
    """`{name: ActivationRange}` for each tensor the int8 model rounds, or {}."""
    if not enabled:
        return {}
    return {
        name: ActivationRange(name=name, dtype=layer.dtype_policy) for name in names
    }


def rounder(points, training):
    """`round(name, x)`: `x` through its rounding point (identity without one)."""

    def round_(name, x):
        return points[name](x, training=training) if points else x

    return round_
