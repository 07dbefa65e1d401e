import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import CombinedPositionInput, combined_attention_input

keras = tf.keras


def test_layer_checks(tmp_path):
    words = np.random.normal(size=(3, 5, 4)).astype("float32")
    pos = np.random.normal(size=(3, 5, 2)).astype("float32")
    check_layer(
        CombinedPositionInput,
        [words, pos],
        tmp_path,
        num_weights=0,
        expected_output_shape=(3, 5, 6),
    )


def test_function_concatenates_eager_tensors():
    words, pos = np.ones((2, 3, 4), "float32"), np.zeros((2, 3, 4), "float32")
    out = combined_attention_input(words, pos).numpy()
    np.testing.assert_array_equal(out, np.concatenate([words, pos], -1))


def test_function_works_in_a_functional_model():
    words = keras.Input((5, 4))
    pos = keras.Input((5, 4))
    model = keras.Model([words, pos], combined_attention_input(words, pos))
    assert tuple(model.output.shape) == (None, 5, 8)


def test_batch_one_positions_broadcast():
    out = combined_attention_input(tf.ones((3, 2, 4)), tf.zeros((1, 2, 4)))
    assert out.shape == (3, 2, 8)


def test_word_mask_passes_through():
    tokens = keras.Input((4,), dtype="int32")
    emb = keras.layers.Embedding(10, 4, mask_zero=True)(tokens)
    combined = CombinedPositionInput()(emb, emb)
    pooled = keras.layers.GlobalAveragePooling1D()(combined)
    model = keras.Model(tokens, pooled)
    x = np.array([[3, 4, 0, 0]])
    want = np.concatenate([model.layers[1](x)[0, :2].numpy().mean(0)] * 2)
    np.testing.assert_allclose(model(x).numpy()[0], want, atol=1e-6)


@pytest.mark.parametrize(
    "pos_shape,name", [((2, 4, 4), "length"), ((3, 3, 4), "batch")]
)
def test_mismatched_shapes_are_an_error(pos_shape, name):
    with pytest.raises(ValueError, match=f"must match the {name}"):
        combined_attention_input(tf.ones((2, 3, 4)), tf.zeros(pos_shape))


def test_wrong_rank_is_an_error():
    with pytest.raises(ValueError, match="must both have rank 3"):
        combined_attention_input(tf.ones((2, 3)), tf.zeros((2, 3)))
