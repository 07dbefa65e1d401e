import numpy as np
import pytest

from keras_posenc.data import datasets, synthetic


def test_relative_offset_labels_copy_the_token_three_places_left():
    tokens, labels = synthetic.make_task("relative_offset", 4, 12)
    np.testing.assert_array_equal(labels[:, 3:], tokens[:, :-3])
    assert not labels[:, :3].any()


def test_absolute_and_combined_labels():
    tokens, absolute = synthetic.make_task("absolute_position", 2, 6)
    np.testing.assert_array_equal(absolute, np.repeat(tokens[:, 1:2], 6, axis=1))
    _, both = synthetic.make_task("relative_and_absolute", 2, 6)
    np.testing.assert_array_equal(both[:, 1::2], absolute[:, 1::2])
    np.testing.assert_array_equal(both[:, 4], tokens[:, 1])


def test_rejects_unknown_tasks_and_short_lengths():
    with pytest.raises(ValueError, match="`name` must be one of"):
        synthetic.make_task("sorting", 2, 8)
    with pytest.raises(ValueError, match="`length` must exceed offset=3"):
        synthetic.make_task("relative_offset", 2, 3)


def test_digits_patches_rebuild_the_images():
    from sklearn.datasets import load_digits

    x, y = datasets.digits_patches(seed=0)
    assert x.shape == (1797, 16, 4) and 0.0 <= x.min() and x.max() <= 1.0
    order = np.random.default_rng(0).permutation(1797)
    image = load_digits().images[order[0]] / 16.0
    np.testing.assert_allclose(x[0, 0], image[:2, :2].ravel())  # top-left patch
    np.testing.assert_allclose(x[0, 1], image[:2, 2:4].ravel())  # its right neighbour
