import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import KerpleBias


def kerple_oracle(r1, r2, query_positions, key_positions, kernel):
    """The paper's kernels, with separate (before, after) rows when 2-D."""
    relative = key_positions[None, :] - query_positions[:, None]  # (T, S)
    d = np.abs(relative).astype("float64")
    if r1.ndim == 2:
        after = relative > 0
        r1 = np.where(after, r1[1][:, None, None], r1[0][:, None, None])
        r2 = np.where(after, r2[1][:, None, None], r2[0][:, None, None])
    else:
        r1, r2 = r1[:, None, None], r2[:, None, None]
    if kernel == "log":
        return -r1 * np.log(1.0 + r2 * d)  # (N, T, S)
    return -r1 * d**r2


def set_parameters(layer, r1, r2):
    layer.r1.assign(np.asarray(r1, "float32"))
    layer.r2.assign(np.asarray(r2, "float32"))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("kernel", ["log", "power"])
def test_bias_is_the_papers_kernel(kernel, bidirectional):
    layer = KerpleBias(num_heads=2, kernel=kernel, bidirectional=bidirectional)
    layer.build()
    shape = (2, 2) if bidirectional else (2,)
    rng = np.random.default_rng(0)
    r1, r2 = rng.uniform(0.1, 2.0, shape), rng.uniform(0.1, 1.9, shape)
    set_parameters(layer, r1, r2)
    bias = layer(tf.zeros((1, 4, 1)), tf.zeros((1, 7, 1)), start_index=3)
    want = kerple_oracle(r1, r2, np.arange(3, 7), np.arange(7), kernel)
    np.testing.assert_allclose(bias.numpy()[0], want, rtol=1e-5, atol=1e-6)
    # Explicit (per-example) positions: the same kernel at those positions.
    q, k = np.array([[5, 9, 2]]), np.array([[0, 4, 9, 12]])
    bias = layer(tf.zeros((1, 3, 1)), tf.zeros((1, 4, 1)), positions=q, key_positions=k)
    want = kerple_oracle(r1, r2, q[0], k[0], kernel)
    np.testing.assert_allclose(bias.numpy()[0], want, rtol=1e-5, atol=1e-6)


def test_bias_depends_only_on_distance_and_falls_with_it():
    layer = KerpleBias(num_heads=3, kernel="power", bidirectional=False)
    bias = layer(tf.zeros((1, 10, 1))).numpy()[0]
    for i in range(9):
        np.testing.assert_allclose(bias[:, i, :9], bias[:, i + 1, 1:], atol=1e-6)
    before = bias[:, -1, ::-1]  # distances 0, 1, ..., 9 from the last query
    assert np.all(np.diff(before, axis=-1) < 0) and np.all(before[:, 0] == 0)


def test_parameters_stay_in_range_after_a_step_that_pushes_them_out():
    layer = KerpleBias(num_heads=2, kernel="power", bidirectional=False)
    layer.build()
    set_parameters(layer, [0.5, 0.5], [1.9, 0.5])
    optimizer = tf.keras.optimizers.SGD(10.0)
    with tf.GradientTape() as tape:
        bias = layer(tf.zeros((1, 8, 1)))
        loss = tf.reduce_sum(bias) * -1.0  # pushes r1 down, r2 down
    gradients = tape.gradient(loss, [layer.r1, layer.r2])
    assert all(np.isfinite(g.numpy()).all() for g in gradients)  # 0 ** r2 at d=0
    optimizer.apply_gradients(zip(gradients, [layer.r1, layer.r2]))
    assert np.all(layer.r1.numpy() >= 0.01) and np.all(layer.r2.numpy() >= 0.01)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.zeros((1, 8, 1))))  # pushes r2 up
    gradients = tape.gradient(loss, [layer.r1, layer.r2])
    optimizer.apply_gradients(zip(gradients, [layer.r1, layer.r2]))
    assert np.all(layer.r2.numpy() <= 2.0)


def test_a_parameter_below_the_clamp_acts_as_the_clamp():
    layer = KerpleBias(num_heads=1, bidirectional=False)
    layer.build()
    set_parameters(layer, [-1.0], [0.5])  # set directly, no constraint ran
    bias = layer(tf.zeros((1, 3, 1))).numpy()[0]
    want = kerple_oracle(
        np.array([0.01]), np.array([0.5]), np.arange(3), np.arange(3), "log"
    )
    np.testing.assert_allclose(bias, want, rtol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        KerpleBias(2, kernel="gaussian")
    with pytest.raises(ValueError, match="`num_heads` must be an integer >= 1"):
        KerpleBias(0)
    with pytest.raises(TypeError, match="`bidirectional` must be a bool"):
        KerpleBias(2, bidirectional="yes")
