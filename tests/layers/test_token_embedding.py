import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import TokenEmbedding


def test_layer_checks(tmp_path):
    ids = np.random.randint(0, 12, size=(2, 5)).astype("int32")
    check_layer(
        lambda **kw: TokenEmbedding(12, 6, mask_zero=True, **kw),
        ids,
        tmp_path,
        num_weights=1,
        expected_output_shape=(2, 5, 6),
    )


def test_returns_the_table_rows():
    layer = TokenEmbedding(7, 3)
    ids = np.array([[0, 6, 2], [3, 3, 1]])
    out = layer(ids).numpy()
    np.testing.assert_array_equal(out, layer.embeddings.numpy()[ids])


def test_mask_zero_marks_id_zero_as_padding():
    ids = np.array([[4, 2, 0, 0], [1, 0, 5, 0]])
    out = TokenEmbedding(6, 2, mask_zero=True)(ids)
    np.testing.assert_array_equal(np.asarray(out._keras_mask), ids != 0)
    assert getattr(TokenEmbedding(6, 2)(ids), "_keras_mask", None) is None


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"vocab_size": 0}, ValueError, "`vocab_size` must be an integer >= 1"),
        ({"output_dim": 2.5}, TypeError, "`output_dim` must be an integer"),
        ({"mask_zero": 1}, TypeError, "`mask_zero` must be a bool"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"vocab_size": 4, "output_dim": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        TokenEmbedding(**args)


def test_mixed_precision_output_dtype():
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    assert TokenEmbedding(5, 2)(np.array([[1, 2]])).dtype == tf.float16


def test_quantized_rows_are_rows_of_the_int8_table():
    layer = TokenEmbedding(7, 4, quantize=True)
    ids = np.array([[1, 6, 0]])
    got = layer(ids).numpy()
    table = layer.embeddings.numpy()
    step = np.abs(table).max() / 127
    np.testing.assert_allclose(
        got[0], np.round(table[[1, 6, 0]] / step) * step, atol=1e-6
    )
    assert TokenEmbedding.from_config(layer.get_config()).quantize
