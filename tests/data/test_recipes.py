import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.data import datasets, recipes

pytest.importorskip("sklearn", reason="the digits data needs scikit-learn")


def test_digits_data_is_a_split_of_the_shuffled_patches():
    x, y = datasets.digits_patches(seed=3)
    (train_x, train_y), (test_x, test_y) = recipes.digits_data(limit=100, seed=3)
    assert train_x.shape == (80, 16, 4) and test_x.shape == (20, 16, 4)
    np.testing.assert_array_equal(np.concatenate([train_x, test_x]), x[:100])
    np.testing.assert_array_equal(np.concatenate([train_y, test_y]), y[:100])


@pytest.mark.slow
def test_digits_classifier_is_compiled_for_integer_labels():
    model = recipes.digits_classifier("t5", hidden_dim=8, learning_rate=1e-3)
    assert tuple(model.input.shape) == (None, 16, 4)
    assert tuple(model.output.shape) == (None, 10)
    assert isinstance(model.loss, tf.keras.losses.SparseCategoricalCrossentropy)
    assert np.isclose(float(model.optimizer.learning_rate.numpy()), 1e-3)
    (train_x, train_y), _ = recipes.digits_data(limit=40)
    history = model.fit(train_x, train_y, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
