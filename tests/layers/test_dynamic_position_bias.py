import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import (
    DynamicPositionBias,
    RotaryEmbedding,
)


def mlp_oracle(layer, distances):
    x = np.sign(distances) * np.log1p(np.abs(distances))
    for i, dense in enumerate(layer.mlp):
        x = x @ dense.kernel.numpy() + dense.bias.numpy()
        if i < len(layer.mlp) - 1:
            x = np.maximum(x, 0)
    return x


def test_bias_is_the_mlp_of_the_distance():
    layer = DynamicPositionBias(num_heads=2, hidden_dim=5)
    bias = layer(tf.zeros((1, 4, 1)), tf.zeros((1, 6, 1))).numpy()[0]
    rel = (np.arange(6)[None, :] - np.arange(4)[:, None]).astype("float32")
    want = mlp_oracle(layer, rel[..., None]).transpose(2, 0, 1)
    np.testing.assert_allclose(bias, want, atol=1e-5)


def test_bias_depends_only_on_distance():
    bias = DynamicPositionBias(num_heads=2)(tf.zeros((1, 9, 1))).numpy()[0]
    for i in range(8):
        np.testing.assert_allclose(bias[:, i, :8], bias[:, i + 1, 1:], atol=1e-6)


def test_distinct_distance_path_equals_the_grid_path_and_its_gradients():
    layer = DynamicPositionBias(num_heads=2)
    q, k = tf.zeros((1, 5, 1)), tf.zeros((1, 8, 1))
    upstream = tf.random.stateless_normal((1, 2, 5, 8), seed=(1, 2))
    results = []
    grid_positions = {"positions": np.arange(3, 8), "key_positions": np.arange(8)}
    for where in ({"start_index": 3}, grid_positions):  # distinct path, then grid
        with tf.GradientTape() as tape:
            bias = layer(q, k, **where)
            loss = tf.reduce_sum(bias * upstream)
        results.append((bias, tape.gradient(loss, layer.trainable_variables)))
    (fast, fast_grads), (grid, grid_grads) = results
    np.testing.assert_allclose(fast.numpy(), grid.numpy(), atol=1e-5)
    for a, b in zip(fast_grads, grid_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_two_dimensional_coordinates():
    layer = DynamicPositionBias(num_heads=2, coordinate_dim=2, log_distance=False)
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(2), indexing="ij"), -1)
    grid = grid.reshape(6, 2).astype("float32")
    bias = layer(tf.zeros((1, 6, 1)), positions=grid, key_positions=grid).numpy()[0]
    diff = grid[None, :, :] - grid[:, None, :]
    want = mlp_oracle_linear(layer, diff).transpose(2, 0, 1)
    np.testing.assert_allclose(bias, want, atol=1e-5)


def mlp_oracle_linear(layer, x):
    for i, dense in enumerate(layer.mlp):
        x = x @ dense.kernel.numpy() + dense.bias.numpy()
        if i < len(layer.mlp) - 1:
            x = np.maximum(x, 0)
    return x


def test_extrapolates_to_long_sequences_with_finite_values():
    layer = DynamicPositionBias(num_heads=2)
    short = layer(tf.zeros((1, 8, 1))).numpy()
    long = layer(tf.zeros((1, 256, 1))).numpy()
    np.testing.assert_allclose(long[:, :, :8, :8], short, atol=1e-6)
    assert np.all(np.isfinite(long))


def test_missing_coordinates_are_an_error():
    layer = DynamicPositionBias(num_heads=2, coordinate_dim=2)
    with pytest.raises(ValueError, match="`positions` must be given"):
        layer(tf.zeros((1, 3, 1)))


def test_wrong_coordinate_width_is_an_error():
    layer = DynamicPositionBias(num_heads=2, coordinate_dim=2)
    with pytest.raises(ValueError, match="must end in coordinate_dim=2"):
        layer(tf.zeros((1, 3, 1)), positions=np.zeros((3, 3)), key_positions=None)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_heads": 0}, ValueError, "`num_heads` must be an integer >= 1"),
        ({"hidden_dim": None}, TypeError, "`hidden_dim` must be an integer"),
        ({"num_layers": 0}, ValueError, "`num_layers` must be an integer >= 1"),
        ({"log_distance": "yes"}, TypeError, "`log_distance` must be a bool"),
        ({"coordinate_dim": 0}, ValueError, "`coordinate_dim` must be an integer"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"num_heads": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        DynamicPositionBias(**args)


def test_grid_bias_is_the_mlp_of_grid_offsets_and_honours_start_index():
    layer = DynamicPositionBias(
        num_heads=2, coordinate_dim=2, grid_shape=(3, 4), log_distance=False
    )
    q, k = tf.zeros((1, 12, 1)), tf.zeros((1, 12, 1))
    full = layer(q, k).numpy()
    rows, cols = np.divmod(np.arange(12), 4)
    grid = np.stack([rows, cols], -1).astype("float32")  # row-major coordinates
    want = mlp_oracle_linear(layer, grid[None, :, :] - grid[:, None, :])
    np.testing.assert_allclose(full[0], want.transpose(2, 0, 1), atol=1e-5)
    tail = layer(q[:, 8:], k, start_index=8).numpy()
    np.testing.assert_allclose(tail, full[:, :, 8:], atol=1e-6)


@pytest.mark.parametrize("length,start", [(13, 0), (5, 8)])
def test_tokens_past_the_grid_are_refused(length, start):
    layer = DynamicPositionBias(num_heads=2, coordinate_dim=2, grid_shape=(3, 4))
    with pytest.raises(ValueError, match=r"flat indices in \[0, 12\) for grid_shape"):
        layer(tf.zeros((1, length, 1)), tf.zeros((1, 12, 1)), start_index=start)


@pytest.mark.parametrize("layer", [DynamicPositionBias, RotaryEmbedding])
def test_a_grid_shape_of_the_wrong_length_is_refused(layer):
    arguments = {"num_heads": 2} if layer is DynamicPositionBias else {}
    with pytest.raises(ValueError, match="`grid_shape` must be of length coordinate"):
        layer(coordinate_dim=2, grid_shape=(2, 3, 4), **arguments)
    with pytest.raises(ValueError, match="`grid_shape` must be an integer >= 1"):
        layer(coordinate_dim=2, grid_shape=(2, 0), **arguments)
