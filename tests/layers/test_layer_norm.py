import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import LayerNorm


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: LayerNorm(epsilon=1e-3, **kw),
        x,
        tmp_path,
        num_weights=2,
        expected_output_shape=(3, 4, 6),
    )


def test_equals_the_layer_norm_formula():
    x = np.random.normal(3.0, 2.0, size=(2, 5, 7)).astype("float32")
    mean = x.mean(-1, keepdims=True)
    want = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(LayerNorm()(x).numpy(), want, atol=1e-5)


def test_equals_keras_layer_normalization():
    x = np.random.normal(size=(2, 5, 7)).astype("float32")
    keras_ln = tf.keras.layers.LayerNormalization(epsilon=1e-5)
    np.testing.assert_allclose(LayerNorm()(x).numpy(), keras_ln(x).numpy(), atol=1e-5)


def test_rejects_bad_epsilon():
    with pytest.raises(ValueError, match="`epsilon` must be a finite number > 0"):
        LayerNorm(epsilon=0.0)


def test_mixed_float16_does_not_overflow_on_large_inputs():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    x = (1e6 * np.random.normal(size=(2, 3, 8))).astype("float32")
    ours = LayerNorm()(x)  # Keras 3's LayerNormalization is finite here too
    assert ours.dtype == tf.float16
    centered = x.astype("float64") - x.mean(-1, keepdims=True)
    want = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ours.numpy().astype("float64"), want, atol=3e-3)


@pytest.mark.slow
def test_quantized_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: LayerNorm(quantize=True, **kw),
        x,
        tmp_path,
        num_weights=2 + 3 * 9,  # gamma, beta; 9 rounding points of 3 weights
        expected_output_shape=(3, 4, 6),
    )


def test_quantized_output_is_the_formula_on_int8_levels():
    x = np.random.default_rng(1).normal(2.0, 3.0, size=(8, 5, 16)).astype("float32")
    layer = LayerNorm(quantize=True)
    got = layer(x, training=True).numpy()  # every range from this batch
    want = LayerNorm()(x).numpy()
    span = float(layer.rounding["output"].maximum - layer.rounding["output"].minimum)
    assert np.abs(got - want).max() < 6 * span / 255  # a few int8 steps
    assert len(np.unique(got)) <= 256


def test_rejects_a_quantize_that_is_not_a_bool():
    with pytest.raises(TypeError, match="`quantize` must be"):
        LayerNorm(quantize="yes")


def test_a_quantized_norm_of_a_constant_token_saturates_instead_of_nan():
    """A variance that rounds to 0 gives RSQRT's largest value, as int8 does."""
    x = np.random.default_rng(4).normal(size=(2, 3, 8)).astype("float32")
    x[0, 1] = 0.5  # a constant token: zero variance
    layer = LayerNorm(quantize=True)
    out = layer(x, training=True).numpy()
    assert np.isfinite(out).all()
    ranges = [w.numpy() for w in layer.weights if "imum" in w.name]
    assert ranges and np.isfinite(ranges).all()
    np.testing.assert_allclose(out[0, 1], out[0, 1].mean(), atol=1e-6)  # = beta
