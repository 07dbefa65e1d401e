import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import ContextualPosition, RelativeMultiHeadAttention


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cope_oracle(queries, logits, mask, embeddings, max_position):
    """Golovneva et al. 2024: p_ij = sum_{t=j..i} sigmoid(q_i . k_t) (masked
    keys count 0), clamped; q_i . e interpolated between floor and ceil of p."""
    gates = sigmoid(logits.astype("float64")) * mask  # (B, N, T, S)
    positions = np.minimum(
        np.cumsum(gates[..., ::-1], axis=-1)[..., ::-1], max_position
    )
    per_position = np.einsum("btnh,hp->bntp", queries.astype("float64"), embeddings)
    low, high = np.floor(positions).astype(int), np.ceil(positions).astype(int)
    weight = positions - low
    below = np.take_along_axis(per_position, low, axis=-1)
    above = np.take_along_axis(per_position, high, axis=-1)
    return below * (1 - weight) + above * weight, positions


@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_checks(tmp_path, bidirectional):
    x = np.random.normal(size=(2, 6, 8)).astype("float32")
    cope = ContextualPosition(max_position=4, bidirectional=bidirectional)
    check_layer(
        lambda **kw: RelativeMultiHeadAttention(
            2, 4, contextual_position=cope.from_config(cope.get_config()), **kw
        ),
        [x, x],
        tmp_path,
        num_weights=2 * 4 + 1,  # q, k, v, output Dense + the embeddings
        expected_output_shape=(2, 6, 8),
        # causal: the padded last token reads all; two-sided: padding counts 0
        call_kwargs={} if bidirectional else {"use_causal_mask": True},
        padding_invariant=bidirectional,
    )


@pytest.mark.parametrize("max_position", [2, 16])
def test_term_is_the_papers_interpolated_count(max_position):
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(2, 5, 3, 4)).astype("float32")  # (B, T, N, H)
    logits = rng.normal(size=(2, 3, 5, 7)).astype("float32") * 2  # (B, N, T, S)
    mask = np.tril(np.ones((5, 7), bool), k=2)[None, None]  # keys j <= i + 2
    cope = ContextualPosition(max_position=max_position)
    cope.build(queries.shape)
    embeddings = rng.normal(size=(4, max_position + 1)).astype("float32")
    cope.embeddings.assign(embeddings)
    got = cope(tf.constant(queries), tf.constant(logits), tf.constant(mask)).numpy()
    want, positions = cope_oracle(queries, logits, mask, embeddings, max_position)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        cope.positions(logits, mask).numpy(), positions, atol=1e-5
    )
    assert positions.max() <= max_position and np.all(positions[..., :1] >= 0)


def test_positions_count_what_the_gates_open_on():
    """Gates open (logit +20) only on marked keys: a position counts marks."""
    marked = np.array([1, 0, 0, 1, 0, 1, 0, 0], bool)
    logits = np.where(marked, 20.0, -20.0)[None, None, None, :].astype("float32")
    logits = np.broadcast_to(logits, (1, 1, 8, 8))
    causal = np.tril(np.ones((8, 8), bool))[None, None]
    positions = ContextualPosition().positions(logits, causal).numpy()[0, 0]
    # The last query: keys from j to 7 hold 3, 2, 2, 2, 1, 1, 0, 0 marks.
    np.testing.assert_allclose(positions[7], [3, 2, 2, 2, 1, 1, 0, 0], atol=1e-6)
    assert np.all(positions[np.triu_indices(8, 1)] == 0)  # masked keys count 0


def test_cached_steps_equal_the_whole_sequence():
    """Cope holds no state: each query recounts over the cached keys."""
    tf.keras.utils.set_random_seed(0)
    attention = RelativeMultiHeadAttention(
        2, 4, contextual_position=ContextualPosition(max_position=3)
    )
    x = tf.random.normal((2, 6, 8))
    full = attention(x, use_causal_mask=True).numpy()
    cache = tf.zeros((2, 2, 8, 2, 4))
    out, cache = attention(x[:, :2], cache=cache, cache_update_index=0)
    steps = [out.numpy()]
    for t in range(2, 6):
        out, cache = attention(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="`max_position` must be an integer >= 1"):
        ContextualPosition(max_position=0)
    with pytest.raises(TypeError, match="`contextual_position` must be a Contextual"):
        RelativeMultiHeadAttention(2, 4, contextual_position="cope")
    with pytest.raises(ValueError, match="`contextual_position` must be None with `q"):
        RelativeMultiHeadAttention(
            2, 4, quantize=True, contextual_position=ContextualPosition()
        )


def two_sided_oracle(queries, logits, mask, embeddings, max_position):
    """The count from the query to the key on each side, loop by loop: a key
    j <= i counts sum_{t=j..i} g_it on table rows 0..P, a key j > i counts
    sum_{t=i..j} g_it on rows P+1..2P+1 (its own embeddings)."""
    gates = sigmoid(logits.astype("float64")) * mask  # (B, N, T, S), T == S
    positions = np.zeros_like(gates)
    size = gates.shape[-1]
    for i in range(size):
        for j in range(size):
            if j <= i:
                count = gates[..., i, j : i + 1].sum(-1)
                positions[..., i, j] = np.minimum(count, max_position)
            else:
                count = gates[..., i, i : j + 1].sum(-1)
                positions[..., i, j] = (
                    max_position + 1 + np.minimum(count, max_position)
                )
    per_position = np.einsum("btnh,hp->bntp", queries.astype("float64"), embeddings)
    low, high = np.floor(positions).astype(int), np.ceil(positions).astype(int)
    weight = positions - low
    below = np.take_along_axis(per_position, low, axis=-1)
    above = np.take_along_axis(per_position, high, axis=-1)
    return below * (1 - weight) + above * weight, positions


@pytest.mark.parametrize("max_position", [2, 16])
def test_two_sided_term_counts_from_the_query_on_each_side(max_position):
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(2, 6, 3, 4)).astype("float32")
    logits = rng.normal(size=(2, 3, 6, 6)).astype("float32") * 2
    mask = np.ones((2, 1, 1, 6), bool)
    mask[1, ..., 4:] = False  # the second row's last two keys are padding
    cope = ContextualPosition(max_position=max_position, bidirectional=True)
    cope.build(queries.shape)
    assert cope.embeddings.shape == (4, 2 * (max_position + 1))
    embeddings = rng.normal(size=(4, 2 * (max_position + 1))).astype("float32")
    cope.embeddings.assign(embeddings)
    got = cope(tf.constant(queries), tf.constant(logits), tf.constant(mask)).numpy()
    want, positions = two_sided_oracle(queries, logits, mask, embeddings, max_position)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        cope.positions(logits, mask).numpy(), positions, atol=1e-5
    )


def test_two_sided_positions_are_the_query_relative_marks():
    """Gates open only on marked keys: before the query a key's position is
    the marks from it to the query, after it the marks from the query to it
    (read from row P + 1 on), whatever the sequence length beyond."""
    marked = np.array([1, 0, 0, 1, 0, 1, 0, 0], bool)
    logits = np.where(marked, 20.0, -20.0)[None, None, None, :].astype("float32")
    logits = np.broadcast_to(logits, (1, 1, 8, 8))
    cope = ContextualPosition(max_position=8, bidirectional=True)
    positions = cope.positions(logits).numpy()[0, 0]
    # Query 4: keys 0..4 hold 2, 1, 1, 1, 0 marks up to it; keys 5..7 after
    # it hold 1, 1, 1 marks from it, read as 9 + 1.
    np.testing.assert_allclose(positions[4], [2, 1, 1, 1, 0, 10, 10, 10], atol=1e-6)
    # The count does not depend on what lies past the farther of i and j.
    short = cope.positions(logits[..., :6, :6]).numpy()[0, 0]
    np.testing.assert_allclose(short[4], positions[4, :6], atol=1e-6)


def test_a_two_sided_count_refuses_a_cache():
    attention = RelativeMultiHeadAttention(
        2, 4, contextual_position=ContextualPosition(bidirectional=True)
    )
    x = tf.random.normal((1, 2, 8))
    with pytest.raises(ValueError, match="`contextual_position` must count one way"):
        attention(x, cache=tf.zeros((1, 2, 4, 2, 4)), cache_update_index=0)
    with pytest.raises(TypeError, match="`bidirectional` must be a bool"):
        ContextualPosition(bidirectional="yes")


def test_a_config_saved_before_the_two_sided_count_loads_one_sided():
    config = ContextualPosition(max_position=3).get_config()
    del config["bidirectional"]  # what a file saved before the argument holds
    assert ContextualPosition.from_config(config).bidirectional is False


@pytest.mark.parametrize("size", [20, 64, 128, 130, 200])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_blocked_running_sum_is_a_cumulative_sum(size, reverse):
    """Long axes are summed in blocks (padded to whole blocks): as NumPy's
    scan; the gradient is the upstream gradient's scan the other way."""
    from keras_posenc.ops.contextual import running_sum

    def scan(x, reverse):
        return np.cumsum(x[..., ::-1], -1)[..., ::-1] if reverse else np.cumsum(x, -1)

    rng = np.random.default_rng(size)
    x = tf.constant(rng.uniform(size=(2, 3, size)).astype("float32"))
    upstream = rng.normal(size=(2, 3, size)).astype("float32")
    for step in (lambda f: f, tf.function):  # eager and in a graph

        @step
        def value_and_gradient(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                sums = running_sum(x, reverse=reverse)
                loss = tf.reduce_sum(sums * upstream)
            return sums, tape.gradient(loss, x)

        got, gradient = value_and_gradient(x)
        np.testing.assert_allclose(got.numpy(), scan(x.numpy(), reverse), rtol=1e-5)
        want = scan(upstream, not reverse)
        np.testing.assert_allclose(gradient.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", [False, True])  # True: XLA's interpolation
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_long_term_and_its_gradient_match_the_plain_scan_and_gathers(
    bidirectional, training
):
    """At 160 keys (blocked sums): the term and its gradients as those of
    the paper's plain cumsum and two gathers, in a graph."""
    rng = np.random.default_rng(2)
    queries = rng.normal(size=(1, 160, 2, 4)).astype("float32")
    logits = rng.normal(size=(1, 2, 160, 160)).astype("float32")
    mask = np.tril(np.ones((160, 160), bool))[None, None]
    cope = ContextualPosition(max_position=8, bidirectional=bidirectional)
    cope.build(queries.shape)
    q, lg = tf.constant(queries), tf.constant(logits)
    m = None if bidirectional else tf.constant(mask)

    def plain(q, lg):  # the same count, summed by tf.cumsum, read by two gathers
        gates = tf.sigmoid(lg) * (1.0 if m is None else tf.cast(m, tf.float32))
        limit = 8.0
        if bidirectional:
            keys = tf.range(160)
            after = tf.cast(keys[None, :] > keys[:, None], tf.float32)
            from_query = tf.cast(keys[None, :] >= keys[:, None], tf.float32)
            before = tf.cumsum(gates * (1 - after), axis=-1, reverse=True)
            beyond = tf.cumsum(gates * from_query, axis=-1)
            pos = (
                tf.minimum(before, limit) * (1 - after)
                + (limit + 1 + tf.minimum(beyond, limit)) * after
            )
        else:
            pos = tf.minimum(tf.cumsum(gates, axis=-1, reverse=True), limit)
        per = tf.einsum("btnh,hp->bntp", q, cope.embeddings)
        low = tf.floor(pos)
        below = tf.gather(per, tf.cast(low, tf.int32), batch_dims=3)
        above = tf.gather(per, tf.cast(tf.math.ceil(pos), tf.int32), batch_dims=3)
        return below * (1 - (pos - low)) + above * (pos - low)

    upstream = tf.constant(rng.normal(size=logits.shape).astype("float32"))
    results = []
    for term in (lambda q, lg: cope(q, lg, m, training=training), plain):

        @tf.function
        def gradients(q, lg, term=term):
            with tf.GradientTape() as tape:
                tape.watch([q, lg])
                loss = tf.reduce_sum(term(q, lg) * upstream)
            return [loss] + tape.gradient(loss, [q, lg, cope.embeddings])

        results.append(gradients(q, lg))
    for got, want in zip(*results):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
