"""Cached decoding of `RelativeMultiHeadAttention` equals full recompute."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import (
    DynamicPositionBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    ops,
)

HEADS, KEY_DIM, WIDTH, MAX = 2, 4, 6, 12

PRODUCERS = {
    "none": lambda: {},
    "t5": lambda: {"position_bias": RelativePositionBias(HEADS, "t5", 8, 6)},
    "clipped": lambda: {"position_bias": RelativePositionBias(HEADS, "clipped")},
    "alibi": lambda: {"position_bias": RelativePositionBias(HEADS, "alibi")},
    "dynamic": lambda: {"position_bias": DynamicPositionBias(HEADS)},
    "dynamic_grid": lambda: {
        "position_bias": DynamicPositionBias(HEADS, coordinate_dim=2, grid_shape=(3, 4))
    },
    "rope": lambda: {"rotary": RotaryEmbedding()},
    "rope_dynamic": lambda: {
        "rotary": RotaryEmbedding(
            rope_type="yarn", scaling_factor=2.0, original_max_position_embeddings=4
        )
    },
    "xpos_t5": lambda: {
        "rotary": RotaryEmbedding(xpos_scale_base=16.0),
        "position_bias": RelativePositionBias(HEADS, "t5", 8, 6),
    },
}


def make(name, window=None):
    tf.keras.utils.set_random_seed(1)
    return RelativeMultiHeadAttention(
        HEADS, KEY_DIM, attention_window=window, **PRODUCERS[name]()
    )


def decode(layer, x, prefill):
    """Prefill `prefill` tokens, then one token per call; the outputs joined."""
    cache = tf.zeros((x.shape[0], 2, MAX, HEADS, KEY_DIM))
    out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0)
    outputs = [out.numpy()]
    for t in range(prefill, x.shape[1]):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        outputs.append(out.numpy())
    return np.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("name", list(PRODUCERS))
def test_cached_decoding_equals_causal_recompute(name, window):
    """Each producer at the true positions (keras-hub#2861 lost ALiBi here)."""
    layer = make(name, window)
    x = np.random.normal(size=(2, 9, WIDTH)).astype("float32")
    full = layer(x, use_causal_mask=True).numpy()
    cached, cache = decode(layer, x, prefill=4)
    np.testing.assert_allclose(cached, full, atol=1e-5)
    assert cache.shape == (2, 2, MAX, HEADS, KEY_DIM)
    np.testing.assert_array_equal(cache.numpy()[:, :, 9:], 0.0)  # unwritten


def test_a_compiled_step_is_traced_once():
    layer = make("rope")
    x = np.random.normal(size=(1, 6, WIDTH)).astype("float32")
    full = layer(x, use_causal_mask=True).numpy()  # builds the layer
    traces = []

    @tf.function(jit_compile=True)
    def step(token, cache, index):
        traces.append(1)
        return layer(token, cache=cache, cache_update_index=index)

    cache = tf.zeros((1, 2, MAX, HEADS, KEY_DIM))
    outputs = []
    for t in range(6):
        out, cache = step(x[:, t : t + 1], cache, tf.constant(t))
        outputs.append(out.numpy())
    assert len(traces) == 1
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)


def test_a_graph_step_has_no_batched_matmul_and_exports_keep_them():
    """One token in a plain graph: no batched matmul (no transposed cache)."""
    layer = make("t5")
    x = np.random.normal(size=(2, 6, WIDTH)).astype("float32")
    full = layer(x, use_causal_mask=True).numpy()
    step = tf.function(lambda t, c, i: layer(t, cache=c, cache_update_index=i))
    cache = tf.zeros((2, 2, MAX, HEADS, KEY_DIM))
    _, cache = layer(x[:, :5], cache=cache, cache_update_index=0)
    args = (x[:, 5:6], cache, tf.constant(5))
    types = {op.type for op in step.get_concrete_function(*args).graph.get_operations()}
    assert "BatchMatMulV2" not in types and "TensorScatterUpdate" in types
    np.testing.assert_allclose(step(*args)[0], full[:, 5:6], atol=1e-5)
    with ops.cache.static_decoding():
        exported = tf.function(lambda t, c, i: layer(t, cache=c, cache_update_index=i))
        graph = exported.get_concrete_function(*args).graph
    assert "BatchMatMulV2" in {op.type for op in graph.get_operations()}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"cache_update_index": None}, "`cache_update_index` must be given"),
        ({"cache": tf.zeros((1, 2, MAX, 3, KEY_DIM))}, r"`cache` must have shape"),
        ({"value": tf.zeros((1, 2, WIDTH))}, "`value` and `key` must be None"),
        ({"positions": np.arange(2)}, "`positions` must be None with `cache`"),
        ({"return_attention_scores": True}, "`return_attention_scores` must be"),
    ],
)
def test_rejects_what_cached_decoding_cannot_honour(kwargs, match):
    layer = make("t5")
    call = {"cache": tf.zeros((1, 2, MAX, HEADS, KEY_DIM)), "cache_update_index": 0}
    call.update(kwargs)
    with pytest.raises(ValueError, match=match):
        layer(tf.zeros((1, 2, WIDTH)), **call)


def test_an_index_without_a_cache_is_refused():
    with pytest.raises(ValueError, match="`cache_update_index` goes with `cache`"):
        make("none")(tf.zeros((1, 2, WIDTH)), cache_update_index=3)


@pytest.mark.parametrize(
    "index, error",
    [(5, ValueError), (100, ValueError), (-1, ValueError), (2.5, TypeError)],
)
def test_a_cache_index_past_the_cache_is_refused(index, error):
    layer = make("rope")
    x = tf.random.normal((1, 3, WIDTH))
    cache = tf.zeros((1, 2, 6, HEADS, KEY_DIM))
    with pytest.raises(error, match="cache_update_index"):
        layer(x, cache=cache, cache_update_index=index)
    with pytest.raises(error, match="cache_update_index"):
        layer(x, cache=cache, cache_update_index=tf.constant(index))
    _, updated = layer(x, cache=cache, cache_update_index=3)  # the last 3 slots
    assert updated.shape == cache.shape


@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("xpos", [None, 16.0])
@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_exports_read_length_dependent_keys_by_distance(rope_type, xpos, new_tokens):
    """Inside an export the queries turn by distance: the same logits."""
    parameters = {"short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0]}
    rotary = RotaryEmbedding(
        rope_type=rope_type,
        scaling_factor=2.0,
        original_max_position_embeddings=4,
        rope_parameters=parameters if rope_type == "longrope" else None,
        xpos_scale_base=xpos,
    )
    tf.keras.utils.set_random_seed(1)
    layer = RelativeMultiHeadAttention(HEADS, KEY_DIM, rotary=rotary)
    x = tf.random.normal((2, 9, WIDTH))
    cache = tf.zeros((2, 2, 12, HEADS, KEY_DIM))
    _, cache = layer(x[:, :5], cache=cache, cache_update_index=0)
    new = x[:, 5 : 5 + new_tokens]
    want, want_cache = layer(new, cache=cache, cache_update_index=5)
    with ops.cache.static_decoding():
        got, got_cache = layer(new, cache=cache, cache_update_index=5)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_array_equal(got_cache, want_cache)
