import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import GatedPositionFusion, gated_position_fusion, ops

keras = tf.keras


def dense_relative(table, t, s):
    """The `(1, T, S, D)` tensor `table[clip(j - i, -M, M) + M]`."""
    m = (table.shape[0] - 1) // 2
    rel = np.arange(s)[None, :] - np.arange(t)[:, None]
    return table[np.clip(rel, -m, m) + m][None]


def test_layer_checks_dense(tmp_path):
    abs_pos = np.random.normal(size=(2, 4, 3)).astype("float32")
    rel_pos = np.random.normal(size=(2, 4, 4, 3)).astype("float32")
    check_layer(
        GatedPositionFusion,
        [abs_pos, rel_pos],
        tmp_path,
        num_weights=2,
        expected_output_shape=(2, 4, 3),
    )


def test_layer_checks_own_table(tmp_path):
    abs_pos = np.random.normal(size=(2, 5, 3)).astype("float32")
    check_layer(
        lambda **kw: GatedPositionFusion(max_distance=2, **kw),
        abs_pos,
        tmp_path,
        num_weights=3,
        expected_output_shape=(2, 5, 3),
    )


CASES = [(5, 5, 2), (9, 9, 3), (4, 11, 2), (12, 3, 1), (6, 6, 9)]


@pytest.mark.parametrize("t,s,m", CASES)
def test_dense_relative_table_equals_numpy(t, s, m):
    table = np.random.normal(size=(2 * m + 1, 4)).astype("float32")
    got = ops.dense_relative_table(table, t, s).numpy()
    np.testing.assert_array_equal(got, dense_relative(table, t, s)[0])


@pytest.mark.parametrize("t,s,m", CASES)
def test_table_mean_equals_dense_mean(t, s, m):
    table = np.random.normal(size=(2 * m + 1, 4)).astype("float32")
    got = ops.clipped_table_mean(table, t, s).numpy()
    want = dense_relative(table, t, s)[0].mean(axis=1)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_table_path_equals_dense_path_in_the_layer():
    fusion = GatedPositionFusion()
    abs_pos = np.random.normal(size=(2, 7, 4)).astype("float32")
    table = np.random.normal(size=(5, 4)).astype("float32")
    dense = np.repeat(ops.dense_relative_table(table, 7, 7).numpy()[None], 2, axis=0)
    np.testing.assert_allclose(
        fusion(abs_pos, table).numpy(), fusion(abs_pos, dense).numpy(), atol=1e-5
    )


@pytest.mark.parametrize("bias,expect_abs", [(30.0, True), (-30.0, False)])
def test_forced_gate_selects_one_term(bias, expect_abs):
    fusion = GatedPositionFusion()
    abs_pos = np.random.normal(size=(1, 4, 3)).astype("float32")
    rel = np.random.normal(size=(1, 4, 4, 3)).astype("float32")
    fusion(abs_pos, rel)
    fusion.gate.kernel.assign(tf.zeros_like(fusion.gate.kernel))
    fusion.gate.bias.assign(tf.fill(fusion.gate.bias.shape, bias))
    want = abs_pos if expect_abs else rel.mean(axis=2)
    np.testing.assert_allclose(fusion(abs_pos, rel).numpy(), want, atol=1e-5)


def test_function_matches_the_document_formula():
    abs_pos = np.random.normal(size=(2, 3, 4)).astype("float32")
    rel = np.random.normal(size=(2, 3, 3, 4)).astype("float32")
    out = gated_position_fusion(abs_pos, rel).numpy()
    # out = g * abs + (1 - g) * mean: solve for g and check it lies in (0, 1).
    mean = rel.mean(axis=2)
    gate = (out - mean) / (abs_pos - mean)
    assert np.all((gate > 0) & (gate < 1))


def test_function_works_in_a_functional_model():
    abs_pos = keras.Input((5, 4))
    rel_pos = keras.Input((5, 5, 4))
    model = keras.Model([abs_pos, rel_pos], gated_position_fusion(abs_pos, rel_pos))
    assert tuple(model.output.shape) == (None, 5, 4)


def test_missing_relative_term_is_an_error():
    with pytest.raises(ValueError, match="`rel_pos` is required"):
        GatedPositionFusion()(np.zeros((1, 3, 2), "float32"))


def test_even_table_is_an_error():
    with pytest.raises(ValueError, match="odd row count"):
        GatedPositionFusion()(np.zeros((1, 3, 2), "float32"), np.zeros((4, 2)))


def test_rejects_bad_max_distance():
    with pytest.raises(ValueError, match="`max_distance` must be an integer >= 1"):
        GatedPositionFusion(max_distance=0)


def fake_quant(x, low, high):
    """TensorFlow's fake quantization to 256 levels, zero nudged onto the grid."""
    scale = (high - low) / 255
    zero = np.round(-low / scale)
    low, high = -zero * scale, (255 - zero) * scale
    return np.round((np.clip(x, low, high) - low) / scale) * scale + low


def test_quantized_fusion_is_the_float_fusion_on_its_learned_int8_grid():
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    plain = GatedPositionFusion(max_distance=2)
    rounded = GatedPositionFusion(max_distance=2, quantize=True)
    want = plain(x).numpy()
    rounded(x)
    pairs = [(plain.table, rounded.table)] + list(
        zip(plain.gate.weights, rounded.gate.weights)
    )
    for source, target in pairs:
        target.assign(source)
    got = rounded(x, training=True).numpy()  # the range of this batch
    low, high = min(want.min(), 0.0), max(want.max(), 0.0)
    np.testing.assert_allclose(got, fake_quant(want, low, high), atol=1e-5)
    assert np.abs(got - want).max() > 0  # it rounds
    assert rounded.get_config()["quantize"] is True
