import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import ForgettingGate


def log_sigmoid(z):
    return -np.log1p(np.exp(-z))


def fox_oracle(gate, x, mask=None):
    """Lin et al. 2025: D[i, j] = sum_{l=j+1..i} log f_l (j <= i); the backward
    gate's sum_{l=i..j-1} log g_l after the query (x-transformers' bidirectional
    form); padded tokens' log gates are 0."""
    kernel, bias = (w.numpy().astype("float64") for w in gate.gate_dense.weights)
    logs = log_sigmoid(x.astype("float64") @ kernel + bias)  # (B, T, G*N)
    if mask is not None:
        logs = logs * mask[:, :, None]
    n, (b, t, _) = gate.num_heads, x.shape
    out = np.zeros((b, n, t, t))
    for i in range(t):
        for j in range(t):
            if j <= i:
                out[:, :, i, j] = logs[:, j + 1 : i + 1, :n].sum(axis=1)
            elif gate.bidirectional:
                out[:, :, i, j] = logs[:, i:j, n:].sum(axis=1)
    return out


@pytest.mark.parametrize(
    "bidirectional,window", [(True, None), (False, None), (True, 4)]
)
def test_layer_checks(bidirectional, window, tmp_path):
    x = np.random.normal(size=(2, 6, 4)).astype("float32")
    check_layer(
        lambda **kw: ForgettingGate(
            2, bidirectional=bidirectional, attention_window=window, **kw
        ),
        x,
        tmp_path,
        num_weights=2,  # the gate's kernel and bias
        # block-local: (B, N * ceil(6 / 4), W, 3W)
        expected_output_shape=(2, 2, 6, 6) if window is None else (2, 4, 4, 12),
        fit=False,
        passes_mask=False,
    )


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("length,window", [(7, 3), (9, 3), (2, 4)])
def test_the_band_holds_the_papers_bias_at_every_pair_it_reaches(
    bidirectional, length, window
):
    gate = ForgettingGate(
        2, bidirectional=bidirectional, initial_bias=0.5, attention_window=window
    )
    x = np.random.default_rng(length).normal(size=(2, length, 5)).astype("float32")
    mask = np.ones((2, length), bool)
    mask[1, length // 2 :] = False
    band = gate(x, mask=mask).numpy()  # (B, N*nb, W, 3W)
    want = fox_oracle(gate, x, mask)  # (B, N, T, T)
    blocks = -(-length // window)
    assert band.shape == (2, 2 * blocks, window, 3 * window)
    reached = 0
    for n in range(2):
        for b in range(blocks):
            for w in range(window):
                for slot in range(3 * window):
                    i, j = b * window + w, (b - 1) * window + slot
                    if i < length and 0 <= j < length:
                        got = band[:, n * blocks + b, w, slot]
                        np.testing.assert_allclose(got, want[:, n, i, j], atol=1e-5)
                        reached += 1
    # Every pair within a block of the other's block is on the band.
    assert reached == 2 * np.sum(
        np.abs(np.arange(length)[:, None] // window - np.arange(length)[None] // window)
        <= 1
    )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_is_the_papers_running_sum_of_log_gates(bidirectional):
    gate = ForgettingGate(3, bidirectional=bidirectional, initial_bias=0.5)
    x = np.random.default_rng(0).normal(size=(2, 7, 5)).astype("float32")
    gate.build(x.shape)
    kernel = gate.gate_dense.kernel
    kernel.assign(np.random.default_rng(1).normal(size=kernel.shape).astype("float32"))
    np.testing.assert_allclose(gate(x).numpy(), fox_oracle(gate, x), atol=1e-5)
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False
    np.testing.assert_allclose(
        gate(x, mask=mask).numpy(), fox_oracle(gate, x, mask), atol=1e-5
    )
    # In training the pairs run as one XLA-compiled function: the same bias.
    training = tf.function(lambda x, mask: gate(x, mask=mask, training=True))
    np.testing.assert_allclose(
        training(x, mask).numpy(), fox_oracle(gate, x, mask), atol=1e-5
    )


def test_starts_close_to_no_forgetting_and_never_adds():
    gate = ForgettingGate(2)  # initial_bias 5: f = sigmoid(5 + w . x)
    bias = gate(np.random.default_rng(0).normal(size=(1, 9, 8)).astype("float32"))
    bias = bias.numpy()
    assert np.all(bias <= 0) and np.all(np.diag(bias[0, 0]) == 0)
    assert bias[0, :, 8, 0].max() > -0.5  # eight steps of near-1 gates


def test_causal_a_later_token_moves_no_earlier_row():
    gate = ForgettingGate(2, bidirectional=False)
    x = np.random.default_rng(0).normal(size=(1, 8, 4)).astype("float32")
    changed = x.copy()
    changed[:, 5] += 10.0
    a, b = gate(x).numpy(), gate(changed).numpy()
    np.testing.assert_allclose(a[:, :, :5], b[:, :, :5], atol=1e-6)
    assert not np.allclose(a[:, :, 5:], b[:, :, 5:])
    assert np.all(a[:, :, np.triu_indices(8, 1)[0], np.triu_indices(8, 1)[1]] == 0)


def test_steps_through_a_cache_equal_the_whole_sequence():
    """What the cache holds: each position's running sum c_j (B, S_max, N)."""
    gate = ForgettingGate(2, bidirectional=False)
    x = np.random.default_rng(0).normal(size=(2, 7, 4)).astype("float32")
    full = gate(x).numpy()  # (B, N, T, T)
    sums = tf.zeros((2, 10, 2))
    first, sums = gate.step(x[:, :3], sums, 0)  # a 3-token prompt
    seen = np.tril(np.ones((3, 3), bool))  # later slots: masked by the attention
    np.testing.assert_allclose(
        first.numpy()[..., :3][..., seen], full[:, :, :3, :3][..., seen], atol=1e-5
    )
    for t in range(3, 7):
        bias, sums = gate.step(x[:, t : t + 1], sums, t)
        np.testing.assert_allclose(
            bias.numpy()[:, :, 0, : t + 1], full[:, :, t, : t + 1], atol=1e-5
        )
    running = np.cumsum(
        log_sigmoid(x @ gate.gate_dense.kernel.numpy() + gate.gate_dense.bias.numpy()),
        axis=1,
    )
    np.testing.assert_allclose(sums.numpy()[:, :7], running, atol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="`initial_bias` must be a number"):
        ForgettingGate(2, initial_bias="5")
    with pytest.raises(ValueError, match="`num_heads` must be an integer >= 1"):
        ForgettingGate(0)
    with pytest.raises(ValueError, match="`attention_window` must be an integer >= 1"):
        ForgettingGate(2, attention_window=0)
    with pytest.raises(ValueError, match="`bidirectional` must be False to decode"):
        ForgettingGate(2).step(tf.zeros((1, 1, 4)), tf.zeros((1, 4, 2)), 0)
    with pytest.raises(ValueError, match="The last axis of the input must be known"):
        ForgettingGate(2).build((1, 4, None))


def test_a_rolling_state_that_never_rolls_gives_the_whole_sequences_bias():
    """`rolling_step` token by token into 8 slots (2 sinks): while nothing is
    evicted, the gates summed in cache order are the text's running sums."""
    gate = ForgettingGate(2, bidirectional=False)
    x = tf.random.normal((1, 6, 4))
    whole = gate(x).numpy()  # (1, N, T, T)
    gates = tf.zeros((1, 8, 2))
    rows = []
    for t in range(6):
        bias, gates = gate.rolling_step(x[:, t : t + 1], gates, t, sink_tokens=2)
        rows.append(bias.numpy()[:, :, 0, :6])  # the slots hold positions 0..5
    got = np.stack(rows, axis=2)
    seen = np.tril(np.ones((6, 6), bool))
    np.testing.assert_allclose(got[..., seen], whole[..., seen], atol=1e-5)


def decay_gradient_oracle(log_forward, log_backward, upstream):
    """d sum(bias * upstream) / d log-gates, pair by pair: a forward gate
    l counts in every pair j < l <= i, a backward gate l in every pair
    i <= l < j (a floored pair too: the floor passes its gradient through)."""
    b, t, n = log_forward.shape
    d_forward, d_backward = np.zeros((b, t, n)), np.zeros((b, t, n))
    for i in range(t):
        for j in range(t):
            if j <= i:
                d_forward[:, j + 1 : i + 1] += upstream[:, None, :, i, j]
            elif log_backward is not None:
                d_backward[:, i:j] += upstream[:, None, :, i, j]
    return d_forward, d_backward


@pytest.mark.parametrize(  # fused: the layer's training path (XLA pairs)
    "jit_compile,fused", [(False, False), (True, False), (False, True)]
)
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("floored", [False, True])
@pytest.mark.parametrize("length", [9, 70])  # one block (padded), three
def test_the_written_out_gradient_is_the_pairs_gradient(
    bidirectional, floored, jit_compile, fused, length
):
    from keras_posenc.ops.forgetting import decay_bias

    rng = np.random.default_rng(3)
    shape, floor = (2, length, 3), -1e4
    log_forward = -rng.exponential(size=shape)
    log_backward = -rng.exponential(size=shape) if bidirectional else None
    if floored:  # one closed gate per side: every pair across it is floored
        log_forward[0, 4, 1] = -2e4
        if bidirectional:
            log_backward[1, 6, 2] = -3e4
    upstream = rng.normal(size=(2, 3, length, length))

    @tf.function(jit_compile=jit_compile)
    def gradients(log_forward, log_backward):
        with tf.GradientTape() as tape:
            tape.watch([log_forward, log_backward])
            backward = log_backward if bidirectional else None
            bias = decay_bias(log_forward, backward, floor, fused=fused)
            loss = tf.reduce_sum(bias * tf.constant(upstream, tf.float32))
        return bias, tape.gradient(loss, [log_forward, log_backward])

    bias, (d_forward, d_backward) = gradients(
        tf.constant(log_forward, tf.float32),
        tf.constant(
            np.zeros(shape) if log_backward is None else log_backward, tf.float32
        ),
    )
    want_forward, want_backward = decay_gradient_oracle(
        log_forward, log_backward, upstream
    )
    assert (np.min(bias) == floor) == floored  # the floor holds
    np.testing.assert_allclose(d_forward.numpy(), want_forward, atol=1e-4)
    if bidirectional:
        np.testing.assert_allclose(d_backward.numpy(), want_backward, atol=1e-4)
    else:
        assert d_backward is None


@pytest.mark.parametrize("length", [64, 70])  # a multiple of the block, or padded
def test_the_pairs_gradient_is_the_same_at_an_unknown_length(length):
    from keras_posenc.ops.forgetting import PAIR_BLOCK, decay_bias

    assert length // PAIR_BLOCK >= 2  # blocks off the diagonal take part
    rng = np.random.default_rng(5)
    gates = [
        tf.constant(-rng.exponential(size=(2, length, 3)), tf.float32) for _ in range(2)
    ]
    upstream = tf.constant(rng.normal(size=(2, 3, length, length)), tf.float32)

    def gradients(log_forward, log_backward):
        with tf.GradientTape() as tape:
            tape.watch([log_forward, log_backward])
            bias = decay_bias(log_forward, log_backward, -1e4)
            loss = tf.reduce_sum(bias * upstream)
        return tape.gradient(loss, [log_forward, log_backward])

    unknown = tf.TensorSpec([None, None, 3], tf.float32)
    traced = tf.function(gradients, input_signature=[unknown, unknown])
    assert traced.get_concrete_function().structured_outputs[0].shape[1] is None
    for got, want in zip(traced(*gates), tf.function(gradients)(*gates)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_in_attention_a_floored_pair_gets_the_floors_own_gradient():
    """Through a softmax a floored pair's weight is 0, so the straight-through
    floor gives TensorFlow's gradient of `max(bias, floor)` exactly."""
    from keras_posenc.ops.forgetting import decay_bias

    rng = np.random.default_rng(4)
    shape = (2, 8, 2)
    log_forward = -rng.exponential(size=shape)
    log_backward = -rng.exponential(size=shape)
    log_forward[0, 3, 1] = log_backward[1, 5, 0] = -2e4  # closed gates
    logits = tf.constant(rng.normal(size=(2, 2, 8, 8)), tf.float32)
    values = tf.constant(rng.normal(size=(2, 2, 8, 3)), tf.float32)

    def plain(log_forward, log_backward):  # the paper's pairs, TF's gradient
        c = tf.transpose(tf.cumsum(log_forward, axis=1), [0, 2, 1])
        e = tf.transpose(tf.cumsum(log_backward, axis=1, exclusive=True), [0, 2, 1])
        before = c[:, :, :, None] - c[:, :, None, :]
        after = e[:, :, None, :] - e[:, :, :, None]
        return tf.maximum(tf.where(np.tril(np.ones((8, 8), bool)), before, after), -1e4)

    def gradients(bias_fn):
        gates = [
            tf.constant(log_forward, tf.float32),
            tf.constant(log_backward, tf.float32),
        ]
        with tf.GradientTape() as tape:
            tape.watch(gates)
            weights = tf.nn.softmax(logits + bias_fn(*gates))
            loss = tf.reduce_sum(tf.sin(weights @ values))
        return [g.numpy() for g in tape.gradient(loss, gates)]

    ours = gradients(lambda f, b: decay_bias(f, b, -1e4))
    for got, want in zip(ours, gradients(plain)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
