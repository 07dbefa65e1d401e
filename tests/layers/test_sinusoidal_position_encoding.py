import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer
from oracles import sinusoid_oracle

from keras_posenc import SinusoidalPositionEncoding


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 6, 10)).astype("float32")
    check_layer(
        lambda **kw: SinusoidalPositionEncoding(max_wavelength=500.0, **kw),
        x,
        tmp_path,
        num_weights=0,
        expected_output_shape=(3, 6, 10),
        fit=False,
    )


def test_output_is_the_formula_for_every_batch_row():
    out = SinusoidalPositionEncoding()(tf.zeros((2, 5, 8))).numpy()
    want = sinusoid_oracle(np.arange(5.0), 8, 10000.0)
    np.testing.assert_allclose(out[0], want, atol=1e-5)
    np.testing.assert_allclose(out[1], want, atol=1e-5)


def test_explicit_positions_equal_start_index():
    layer = SinusoidalPositionEncoding()
    x = tf.zeros((2, 4, 8))
    shifted = layer(x, start_index=7).numpy()
    explicit = layer(x, positions=tf.range(7, 11)).numpy()
    np.testing.assert_allclose(shifted, explicit, atol=1e-6)


def test_per_example_positions_left_padding():
    layer = SinusoidalPositionEncoding()
    positions = np.array([[0, 1, 2, 3], [0, 0, 0, 1]])
    out = layer(tf.zeros((2, 4, 6)), positions=positions).numpy()
    np.testing.assert_allclose(out[1, 3], sinusoid_oracle([1.0], 6, 1e4)[0], atol=1e-6)


def test_large_positions_stay_finite_in_float16():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    out = SinusoidalPositionEncoding()(tf.zeros((1, 4, 8)), start_index=70000)
    assert out.dtype == tf.float16
    assert np.all(np.isfinite(out.numpy().astype("float32")))


@pytest.mark.parametrize(
    "value,error", [(0, ValueError), (-1.0, ValueError), ("10", TypeError)]
)
def test_rejects_bad_max_wavelength(value, error):
    with pytest.raises(error, match="`max_wavelength` must be"):
        SinusoidalPositionEncoding(max_wavelength=value)


def test_rejects_unknown_width():
    layer = SinusoidalPositionEncoding()
    traced = tf.function(lambda x: layer.call(x))
    with pytest.raises(ValueError, match="last axis of the input must be known"):
        traced.get_concrete_function(tf.TensorSpec((None, None, None)))


def test_rejects_positions_of_rank_3():
    with pytest.raises(ValueError, match="`positions` must have shape"):
        SinusoidalPositionEncoding()(tf.zeros((1, 2, 4)), positions=tf.zeros((1, 2, 1)))


def test_quantized_encoding_lies_on_the_int8_grid_of_minus_one_to_one():
    x = np.zeros((1, 6, 8), "float32")
    got = SinusoidalPositionEncoding(quantize=True)(x, start_index=3).numpy()
    want = SinusoidalPositionEncoding()(x, start_index=3).numpy()
    scale = 2.0 / 255
    zero = np.round(1.0 / scale)  # -1 is grid point 0
    np.testing.assert_allclose(
        got, (np.round(want / scale + zero) - zero) * scale, atol=1e-6
    )
    assert np.abs(got - want).max() > 0
