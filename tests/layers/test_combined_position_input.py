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


def test_quantized_it_rounds_both_parts_onto_the_joined_range():
    """int8 concatenation gives its output one scale: a first training batch
    sets it to the joined tensor's own range (with 0)."""
    words = np.random.default_rng(1).normal(size=(2, 3, 4)).astype("float32")
    pos = np.random.default_rng(2).uniform(-1, 1, size=(1, 3, 2)).astype("float32")
    layer = CombinedPositionInput(quantize=True)
    got = layer(words, pos, training=True).numpy()
    joined = np.concatenate([words, np.broadcast_to(pos, (2, 3, 2))], axis=-1)
    low, high = min(joined.min(), 0.0), max(joined.max(), 0.0)
    scale = (high - low) / 255
    zero = np.round(-low / scale)
    want = (np.round(joined / scale + zero) - zero) * scale
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.abs(got - joined).max() > 0  # it rounds
    np.testing.assert_array_equal(layer(words, pos).numpy(), got)  # range kept
    copy = CombinedPositionInput.from_config(layer.get_config())
    assert copy.quantize is True
    with pytest.raises(TypeError, match="`quantize` must be"):
        CombinedPositionInput(quantize="yes")
