import math

import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import FeedForward


def _np_activation(name, x):
    erf = np.vectorize(math.erf)
    return {
        "relu": lambda v: np.maximum(v, 0.0),
        "silu": lambda v: v / (1.0 + np.exp(-v)),
        "gelu": lambda v: 0.5 * v * (1.0 + erf(v / np.sqrt(2.0))),
        "gelu_tanh": lambda v: (
            0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))
        ),
    }[name](x)


@pytest.mark.parametrize("gated", [False, True])
def test_layer_checks(tmp_path, gated):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: FeedForward(10, activation="silu", gated=gated, **kw),
        x,
        tmp_path,
        num_weights=6 if gated else 4,
        expected_output_shape=(3, 4, 6),
    )


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("gated", [False, True])
def test_equals_the_numpy_block(activation, gated):
    x = np.random.normal(size=(2, 5, 6)).astype("float32")
    layer = FeedForward(9, output_dim=4, activation=activation, gated=gated)
    got = layer(x).numpy()
    up = x @ layer.up_dense.kernel.numpy() + layer.up_dense.bias.numpy()
    if gated:
        gate = x @ layer.gate_dense.kernel.numpy() + layer.gate_dense.bias.numpy()
        hidden = _np_activation(activation, gate) * up
    else:
        hidden = _np_activation(activation, up)
    want = hidden @ layer.down_dense.kernel.numpy() + layer.down_dense.bias.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gelu_forms_are_tensorflows():
    x = tf.constant(np.linspace(-6, 6, 101), tf.float32)
    from keras_posenc.ops import activations

    np.testing.assert_allclose(activations.gelu(x), tf.nn.gelu(x), atol=1e-6)
    np.testing.assert_allclose(
        activations.gelu_tanh(x), tf.nn.gelu(x, approximate=True), atol=1e-6
    )


def test_without_bias_it_has_kernels_only():
    layer = FeedForward(8, gated=True, use_bias=False)
    layer(np.ones((1, 2, 4), "float32"))
    names = [w.name.split("/")[-1].split(":")[0] for w in layer.weights]
    assert names == ["kernel"] * 3


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`activation` must be one of"):
        FeedForward(8, activation="mish")
    with pytest.raises(ValueError, match="`intermediate_dim` must be"):
        FeedForward(0)
    with pytest.raises(TypeError, match="`gated` must be a bool"):
        FeedForward(8, gated=1)
