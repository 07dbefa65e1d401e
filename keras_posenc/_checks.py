"""Argument validation with one message form (see docs/style.md)."""

import numbers


def _fail(name, expectation, value, fix=None, error=ValueError):
    message = f"`{name}` must be {expectation}. Received: {name}={value!r}"
    if fix:
        message += f". {fix}"
    raise error(message)


def positive_int(name, value, allow_none=False, minimum=1):
    """Checks that `value` is an integer >= `minimum` (or None if allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expectation = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        _fail(name, expectation, value, error=TypeError)
    if value < minimum:
        _fail(name, f"an integer >= {minimum}", value)
    return int(value)


def positive_float(name, value):
    """Checks that `value` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(name, "a number > 0", value, error=TypeError)
    if not value > 0 or value == float("inf"):
        _fail(name, "a finite number > 0", value)
    return float(value)


def rate(name, value):
    """Checks that `value` is a probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(name, "a number in [0, 1)", value, error=TypeError)
    if not 0.0 <= value < 1.0:
        _fail(name, "a number in [0, 1)", value)
    return float(value)


def boolean(name, value):
    """Checks that `value` is a bool."""
    if not isinstance(value, bool):
        _fail(name, "a bool", value, error=TypeError)
    return value


def choice(name, value, allowed):
    """Checks that `value` is one of the strings in `allowed`."""
    if value not in allowed:
        _fail(name, f"one of {allowed}", value)
    return value


def grid_shape(value, coordinate_dim):
    """A grid shape: None, or `coordinate_dim` positive integers."""
    if value is None:
        return None
    value = tuple(positive_int("grid_shape", size) for size in value)
    if len(value) != coordinate_dim:
        _fail("grid_shape", f"of length coordinate_dim={coordinate_dim}", value)
    return value


def fail(name, expectation, value, fix=None, error=ValueError):
    """Raises the standard message for an argument that fails a custom check."""
    _fail(name, expectation, value, fix=fix, error=error)


def known_width(shape, name="input"):
    """The last axis of `shape`, which must be known to build weights."""
    width = shape[-1]
    if width is None:
        raise ValueError(
            f"The last axis of the {name} must be known. Received: shape={shape}"
        )
    return width


def rounds_on_tensorflow(name, value):
    """`value` (a `quantize` option, or a rounding layer's name), refused
    when it asks for rounding on JAX or PyTorch.

    The package's quantization-aware training rounds with TensorFlow's
    fake-quant kernels, whose ranges the TFLite converter reads as int8
    scales: a JAX or PyTorch model cannot hold them.
    """
    from keras_posenc._backend import BACKEND, IS_TENSORFLOW

    if value and not IS_TENSORFLOW:
        _fail(
            name,
            f"False on the {BACKEND} backend (quantization-aware training rounds "
            "with TensorFlow's fake-quant kernels, which the TFLite converter "
            "reads as int8 ranges)",
            value,
            fix="Train it with KERAS_BACKEND=tensorflow, or train in float here "
            "and export the .keras file with tflite_export (int8 calibration)",
        )
    return value


def rounding_layer(layer):
    """Refuses a rounding layer (`ActivationRange`, `QuantizedDense`...) off
    TensorFlow, for the reason `rounds_on_tensorflow` gives."""
    from keras_posenc._backend import BACKEND, IS_TENSORFLOW

    if not IS_TENSORFLOW:
        raise ValueError(
            f"`{type(layer).__name__}` needs KERAS_BACKEND=tensorflow: it rounds "
            "with TensorFlow's fake-quant kernels, which the TFLite converter "
            f"reads as int8 ranges. Received: the {BACKEND} backend"
        )
