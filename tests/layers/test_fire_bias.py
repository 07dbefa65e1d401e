import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import FireBias


def fire_oracle(layer, query_positions, key_positions, bidirectional):
    """Li et al. 2024, eq. 5 and appendix: MLP(psi(i - j) / psi(max(i, L)))."""
    c = float(layer.c.numpy())
    threshold = abs(float(layer.threshold_multiplier.numpy()) * layer.initial_threshold)
    i = query_positions[:, None].astype("float64")
    relative = i - key_positions[None, :]  # (T, S)
    psi = np.log(np.abs(c * relative) + 1.0)
    if bidirectional:
        psi *= np.sign(relative)
    normalizer = np.log(np.abs(c * np.maximum(i, threshold)) + 1.0)
    x = (psi / (normalizer + 1e-6))[..., None]  # (T, S, 1)
    hidden = np.maximum(x @ layer.mlp[0].kernel.numpy() + layer.mlp[0].bias.numpy(), 0)
    out = hidden @ layer.mlp[1].kernel.numpy() + layer.mlp[1].bias.numpy()
    return out.transpose(2, 0, 1)  # (N, T, S)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_is_the_papers_formula(bidirectional):
    layer = FireBias(num_heads=2, hidden_dim=5, bidirectional=bidirectional)
    layer.build()
    rng = np.random.default_rng(0)
    for weight in layer.mlp[0].weights + layer.mlp[1].weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    layer.c.assign(0.3)
    layer.threshold_multiplier.assign(-6.0 / layer.initial_threshold)  # L = 6
    bias = layer(tf.zeros((1, 5, 1)), tf.zeros((1, 11, 1)), start_index=6)
    want = fire_oracle(layer, np.arange(6, 11), np.arange(11), bidirectional)
    np.testing.assert_allclose(bias.numpy()[0], want, rtol=1e-5, atol=1e-5)
    q, k = np.array([[3, 40, 7]]), np.array([[0, 3, 39, 40]])
    bias = layer(tf.zeros((1, 3, 1)), tf.zeros((1, 4, 1)), positions=q, key_positions=k)
    want = fire_oracle(layer, q[0], k[0], bidirectional)
    np.testing.assert_allclose(bias.numpy()[0], want, rtol=1e-5, atol=1e-5)


def test_past_the_threshold_every_query_sees_its_keys_on_one_range():
    """Progressive interpolation: the first key of any query past L maps to 1."""
    layer = FireBias(
        num_heads=1, hidden_dim=4, bidirectional=False, initial_threshold=8.0
    )
    layer.build()
    layer.mlp[0].kernel.assign(np.ones((1, 4), "float32"))
    layer.mlp[0].bias.assign(np.zeros(4, "float32"))
    layer.mlp[1].kernel.assign(np.full((4, 1), 0.25, "float32"))
    layer.mlp[1].bias.assign(
        np.zeros(1, "float32")
    )  # the MLP is the identity on x >= 0
    for length in (20, 200, 2000):
        q = np.array([length - 1])
        bias = layer(tf.zeros((1, 1, 1)), tf.zeros((1, length, 1)), positions=q)
        row = bias.numpy()[0, 0, 0]  # (S,)
        np.testing.assert_allclose([row[0], row[-1]], [1.0, 0.0], atol=1e-5)
        assert np.all(np.diff(row) <= 0)
    short = layer(tf.zeros((1, 1, 1)), tf.zeros((1, 4, 1)), positions=np.array([3]))
    assert short.numpy()[0, 0, 0, 0] < 1.0  # under L: not stretched to [0, 1]


def test_the_bias_changes_with_the_query_not_only_the_distance():
    layer = FireBias(num_heads=2, bidirectional=False, initial_threshold=2.0)
    assert not layer.translation_invariant
    bias = layer(tf.zeros((1, 12, 1))).numpy()[0]
    assert not np.allclose(bias[:, 4, :4], bias[:, 10, 6:10], atol=1e-4)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="`initial_threshold` must be a finite number"):
        FireBias(2, initial_threshold=0.0)
    with pytest.raises(ValueError, match="`hidden_dim` must be an integer >= 1"):
        FireBias(2, hidden_dim=0)
    with pytest.raises(TypeError, match="`bidirectional` must be a bool"):
        FireBias(2, bidirectional=1)


@pytest.mark.parametrize(
    "jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize(
    "start,length,key_length",
    [(0, 5, 5), (0, 3, 9), (1, 6, 7), (2, 6, 8)],  # last query 4, 2 (< L); 6, 7
)
def test_training_gives_the_grids_bias_and_gradients(
    start, length, key_length, jit_compile
):
    """In training, queries below L take the distinct distances' path: the
    same values and gradients as the grid (and the paper's formula)."""
    layer = FireBias(num_heads=2, hidden_dim=5)
    layer.build()
    rng = np.random.default_rng(1)
    for weight in layer.mlp[0].weights + layer.mlp[1].weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    layer.c.assign(0.3)
    layer.threshold_multiplier.assign(6.0 / layer.initial_threshold)  # L = 6
    query, key = tf.zeros((1, length, 1)), tf.zeros((1, key_length, 1))
    upstream = tf.constant(rng.normal(size=(1, 2, length, key_length)), tf.float32)

    @tf.function(jit_compile=jit_compile)
    def bias_and_gradients(training):
        with tf.GradientTape() as tape:
            bias = layer(query, key, start_index=start, training=training)
            loss = tf.reduce_sum(tf.sin(bias) * upstream)
        return bias, tape.gradient(loss, layer.trainable_weights)

    bias, gradients = bias_and_gradients(True)
    grid_bias, grid_gradients = bias_and_gradients(False)
    want = fire_oracle(
        layer, np.arange(start, start + length), np.arange(key_length), True
    )
    np.testing.assert_allclose(bias.numpy()[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bias.numpy(), grid_bias.numpy(), rtol=1e-6, atol=1e-6)
    for got, grid in zip(gradients, grid_gradients):
        np.testing.assert_allclose(got.numpy(), grid.numpy(), rtol=1e-4, atol=1e-5)
