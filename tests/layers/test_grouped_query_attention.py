"""Grouped-query attention: `num_key_value_heads` key and value heads."""

import numpy as np
import pytest
import tensorflow as tf
from marks import fast_only, split_between_passes

from keras_posenc import RelativeMultiHeadAttention, RotaryEmbedding
from keras_posenc._compat import keras
from keras_posenc.layers import RelativePositionBias
from keras_posenc.models import (
    METHODS,
    POSITION_METHODS,
    build_causal_lm,
    build_encoder,
)

VOCAB = 13


def grouped(kv_heads, heads=4, key_dim=4, **options):
    tf.keras.utils.set_random_seed(0)
    if kv_heads is not None:
        options["num_key_value_heads"] = kv_heads
    return RelativeMultiHeadAttention(heads, key_dim, **options)


def numpy_attention(layer, x, causal=True):
    """The layer's output from its weights: query head n reads key and value
    head n // G, softmax over causal logits."""
    q_kernel, q_bias = (w.numpy() for w in layer.query_dense.weights)
    k_kernel, k_bias = (w.numpy() for w in layer.key_dense.weights)
    v_kernel, v_bias = (w.numpy() for w in layer.value_dense.weights)
    o_kernel, o_bias = (w.numpy() for w in layer.output_dense.weights)
    heads, kv_heads, size = layer.num_heads, layer.num_key_value_heads, layer.key_dim
    b, t, _ = x.shape
    q = (x @ q_kernel + q_bias).reshape(b, t, heads, size)
    k = (x @ k_kernel + k_bias).reshape(b, t, kv_heads, size)
    v = (x @ v_kernel + v_bias).reshape(b, t, kv_heads, size)
    group = np.arange(heads) // (heads // kv_heads)
    logits = np.einsum("btnh,bsnh->bnts", q, k[:, :, group]) / np.sqrt(size)
    if causal:
        logits = np.where(np.tril(np.ones((t, t), bool)), logits, -1e9)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", weights, v[:, :, group])
    return context.reshape(b, t, heads * size) @ o_kernel + o_bias


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_query_heads_read_their_groups_key_and_value_heads(kv_heads):
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    layer = grouped(kv_heads)
    got = layer(x, use_causal_mask=True).numpy()
    assert layer.key_dense.kernel.shape == (8, kv_heads * 4)
    assert layer.value_dense.kernel.shape == (8, kv_heads * 4)
    np.testing.assert_allclose(got, numpy_attention(layer, x), atol=1e-5)


def test_one_key_head_equals_every_head_reading_copies_of_it():
    """A grouped layer is the multi-head layer whose key and value kernels
    repeat each group's columns: same weights, same outputs."""
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    small = grouped(2, position_bias=RelativePositionBias(num_heads=4))
    want = small(x, use_causal_mask=True).numpy()
    full = grouped(4, position_bias=RelativePositionBias(num_heads=4))
    full(x)
    for source, target in zip(small.weights, full.weights):
        value = source.numpy()
        if source.shape != target.shape:  # (8, 2*4) -> (8, 4*4): each head twice
            value = np.repeat(value.reshape(*value.shape[:-1], 2, 4), 2, -2)
            value = value.reshape(target.shape)
        target.assign(value)
    np.testing.assert_allclose(full(x, use_causal_mask=True), want, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"position_bias": RelativePositionBias(num_heads=4, mode="alibi")},
        {"rotary": RotaryEmbedding()},
        {"attention_window": 2},
    ],
)
def test_a_grouped_cache_is_the_groups_heads_and_decodes_as_the_sequence(options):
    x = np.random.default_rng(2).normal(size=(2, 6, 8)).astype("float32")
    layer = grouped(2, **options)
    full = layer(x, use_causal_mask=True).numpy()
    cache = [tf.zeros((2, 2, 6, 4)), tf.zeros((2, 2, 6, 4))]  # (B, N_kv, S, H)
    out, cache = layer(x[:, :3], cache=cache, cache_update_index=0)
    steps = [out.numpy()]
    for t in range(3, 6):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    with pytest.raises(ValueError, match=r"keys must have shape \(B, 2, S_max, 4\)"):
        layer(x[:, :1], cache=[tf.zeros((2, 4, 6, 4))] * 2, cache_update_index=0)


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ({"num_key_value_heads": 3}, ValueError, "a divisor of num_heads=4"),
        ({"num_key_value_heads": 0}, ValueError, "num_key_value_heads"),
        ({"num_key_value_heads": 2.0}, (ValueError, TypeError), "num_key_value_heads"),
        (
            {"num_key_value_heads": 2, "attention_options": {"attention_type": "lsh"}},
            ValueError,
            "keys are the queries' own heads",
        ),
    ],
)
def test_bad_key_value_heads_are_refused(arguments, error, match):
    with pytest.raises(error, match=match):
        RelativeMultiHeadAttention(4, 4, **arguments)


def test_the_option_is_a_keyword_and_round_trips():
    layer = grouped(2)
    assert layer.get_config()["num_key_value_heads"] == 2
    assert layer.get_config()["attention_options"] is None
    clone = RelativeMultiHeadAttention.from_config(layer.get_config())
    assert clone.num_key_value_heads == 2
    assert grouped(None).num_key_value_heads == 4
    with pytest.raises(ValueError, match="keywords of their own"):
        grouped(None, attention_options={"num_key_value_heads": 2})


def small(position, **options):
    tf.keras.utils.set_random_seed(3)
    return build_causal_lm(
        VOCAB, hidden_dim=16, num_layers=2, num_heads=4, position=position, **options
    )


#: Every method but `recursive` (refused), split between the Keras passes:
#: the same TensorFlow ops in either, so together they cache each one once.
GROUPED = split_between_passes(
    [p for p in POSITION_METHODS if not METHODS[p].recursive],
    ("learned", "dynamic_bias", "xpos", "gated", "kerple", "fire", "combined", "fox"),
)


@pytest.mark.parametrize(
    "position",
    fast_only(GROUPED, [p for p in ("t5", "rope", "hybrid") if p in GROUPED]),
)
def test_every_method_caches_exactly_with_one_key_head(position):
    """ALiBi slopes and bias tables stay per query head; the cache holds one
    key and one value head per attention: 1/4 of multi-head's."""
    model = small(position, num_key_value_heads=1)
    dense = small(position)
    x = np.random.default_rng(0).integers(1, VOCAB, (2, 9)).astype("int32")
    cache = model.empty_cache(2, 12)
    kinds = model.cache_kinds()
    for kind, got, full in zip(kinds, cache, dense.empty_cache(2, 12)):
        if kind in ("keys", "values"):
            assert got.shape == (2, 1, 12, 4) and full.shape == (2, 4, 12, 4)
    logits, cache = model.call_with_cache(x[:, :4], cache, 0)
    steps = [logits.numpy()]
    for t in range(4, 9):
        logits, cache = model.call_with_cache(x[:, t : t + 1], cache, t)
        steps.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), model(x), atol=2e-5)
    cached = model.generate([[3, 1, 4], [9, 2]], max_new_tokens=5)
    recomputed = model.generate(
        [[3, 1, 4], [9, 2]], max_new_tokens=5, use_cache=False, compiled_loop=False
    )
    np.testing.assert_array_equal(cached, recomputed)


def test_builders_take_the_keras_hub_name_and_refuse_what_cannot_group(tmp_path):
    model = small("alibi", num_key_value_heads=2)
    assert model.get_config()["num_key_value_heads"] == 2
    path = tmp_path / "lm.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(0).integers(1, VOCAB, (2, 7)).astype("int32")
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
    assert [tuple(s) for s in loaded.cache_shapes(1, 8)][0] == (1, 2, 8, 4)
    encoder = build_encoder(
        vocab_size=VOCAB, hidden_dim=16, num_heads=4, num_key_value_heads=1
    )
    assert encoder(x).shape == (2, 7, 16)
    with pytest.raises(ValueError, match="a divisor of num_heads=4"):
        small("t5", num_key_value_heads=3)
    with pytest.raises(ValueError, match="None for position='recursive'"):
        small("recursive", num_key_value_heads=2)


@pytest.mark.parametrize("position", ["alibi", "rope"])
def test_grouped_streaming_and_packing(position):
    """While the text fits the rolling cache, streaming generates the plain
    cache's tokens; packed rows read each document as alone."""
    from packed_rows import assert_each_document_reads_as_alone

    from keras_posenc.generation import Streaming

    model = small(position, num_key_value_heads=2)
    plain = model.generate([[1, 2, 3]], 8)
    rolling = model.generate([[1, 2, 3]], 8, streaming=Streaming(12, sink_tokens=2))
    np.testing.assert_array_equal(rolling, plain)
    long = model.generate([[1, 2, 3]], 30, streaming=Streaming(6, sink_tokens=2))
    assert long.shape == (1, 33)
    packed = small(position, num_key_value_heads=2, packed=True)
    assert_each_document_reads_as_alone(packed, vocab=VOCAB)
