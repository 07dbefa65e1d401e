"""Fake quantization against NumPy oracles of TensorFlow's documented rounding."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_posenc.ops import quantization


def nudged_grid(low, high, qmin=0, qmax=255):
    """TensorFlow's nudged `(low, high, scale)`, written from its definition."""
    scale = (high - low) / (qmax - qmin)
    zero_from_min = qmin - low / scale
    zero = np.clip(np.floor(zero_from_min + 0.5), qmin, qmax)
    return (qmin - zero) * scale, (qmax - zero) * scale, scale


def fake_quant_oracle(x, low, high, qmin=0, qmax=255):
    """TensorFlow's nudged fake quantization, written from its definition."""
    nudged_low, nudged_high, scale = nudged_grid(low, high, qmin, qmax)
    clamped = np.clip(x, nudged_low, nudged_high)
    return np.floor((clamped - nudged_low) / scale + 0.5) * scale + nudged_low


@settings(max_examples=20, deadline=None)
@given(
    low=st.floats(-8.0, -0.01),
    high=st.floats(0.01, 8.0),
    seed=st.integers(0, 1000),
)
def test_fake_quant_rounds_to_the_nudged_grid(low, high, seed):
    x = np.random.default_rng(seed).uniform(2 * low, 2 * high, 64).astype("float32")
    got = quantization.fake_quant(tf.constant(x), low, high).numpy()
    low, high = np.float32(low), np.float32(high)
    want = fake_quant_oracle(x.astype(np.float64), low, high)
    # TensorFlow rounds in float32: where the float64 value sits within a
    # hair of a half step, the two may round to neighbouring steps.
    nudged_low, nudged_high, scale = nudged_grid(float(low), float(high))
    unrounded = (np.clip(x, nudged_low, nudged_high) - nudged_low) / scale
    tie = np.abs(unrounded - np.floor(unrounded) - 0.5) < 1e-4
    close = np.abs(got - want) <= 1e-5 * (high - low)
    neighbour = tie & (np.abs(got - want) <= scale * (1 + 1e-3))
    assert np.all(close | neighbour), (x, got, want)


def test_a_weight_rounds_symmetrically_to_127_steps_of_its_largest_value():
    w = np.random.default_rng(0).normal(size=(6, 5)).astype("float32")
    got = quantization.fake_quant_weight(tf.constant(w)).numpy()
    step = np.abs(w).max() / 127
    levels = got / step
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
    assert np.abs(levels).max() == pytest.approx(127, abs=1e-3)
    np.testing.assert_allclose(got, np.round(w / step) * step, atol=1e-5)


def test_probabilities_lie_on_tflites_softmax_grid():
    p = tf.nn.softmax(tf.random.normal((4, 9))).numpy()
    got = quantization.fake_quant_probabilities(tf.constant(p)).numpy()
    np.testing.assert_allclose(got * 256, np.round(got * 256), atol=1e-4)
    np.testing.assert_allclose(got, np.round(p * 256) / 256, atol=1e-6)
    assert got.max() <= 255 / 256


def test_a_constant_keeps_its_range_widened_to_zero():
    x = tf.constant([0.5, 1.5, 2.0])  # all positive: the range starts at 0
    got = quantization.fake_quant_constant(x).numpy()
    np.testing.assert_allclose(got, fake_quant_oracle(x.numpy(), 0.0, 2.0), atol=1e-6)


def test_the_range_starts_from_the_first_batch_then_moves_slowly():
    first = quantization.moving_range(0.0, 0.0, tf.constant([1.0, 3.0]), True, 0.9)
    assert [float(v) for v in first] == [0.0, 3.0]  # widened to hold 0
    second = quantization.moving_range(0.0, 3.0, tf.constant([-2.0, 1.0]), False, 0.9)
    np.testing.assert_allclose([float(v) for v in second], [-0.2, 0.9 * 3.0 + 0.1])


def test_a_fixed_symmetric_range_rounds_to_127_steps_of_the_limit():
    x = np.linspace(-0.7, 0.7, 29).astype("float32")  # past the limit: clamped
    got = quantization.fake_quant_symmetric(tf.constant(x), 0.5).numpy()
    step = 0.5 / 127
    levels = np.clip(np.floor(x / step + 0.5), -127, 127)  # halves round up
    np.testing.assert_allclose(got, levels * step, atol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_rounds_its_two_products_and_their_sum(interleaved):
    """`x cos' + swap(x) sin'` with each of the three tensors rounded."""
    from keras_posenc.ops import rotary

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    angles = rng.uniform(0, 6, (3, 2)).astype("float32")
    cos, sin = rotary.rotation_tables(tf.cos(angles), tf.sin(angles), interleaved)
    seen = []

    def rounding(name, tensor):
        seen.append(name)
        return tf.round(tensor * 10) / 10

    got = rotary.rotate_widened(x, cos, sin, interleaved, rounding).numpy()
    # The oracle: pairs (i, i + 2) rotate-half, (2i, 2i + 1) interleaved.
    pairs = [(0, 1), (2, 3)] if interleaved else [(0, 2), (1, 3)]
    c, s = np.cos(angles), np.sin(angles)
    a, b = np.zeros_like(x), np.zeros_like(x)
    for k, (i, j) in enumerate(pairs):
        a[..., i], a[..., j] = x[..., i] * c[:, k], x[..., j] * c[:, k]
        b[..., i], b[..., j] = -x[..., j] * s[:, k], x[..., i] * s[:, k]
    tenth = lambda v: np.round(v * 10) / 10  # noqa: E731
    np.testing.assert_allclose(got, tenth(tenth(a) + tenth(b)), atol=1e-6)
    assert seen == ["cos", "sin", "rotated"]
    unrounded = rotary.rotate_widened(x, cos, sin, interleaved).numpy()
    np.testing.assert_allclose(unrounded, a + b, atol=1e-6)
