import numpy as np
import pytest
import tensorflow as tf
from oracles import t5_bucket_oracle

from keras_posenc import RelativePositionBias, ops

MODES = ["t5", "clipped", "alibi"]


def make(mode, **kwargs):
    kwargs.setdefault("initializer", tf.keras.initializers.RandomNormal(seed=1))
    return RelativePositionBias(num_heads=3, mode=mode, **kwargs)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_bias_depends_only_on_distance(mode, bidirectional):
    layer = make(mode, bidirectional=bidirectional, num_buckets=8, max_distance=6)
    bias = layer(tf.zeros((1, 12, 2)), tf.zeros((1, 15, 2))).numpy()[0]  # (N, T, S)
    assert bias.shape == (3, 12, 15)
    for i in range(11):
        for j in range(14):
            np.testing.assert_array_equal(bias[:, i, j], bias[:, i + 1, j + 1])


def test_t5_bias_reads_the_table_at_the_t5_bucket():
    layer = make("t5", num_buckets=16, max_distance=40)
    bias = layer(tf.zeros((1, 50, 1))).numpy()[0]
    table = layer.table.numpy()  # (K, N)
    rel = np.arange(50)[None, :] - np.arange(50)[:, None]
    want = table[t5_bucket_oracle(rel, True, 16, 40)].transpose(2, 0, 1)
    np.testing.assert_array_equal(bias, want)


def test_clipped_bias_reads_the_table_at_the_clipped_distance():
    layer = make("clipped", max_distance=3)
    bias = layer(tf.zeros((1, 8, 1))).numpy()[0]
    table = layer.table.numpy()
    assert table.shape == (7, 3)
    rel = np.arange(8)[None, :] - np.arange(8)[:, None]
    want = table[np.clip(rel, -3, 3) + 3].transpose(2, 0, 1)
    np.testing.assert_array_equal(bias, want)


def test_causal_clipped_table_has_one_row_per_past_distance():
    layer = make("clipped", max_distance=3, bidirectional=False)
    layer(tf.zeros((1, 2, 1)))
    assert layer.table.shape == (4, 3)


def test_alibi_has_no_weights_and_matches_the_slopes():
    layer = RelativePositionBias(num_heads=8, mode="alibi", bidirectional=False)
    bias = layer(tf.zeros((1, 5, 1))).numpy()[0]
    assert layer.weights == []
    dist = np.abs(np.arange(5)[None, :] - np.arange(5)[:, None])
    np.testing.assert_allclose(bias, -ops.alibi_slopes(8)[:, None, None] * dist)


@pytest.mark.parametrize("mode", MODES)
def test_explicit_positions_equal_start_index(mode):
    layer = make(mode, num_buckets=8, max_distance=6)
    q, k = tf.zeros((1, 3, 2)), tf.zeros((1, 9, 2))
    offset = layer(q, k, start_index=6).numpy()
    explicit = layer(q, k, positions=tf.range(6, 9), key_positions=tf.range(9)).numpy()
    np.testing.assert_array_equal(offset, explicit)


def test_per_example_positions_give_a_per_example_bias():
    layer = make("clipped", max_distance=4)
    positions = np.array([[0, 1, 2], [0, 0, 1]])
    bias = layer(tf.zeros((2, 3, 1)), positions=positions, key_positions=positions)
    assert bias.shape == (2, 3, 3, 3)
    np.testing.assert_array_equal(bias[1, :, 0, 1], bias[1, :, 0, 0])


def test_bias_extends_to_longer_sequences_than_seen():
    layer = make("t5", num_buckets=8, max_distance=6)
    short = layer(tf.zeros((1, 4, 1))).numpy()
    long = layer(tf.zeros((1, 40, 1))).numpy()
    np.testing.assert_array_equal(long[:, :, :4, :4], short)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_heads": 0}, ValueError, "`num_heads` must be an integer >= 1"),
        ({"num_heads": "2"}, TypeError, "`num_heads` must be an integer"),
        ({"mode": "rope"}, ValueError, r"`mode` must be one of \('t5'"),
        ({"num_buckets": 7}, ValueError, "`num_buckets` must be an even integer"),
        ({"num_buckets": 1}, ValueError, "`num_buckets` must be an integer >= 2"),
        ({"max_distance": 4}, ValueError, "`max_distance` must be greater than"),
        ({"max_distance": 0}, ValueError, "`max_distance` must be an integer >= 1"),
        ({"bidirectional": 1}, TypeError, "`bidirectional` must be a bool"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"num_heads": 2, "mode": "t5", "num_buckets": 32, "max_distance": 128}
    args.update(kwargs)
    if "max_distance" in kwargs and kwargs["max_distance"] == 4:
        args["num_buckets"] = 32
    with pytest.raises(error, match=match):
        RelativePositionBias(**args)
