import numpy as np
import pytest
import tensorflow as tf
from oracles import sinusoid_oracle, t5_bucket_oracle

from keras_posenc import ops


@pytest.mark.parametrize("width", [8, 7, 64])
def test_sinusoid_matches_the_formula(width):
    positions = np.array([0.0, 1.0, 5.0, 37.5, 1000.0])
    got = ops.sinusoid(positions, width, 10000.0).numpy()
    np.testing.assert_allclose(got, sinusoid_oracle(positions, width, 1e4), atol=1e-4)


def test_sinusoid_first_position_is_sin0_cos0():
    got = ops.sinusoid(np.array([0.0]), 6, 10000.0).numpy()
    np.testing.assert_array_equal(got, [[0, 1, 0, 1, 0, 1]])


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    "num_buckets,max_distance", [(32, 128), (16, 64), (64, 256), (8, 20)]
)
def test_t5_buckets_match_mesh_tensorflow(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 301, dtype=np.int32)
    got = ops.t5_relative_position_bucket(
        relative, bidirectional, num_buckets, max_distance
    ).numpy()
    want = t5_bucket_oracle(relative, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() < num_buckets


def test_t5_buckets_known_values():
    # T5 defaults: past keys get buckets 0..15, future keys 16..31; the
    # first 8 distances are exact and far distances share the last bucket.
    rel = np.array([0, -1, -7, -300, 1, 7, 300], dtype=np.int32)
    got = ops.t5_relative_position_bucket(rel, True, 32, 128).numpy()
    np.testing.assert_array_equal(got, [0, 1, 7, 15, 17, 23, 31])
    causal = ops.t5_relative_position_bucket(rel, False, 32, 128).numpy()
    np.testing.assert_array_equal(causal, [0, 1, 7, 31, 0, 0, 0])


def test_clipped_index_clips_to_the_window():
    rel = np.array([-9, -3, 0, 2, 9])
    np.testing.assert_array_equal(
        ops.clipped_relative_index(rel, 3, True).numpy(), [0, 0, 3, 5, 6]
    )
    np.testing.assert_array_equal(
        ops.clipped_relative_index(rel, 3, False).numpy(), [0, 0, 3, 3, 3]
    )


def test_alibi_slopes_for_8_heads_are_powers_of_one_half():
    np.testing.assert_allclose(ops.alibi_slopes(8), [2.0**-k for k in range(1, 9)])


def test_alibi_slopes_for_12_heads_follow_the_paper_rule():
    # 8 slopes of the closest power of two, then every other slope of 16 heads.
    want = [2.0**-k for k in range(1, 9)] + [2.0**-k for k in (0.5, 1.5, 2.5, 3.5)]
    np.testing.assert_allclose(ops.alibi_slopes(12), want, rtol=1e-6)


def test_alibi_bidirectional_heads_tell_left_from_right():
    rel = ops.relative_positions(np.arange(5.0), np.arange(5.0))
    bias = ops.alibi_bias(rel, 2, bidirectional=True).numpy()  # (2, 5, 5)
    m = ops.alibi_slopes(2)
    # Head 0 looks left: the key one step left costs m, one step right 2m.
    assert bias[0, 2, 1] == pytest.approx(-m[0])
    assert bias[0, 2, 3] == pytest.approx(-2 * m[0])
    assert bias[1, 2, 1] == pytest.approx(-2 * m[1])
    assert bias[1, 2, 3] == pytest.approx(-m[1])


def test_alibi_causal_is_minus_slope_times_distance():
    rel = ops.relative_positions(np.arange(4.0), np.arange(4.0))
    bias = ops.alibi_bias(rel, 8, bidirectional=False).numpy()
    want = -ops.alibi_slopes(8)[:, None, None] * np.abs(
        np.arange(4)[None, :] - np.arange(4)[:, None]
    )
    np.testing.assert_allclose(bias, want)


def test_causal_mask_static_and_dynamic_agree():
    import tensorflow as tf

    static = ops.causal_mask(4, 6).numpy()
    dynamic = ops.causal_mask(tf.constant(4), tf.constant(6)).numpy()
    np.testing.assert_array_equal(static, np.tril(np.ones((4, 6), bool)))
    np.testing.assert_array_equal(dynamic, static)


def test_clipped_table_mean_with_a_key_count_per_example():
    table = np.random.default_rng(2).normal(size=(5, 3)).astype("float32")  # M = 2
    counts = np.array([3, 6])
    want = np.stack(
        [
            [
                np.mean([table[np.clip(j - i, -2, 2) + 2] for j in range(n)], axis=0)
                for i in range(6)
            ]
            for n in counts
        ]
    )
    got = ops.clipped_table_mean(table, 6, counts.astype("int32"))
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    "length,keys,block",
    [(5, 8, None), (8, 5, None), (6, 6, None)] + [(7, 5, 10), (5, 8, 16), (6, 6, 1)],
)
def test_toeplitz_and_its_gradient_match_numpy(length, keys, block, monkeypatch):
    # `block`: elements per head the gradient sums at once (7 rows of 5 in
    # blocks of 2 rows with a last of 1; 5 rows of 8 in blocks of 2; 1 row).
    import tensorflow as tf

    from keras_posenc.ops import _toeplitz

    if block is not None:
        monkeypatch.setattr(_toeplitz, "TOEPLITZ_BLOCK", block)

    rng = np.random.default_rng(length * keys)
    row = rng.normal(size=(3, length + keys - 1)).astype("float32")
    upstream = rng.normal(size=(3, length, keys)).astype("float32")
    distance = np.arange(keys)[None, :] - np.arange(length)[:, None] + length - 1
    want_grad = np.zeros_like(row)
    np.add.at(want_grad, (slice(None), distance), upstream)  # sum per diagonal

    def value_and_grad(row_tensor, t, s):
        with tf.GradientTape() as tape:
            tape.watch(row_tensor)
            out = ops.toeplitz(row_tensor, t, s)
            loss = tf.reduce_sum(out * upstream)
        return out, tape.gradient(loss, row_tensor)

    spec = tf.TensorSpec([3, None], tf.float32)
    dynamic = tf.function(  # lengths known only at run time
        lambda r: value_and_grad(r, tf.shape(upstream)[1], tf.shape(upstream)[2]),
        input_signature=[spec],
    )
    xla = tf.function(lambda r: value_and_grad(r, length, keys), jit_compile=True)
    for run in (lambda r: value_and_grad(r, length, keys), dynamic, xla):
        out, grad = run(tf.constant(row))
        np.testing.assert_allclose(out.numpy(), row[:, distance], rtol=1e-6)
        np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-5, atol=1e-5)
    # Both modes sum diagonals with the skew, never the gather's scatter
    # (faster in the attention layer under XLA too).
    graph = tf.function(lambda r: value_and_grad(r, length, keys))
    for fn in (graph, xla):
        kinds = {op.type for op in fn.get_concrete_function(row).graph.get_operations()}
        assert "UnsortedSegmentSum" not in kinds and "Pad" in kinds


#: The ops with a written-out gradient, each on a `(2, 3, 5)` input.
CUSTOM_GRADIENTS = {
    "toeplitz": lambda x: ops.toeplitz(tf.reshape(x, [2, 15])[:, :9], 5, 5),
    "decay_bias": lambda x: ops.forgetting.decay_bias(x),
    "two_sided_decay_bias": lambda x: ops.forgetting.decay_bias(x, -x, floor=-2.0),
    # 40 keys: blocked (past two blocks of `SCAN_BLOCK`), padded to 48
    "running_sum": lambda x: ops.contextual.running_sum(tf.tile(x, [1, 1, 8])),
    "reverse_running_sum": lambda x: ops.contextual.running_sum(
        tf.tile(x, [1, 1, 8]), reverse=True
    ),
}


@pytest.mark.parametrize("name", list(CUSTOM_GRADIENTS))
def test_a_traced_custom_gradient_leaves_no_graph_alive(name):
    """`tf.custom_gradient` in a graph registers its gradient in TensorFlow's
    global registry, which kept every graph traced through it (a model's
    whole training step) alive for the rest of the process. The tape's
    gradient and `tf.gradients` (the registered one) agree."""
    import gc
    import weakref

    x = tf.random.normal([2, 3, 5], seed=1)
    op = CUSTOM_GRADIENTS[name]

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(op(x) ** 2)
        return tape.gradient(loss, x), tf.gradients(loss, x)[0]

    function = tf.function(step)
    on_tape, symbolic = function(x)
    np.testing.assert_allclose(on_tape, symbolic, rtol=1e-6)
    assert np.abs(on_tape.numpy()).max() > 0
    graph = weakref.ref(function.get_concrete_function(x).graph)
    del function
    gc.collect()
    assert graph() is None


def test_head_products_take_each_modes_faster_form_with_one_answer():
    """Transposes and batched matmuls in a plain graph; traced for XLA, the
    logits a matmul of the keys moved to (B, N, H, S) and the context an
    Einsum."""
    q = tf.random.stateless_normal((2, 5, 3, 4), seed=(0, 1))
    k = tf.random.stateless_normal((2, 7, 3, 4), seed=(0, 2))
    w = tf.nn.softmax(tf.random.stateless_normal((2, 3, 5, 7), seed=(0, 3)))
    want = {
        "logits": np.einsum("btnh,bsnh->bnts", q, k),
        "context": np.einsum("bnts,bsnh->btnh", w, k),
    }
    products = {
        "logits": (ops.attention.head_logits, (q, k)),
        "context": (ops.attention.head_context, (w, k)),
    }
    forms = {  # (mode, product): the product's op type, the other one's
        (False, "logits"): ("BatchMatMulV2", "Einsum"),
        (False, "context"): ("BatchMatMulV2", "Einsum"),
        (True, "logits"): ("BatchMatMulV2", "Einsum"),
        (True, "context"): ("Einsum", "BatchMatMulV2"),
    }
    assert not ops.attention.in_xla()  # eager
    for (jit, name), (used, unused) in forms.items():
        product, args = products[name]
        step = tf.function(product, jit_compile=jit)
        graph = step.get_concrete_function(*args).graph
        types = [op.type for op in graph.get_operations()]
        assert used in types and unused not in types, (jit, name, types)
        if jit and name == "logits":  # the keys' own transpose, no adjoint
            (matmul,) = [op for op in graph.get_operations() if op.type == used]
            assert not matmul.get_attr("adj_y")
        np.testing.assert_allclose(step(*args), want[name], atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("length,step", [(1, True), (1, False), (3, False)])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_cached_products_read_heads_first_keys_as_numpy(dtype, length, step, kv_heads):
    """Heads-last queries over a heads-first cache `(B, N_kv, S, H)`: query
    head n reads key head n // G (grouped-query); the step form multiplies
    and sums (no matmul), the others one batched matmul and no transpose of
    the cache."""
    q = tf.random.stateless_normal((2, length, 4, 5), seed=(1, 1))
    k = tf.random.stateless_normal((2, kv_heads, 7, 5), seed=(1, 2))
    v = tf.random.stateless_normal((2, kv_heads, 7, 3), seed=(1, 4))
    w = tf.nn.softmax(tf.random.stateless_normal((2, 4, length, 7), seed=(1, 3)))
    group = np.arange(4) // (4 // kv_heads)  # the key head of each query head
    want_logits = np.einsum("btnh,bnsh->bnts", q, np.asarray(k)[:, group])
    want_context = np.einsum("bnts,bnsh->btnh", w, np.asarray(v)[:, group])
    q, k, v, w = (tf.cast(x, dtype) for x in (q, k, v, w))
    step = step and kv_heads == 4

    def both(q, k, v, w):
        logits = ops.attention.cached_logits(q, k, step)
        return logits, ops.attention.cached_context(w, v, step)

    graph = tf.function(both).get_concrete_function(q, k, v, w).graph
    matmuls = [op for op in graph.get_operations() if op.type == "BatchMatMulV2"]
    assert len(matmuls) == (0 if step else 2)
    cache = {id(t) for t in graph.inputs[1:3]}  # the keys and the values
    moved = [op.inputs[0] for op in graph.get_operations() if op.type == "Transpose"]
    assert not cache & {id(t) for t in moved}  # the cache is read where it lies
    logits, context = tf.function(both)(q, k, v, w)
    assert logits.dtype == dtype and context.dtype == dtype
    atol = 1e-5 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(logits, want_logits, atol=atol, rtol=1e-2)
    np.testing.assert_allclose(context, want_context, atol=atol, rtol=1e-2)


@pytest.mark.parametrize("jit", [False, True])
def test_update_slice_writes_rows_as_dynamic_update_slice(jit):
    """A scatter in a plain graph, XLA's op under XLA: the same tensor."""
    from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

    operand = tf.reshape(tf.range(2 * 2 * 6 * 3, dtype=tf.float32), [2, 2, 6, 3])
    update = -tf.ones([2, 2, 2, 3])

    def write(index):
        return ops.cache.update_slice(operand, update, index, axis=2)

    fn = tf.function(write, jit_compile=jit)
    types = {
        op.type
        for op in fn.get_concrete_function(tf.constant(3)).graph.get_operations()
    }
    assert ("TensorScatterUpdate" in types) != jit
    want = operand.numpy().copy()
    want[:, :, 3:5] = -1
    np.testing.assert_array_equal(fn(tf.constant(3)), want)
    np.testing.assert_array_equal(
        fn(tf.constant(3)), dynamic_update_slice(operand, update, [0, 0, 3, 0])
    )
    with ops.cache.static_decoding():  # exports keep DYNAMIC_UPDATE_SLICE
        graph = tf.function(write).get_concrete_function(tf.constant(3)).graph
    assert "XlaDynamicUpdateSlice" in {op.type for op in graph.get_operations()}
