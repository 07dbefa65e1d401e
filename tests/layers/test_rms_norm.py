import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import RMSNorm


def _oracle(x, scale, epsilon=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + epsilon) * scale


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: RMSNorm(epsilon=1e-5, **kw),
        x,
        tmp_path,
        num_weights=1,
        expected_output_shape=(3, 4, 6),
    )


@pytest.mark.parametrize("unit_offset", [False, True])
def test_equals_the_rms_formula_with_its_scale(unit_offset):
    x = np.random.normal(2.0, 3.0, size=(2, 5, 7)).astype("float32")
    layer = RMSNorm(unit_offset=unit_offset)
    layer.build(x.shape)
    w = np.random.normal(size=(7,)).astype("float32")
    layer.scale.assign(w)
    want = _oracle(x, 1.0 + w if unit_offset else w)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_fresh_layer_is_the_plain_normalization_either_way():
    x = np.random.normal(size=(2, 3, 4, 8)).astype("float32")  # (B, T, N, H) heads
    for unit_offset in (False, True):
        got = RMSNorm(unit_offset=unit_offset)(x).numpy()
        np.testing.assert_allclose(got, _oracle(x, 1.0), rtol=1e-5, atol=1e-6)


def test_mixed_float16_does_not_overflow_on_large_inputs():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    x = (1e4 * np.random.normal(size=(2, 3, 8))).astype("float32")
    ours = RMSNorm()(x)
    assert ours.dtype == tf.float16
    np.testing.assert_allclose(
        ours.numpy().astype("float64"), _oracle(x.astype("float64"), 1.0), atol=3e-3
    )


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`epsilon` must be a finite number > 0"):
        RMSNorm(epsilon=-1.0)
    with pytest.raises(TypeError, match="`unit_offset` must be a bool"):
        RMSNorm(unit_offset="yes")
