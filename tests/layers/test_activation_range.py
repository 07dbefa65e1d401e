import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import ActivationRange


@pytest.mark.slow
def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: ActivationRange(momentum=0.9, **kw),
        x,
        tmp_path,
        num_weights=3,
        expected_output_shape=(3, 4, 6),
    )


def test_training_learns_the_range_and_inference_keeps_it():
    layer = ActivationRange(momentum=0.5)
    assert float(tf.reduce_max(tf.abs(layer(tf.constant([2.0]))))) < 1e-5  # unseen
    layer(tf.constant([-1.0, 3.0]), training=True)
    assert (float(layer.minimum), float(layer.maximum)) == (-1.0, 3.0)
    layer(tf.constant([-3.0, 1.0]), training=True)
    assert (float(layer.minimum), float(layer.maximum)) == (-2.0, 2.0)
    before = [float(layer.minimum), float(layer.maximum), float(layer.batches)]
    out = layer(tf.constant([5.0, 0.4]))  # inference: clipped to the range
    assert [float(layer.minimum), float(layer.maximum), float(layer.batches)] == before
    step = 4.0 / 255
    assert float(out[0]) == pytest.approx(2.0, abs=step)
    assert float(out[1]) / step == pytest.approx(round(float(out[1]) / step), abs=1e-3)


def test_fit_updates_the_range():
    inputs = tf.keras.Input((3,))
    rounding = ActivationRange()
    model = tf.keras.Model(inputs, rounding(tf.keras.layers.Dense(3)(inputs)))
    model.compile("sgd", "mse")
    model.fit(np.ones((8, 3)), np.zeros((8, 3)), verbose=0)
    assert float(rounding.batches) == 1.0
    assert float(rounding.maximum) - float(rounding.minimum) > 0.0


@pytest.mark.parametrize("momentum", [1.0, -0.1])
def test_rejects_a_momentum_outside_0_1(momentum):
    with pytest.raises(ValueError, match=r"`momentum` must be a number in \[0, 1\)"):
        ActivationRange(momentum=momentum)
