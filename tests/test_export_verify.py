import numpy as np
import pytest

import tflite_export

INT8 = {"dtype": np.int8, "quantization": (0.5, -3)}
FLOAT = {"dtype": np.float32, "quantization": (0.0, 0)}


def test_quantize_is_round_of_value_over_scale_plus_zero_point():
    values = np.array([-70.0, -1.3, 0.0, 0.26, 2.0, 70.0], np.float32)
    got = tflite_export.quantize(values, INT8)
    want = np.clip(np.round(values / 0.5 - 3), -128, 127).astype(np.int8)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def test_dequantize_inverts_quantize_within_half_a_step():
    values = np.linspace(-60, 60, 41).astype(np.float32)
    back = tflite_export.dequantize(tflite_export.quantize(values, INT8), INT8)
    np.testing.assert_allclose(back, values, atol=0.25 + 1e-6)


@pytest.mark.parametrize("function", [tflite_export.quantize, tflite_export.dequantize])
def test_float_tensors_pass_through(function):
    values = np.array([1.5, -2.25], np.float32)
    np.testing.assert_array_equal(function(values, FLOAT), values)
