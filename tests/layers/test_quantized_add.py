import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import QuantizedAdd

keras = tf.keras


@pytest.mark.slow
def test_fits_saves_and_compiles_with_xla(tmp_path):
    a = np.random.normal(size=(3, 4, 6)).astype("float32")
    left, right = keras.Input((4, 6)), keras.Input((4, 6))
    model = keras.Model([left, right], QuantizedAdd(momentum=0.9)([left, right]))
    model.compile("sgd", "mse")
    model.fit([a, a], np.zeros_like(a), epochs=1, verbose=0)
    want = model([a, a]).numpy()
    assert np.abs(want).max() > 0  # the range was learned
    xla = tf.function(lambda x, y: model([x, y]), jit_compile=True)
    np.testing.assert_allclose(xla(a, a).numpy(), want, atol=1e-5)
    model.save(tmp_path / "add.keras")
    loaded = keras.models.load_model(tmp_path / "add.keras")
    np.testing.assert_allclose(loaded([a, a]).numpy(), want, atol=1e-6)
    config = loaded.layers[-1].get_config()
    assert config["momentum"] == 0.9


def test_the_sum_is_rounded_on_the_learned_range():
    a = np.random.default_rng(0).normal(size=(2, 5)).astype("float32")
    add = QuantizedAdd()
    got = add([a, a], training=True).numpy()
    assert float(add.output_range.maximum) == pytest.approx(max(2 * a.max(), 0.0))
    scale = (float(add.output_range.maximum) - float(add.output_range.minimum)) / 255
    np.testing.assert_allclose(got, 2 * a, atol=scale / 2 + 1e-6)


def test_rejects_a_bad_momentum():
    with pytest.raises(ValueError, match="`momentum` must be a number"):
        QuantizedAdd(momentum=1.0)
