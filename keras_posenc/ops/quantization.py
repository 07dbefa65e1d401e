"""Fake quantization where a full-int8 TFLite model rounds (pure functions).

TensorFlow's `fake_quant_with_min_max_*` ops round a float tensor to the
int8 grid of a range and back. In a graph they put the TFLite converter in
quantization-aware mode: each one becomes the scale and zero point of the
tensor it follows, so the int8 model rounds exactly where training did and
needs no representative dataset. Ranges are float32; the math runs in float32
and is cast back to the input's dtype.
"""

import tensorflow as tf

from keras_posenc._backend import xp

#: Bits of every quantized tensor (a kernel may take `KERNEL_BITS` instead).
NUM_BITS = 8
#: The widths a fully connected kernel may be rounded to: int8, or 4-bit
#: (int8 activations; `tflite_export` `mode="int4"` stores them as INT4).
KERNEL_BITS = (8, 4)


def check_kernel_bits(value, name="kernel_bits"):
    """`value` as an int of `KERNEL_BITS`, or the `ValueError` naming `name`."""
    if value not in KERNEL_BITS or isinstance(value, bool):
        raise ValueError(
            f"`{name}` must be one of {KERNEL_BITS}. Received: {name}={value!r}"
        )
    return int(value)


#: TFLite fixes the softmax output at scale 1/256, zero point -128.
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)
#: Ranges never collapse to zero width (an all-zero kernel still has a scale).
MIN_WEIGHT_RANGE = 1e-6


def fake_quant(x, minimum, maximum):
    """`x` rounded to the int8 grid of `[minimum, maximum]` (asymmetric).

    A range narrower than `MIN_WEIGHT_RANGE` (an unseen one is [0, 0]) is
    widened to it: a zero-width range divides by zero under XLA.
    """
    low = xp.cast(minimum, xp.float32)
    high = xp.maximum(xp.cast(maximum, xp.float32), low + MIN_WEIGHT_RANGE)
    rounded = tf.quantization.fake_quant_with_min_max_vars(
        xp.cast(x, xp.float32), low, high, num_bits=NUM_BITS
    )
    return xp.cast(rounded, x.dtype)


def fake_quant_weight(weight, bits=NUM_BITS):
    """A weight rounded symmetrically to [-127, 127] steps of `max |w| / 127`.

    Per tensor, as TFLite quantizes a fully connected kernel when its range
    comes from training; the range is read from the weight itself, so the
    converter folds it into the constant. `bits=4`: [-7, 7] steps of
    `max |w| / 7` (the converter then writes an int8 kernel of those 15
    values, which `tflite_export.int4` stores as INT4 unchanged).
    """
    w = xp.cast(weight, xp.float32)
    limit = xp.maximum(xp.reduce_max(xp.abs(w)), MIN_WEIGHT_RANGE)
    rounded = tf.quantization.fake_quant_with_min_max_vars(
        w, -limit, limit, num_bits=bits, narrow_range=True
    )
    return xp.cast(rounded, weight.dtype)


def fake_quant_symmetric(x, limit):
    """`x` rounded to the int8 grid of the range [-limit, limit].

    Narrow (steps -127 .. 127, zero point 0), for tables whose bound is known
    before training (cos and sin of a rotation: `limit` a number) or learned
    from them (xPos' key scales: `limit` a scalar tensor, widened to
    `MIN_WEIGHT_RANGE` while unseen). On a constant the converter folds it
    into the constant's int8 range.
    """
    if isinstance(limit, (int, float)):
        rounded = tf.quantization.fake_quant_with_min_max_args(
            xp.cast(x, xp.float32),
            -float(limit),
            float(limit),
            num_bits=NUM_BITS,
            narrow_range=True,
        )
    else:
        high = xp.maximum(xp.cast(limit, xp.float32), MIN_WEIGHT_RANGE)
        rounded = tf.quantization.fake_quant_with_min_max_vars(
            xp.cast(x, xp.float32), -high, high, num_bits=NUM_BITS, narrow_range=True
        )
    return xp.cast(rounded, x.dtype)


def fake_quant_constant(x):
    """A tensor computed from weights alone (a bias table), on its own range.

    The converter folds such a tensor into a constant; its own minimum and
    maximum (widened to hold 0) become the constant's int8 range.
    """
    values = xp.cast(x, xp.float32)
    low = xp.minimum(xp.reduce_min(values), 0.0)
    high = xp.maximum(xp.reduce_max(values), low + MIN_WEIGHT_RANGE)
    return fake_quant(x, low, high)


def fake_quant_probabilities(p):
    """Softmax output on TFLite's fixed grid: steps of 1/256 from 0."""
    rounded = tf.quantization.fake_quant_with_min_max_args(
        xp.cast(p, xp.float32), *SOFTMAX_RANGE, num_bits=NUM_BITS
    )
    return xp.cast(rounded, p.dtype)


def moving_range(minimum, maximum, x, first, momentum):
    """The range after seeing batch `x`: its own on the first batch, then an
    exponential moving average (`momentum` of the old, widened to hold 0)."""
    values = xp.cast(x, xp.float32)
    low = xp.minimum(xp.reduce_min(values), 0.0)
    high = xp.maximum(xp.reduce_max(values), 0.0)
    new_low = xp.where(first, low, momentum * minimum + (1.0 - momentum) * low)
    new_high = xp.where(first, high, momentum * maximum + (1.0 - momentum) * high)
    return new_low, new_high
