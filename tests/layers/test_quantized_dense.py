import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import QuantizedDense, RelativeMultiHeadAttention


@pytest.mark.slow
def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: QuantizedDense(5, activation="relu", **kw),
        x,
        tmp_path,
        num_weights=5,
        expected_output_shape=(3, 4, 5),
    )


def dense_oracle(layer, x, levels=127):
    """NumPy: a kernel rounded per tensor, the output on the batch's own range."""
    kernel, bias = (w.numpy() for w in (layer.kernel, layer.bias))
    step = np.abs(kernel).max() / levels
    y = x @ (np.round(kernel / step) * step) + bias
    low, high = min(y.min(), 0.0), max(y.max(), 0.0)
    scale = (high - low) / 255
    zero = np.round(-low / scale)
    return (np.round(y / scale + zero) - zero) * scale


def test_equals_dense_with_a_rounded_kernel_and_output():
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    layer = QuantizedDense(3)
    got = layer(x, training=True).numpy()  # the range is this batch's own
    np.testing.assert_allclose(got, dense_oracle(layer, x), atol=1e-5)


def test_rejects_a_bad_momentum():
    with pytest.raises(ValueError, match="`momentum` must be a number"):
        QuantizedDense(3, momentum=2.0)


def test_takes_dense_arguments_and_keeps_them_in_its_config():
    layer = QuantizedDense(3, use_bias=False, momentum=0.5)
    config = layer.get_config()
    assert (config["units"], config["use_bias"], config["momentum"]) == (3, False, 0.5)
    assert isinstance(layer, tf.keras.layers.Dense)


def test_quantize_inputs_rounds_the_input_on_its_own_range():
    x = np.random.default_rng(1).uniform(0.0, 16.0, size=(5, 4)).astype("float32")
    layer = QuantizedDense(3, quantize_inputs=True)
    got = layer(x, training=True).numpy()
    scale = (x.max() - 0.0) / 255  # the first batch's range, widened to hold 0
    rounded = np.round(x / scale) * scale
    np.testing.assert_allclose(got, dense_oracle(layer, rounded), atol=1e-5)
    assert float(layer.input_range.maximum) == pytest.approx(x.max())
    assert QuantizedDense.from_config(layer.get_config()).quantize_inputs


def test_rejects_a_quantize_inputs_that_is_not_a_bool():
    with pytest.raises(TypeError, match="`quantize_inputs` must be a bool"):
        QuantizedDense(3, quantize_inputs="yes")


def test_4_bit_kernels_round_to_seven_steps_a_side_and_keep_their_width():
    x = np.random.default_rng(2).normal(size=(4, 6)).astype("float32")
    layer = QuantizedDense(3, kernel_bits=4)
    got = layer(x, training=True).numpy()
    np.testing.assert_allclose(got, dense_oracle(layer, x, levels=7), atol=1e-5)
    assert QuantizedDense.from_config(layer.get_config()).kernel_bits == 4
    assert QuantizedDense(3).kernel_bits == 8  # an argument, nothing implicit


@pytest.mark.parametrize("bits", [2, 16, True, "4"])
def test_rejects_a_kernel_width_other_than_8_or_4(bits):
    with pytest.raises(ValueError, match="`kernel_bits` must be one of .8, 4."):
        QuantizedDense(3, kernel_bits=bits)
    with pytest.raises(ValueError, match="`kernel_bits` must be one of .8, 4."):
        RelativeMultiHeadAttention(2, 4, quantize=True, kernel_bits=bits)


def test_kernel_bits_reach_every_kernel_of_an_int4_lm_as_arguments():
    """`CausalLM(quantize="int4")` passes 4 down by argument: every
    QuantizedDense of its attention, feed-forward, generator and head."""
    from keras_posenc.models import build_causal_lm
    from keras_posenc.utils import nested_layers

    for position in ("hybrid", "recursive"):
        model = build_causal_lm(
            11,
            hidden_dim=8,
            num_layers=2,
            num_heads=2,
            position=position,
            quantize="int4",
        )
        dense = [d for d in nested_layers(model) if isinstance(d, QuantizedDense)]
        assert len(dense) > 6 and {d.kernel_bits for d in dense} == {4}, position
