import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import LearnedPositionEmbedding


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 6, 10)).astype("float32")
    check_layer(
        lambda **kw: LearnedPositionEmbedding(max_length=8, **kw),
        x,
        tmp_path,
        num_weights=1,
        expected_output_shape=(3, 6, 10),
    )


def test_returns_the_table_rows():
    layer = LearnedPositionEmbedding(max_length=6, initializer="glorot_uniform")
    out = layer(tf.zeros((2, 4, 3))).numpy()
    table = layer.embeddings.numpy()
    np.testing.assert_array_equal(out[1], table[:4])


def test_explicit_positions_equal_start_index():
    layer = LearnedPositionEmbedding(max_length=10)
    x = tf.zeros((2, 3, 4))
    np.testing.assert_array_equal(
        layer(x, start_index=5).numpy(), layer(x, positions=[5, 6, 7]).numpy()
    )


def test_sequence_longer_than_max_length_suggests_a_relative_method():
    layer = LearnedPositionEmbedding(max_length=4)
    with pytest.raises(ValueError, match="Use a relative method"):
        layer(tf.zeros((1, 5, 2)))


def test_start_index_past_the_table_is_an_error():
    layer = LearnedPositionEmbedding(max_length=4)
    layer(tf.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="`max_length` must cover the sequence"):
        layer(tf.zeros((1, 2, 2)), start_index=3)


@pytest.mark.parametrize(
    "value,error", [(0, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_rejects_bad_max_length(value, error):
    with pytest.raises(error, match="`max_length` must be an integer >= 1"):
        LearnedPositionEmbedding(max_length=value)


def test_quantized_rows_are_the_int8_table_at_any_start():
    x = np.zeros((2, 5, 4), "float32")
    layer = LearnedPositionEmbedding(max_length=8, quantize=True)
    got = layer(x).numpy()
    table = layer.embeddings.numpy()
    step = np.abs(table).max() / 127  # symmetric, per tensor, as a weight
    rounded = np.round(table / step) * step
    np.testing.assert_allclose(got[0], rounded[:5], atol=1e-6)
    assert np.abs(got[0] - table[:5]).max() > 0
    later = layer(x[:, :2], start_index=4).numpy()  # a decoding step's rows
    np.testing.assert_allclose(later[0], rounded[4:6], atol=1e-6)
