"""Property tests: random shapes, lengths, masks and positions against invariants."""

import numpy as np
import pytest
import tensorflow as tf

hypothesis = pytest.importorskip("hypothesis", reason="needs hypothesis (dev extras)")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from keras_posenc import (  # noqa: E402
    DynamicPositionBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
)
from keras_posenc.models import (  # noqa: E402
    POSITION_METHODS,
    build_token_classifier,
)

FEW = settings(max_examples=15, deadline=None, derandomize=True)
BIASES = {
    "t5": lambda n: RelativePositionBias(n, "t5", 8, 12),
    "clipped": lambda n: RelativePositionBias(n, "clipped", max_distance=5),
    "alibi": lambda n: RelativePositionBias(n, "alibi"),
    "dynamic": lambda n: DynamicPositionBias(n, hidden_dim=8),
}


@FEW
@given(
    kind=st.sampled_from(sorted(BIASES)),
    heads=st.integers(1, 4),
    t=st.integers(1, 9),
    s=st.integers(1, 9),
    start=st.integers(0, 20),
)
def test_every_bias_is_finite_and_depends_only_on_the_distance(
    kind, heads, t, s, start
):
    bias = BIASES[kind](heads)(
        tf.zeros((1, t, 2)), tf.zeros((1, s, 2)), start_index=start
    )
    bias = bias.numpy()
    assert bias.shape == (1, heads, t, s) and np.all(np.isfinite(bias))
    np.testing.assert_allclose(bias[:, :, 1:, 1:], bias[:, :, :-1, :-1], atol=1e-6)


@FEW
@given(
    t=st.integers(1, 10),
    half=st.integers(1, 6),
    start=st.integers(0, 50),
    interleaved=st.booleans(),
)
def test_rotary_logits_depend_only_on_the_distance(t, half, start, interleaved):
    rope = RotaryEmbedding(interleaved=interleaved)
    content = np.random.default_rng(t).normal(size=(1, 1, 2 * half)).astype("float32")
    x = np.tile(content, (1, t, 1))
    q = rope(x, start_index=start).numpy()[0]
    table = q @ rope(x).numpy()[0].T  # queries at start + i, keys at j
    np.testing.assert_allclose(table[1:, 1:], table[:-1, :-1], atol=1e-4)
    assert np.all(np.isfinite(table))


@FEW
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    heads=st.integers(1, 3),
    window=st.sampled_from([None, 2, 3]),
    kind=st.sampled_from(["t5", "alibi", "dynamic", "rope"]),
    poison=st.sampled_from([0.0, 1e4, np.nan]),
)
def test_padding_never_changes_real_tokens(lengths, heads, window, kind, poison):
    tf.keras.utils.set_random_seed(0)
    extra = (
        {"rotary": RotaryEmbedding()}
        if kind == "rope"
        else {"position_bias": BIASES[kind](heads)}
    )
    layer = RelativeMultiHeadAttention(heads, 2, attention_window=window, **extra)
    width = 8
    x = np.random.default_rng(len(lengths)).normal(size=(len(lengths), width, 4))
    x = x.astype("float32")
    mask = np.arange(width)[None] < np.array(lengths)[:, None]
    clean = layer(x, query_mask=mask, value_mask=mask).numpy()
    padded = np.where(mask[..., None], x, np.float32(poison))
    out = layer(padded, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(out[mask], clean[mask], atol=1e-4)
    assert np.all(np.isfinite(out[mask]))


@FEW
@given(
    prefill=st.integers(1, 6),
    kind=st.sampled_from(["t5", "alibi", "dynamic", "rope"]),
    window=st.sampled_from([None, 3]),
)
def test_cached_decoding_equals_recompute_for_any_prefill(prefill, kind, window):
    tf.keras.utils.set_random_seed(0)
    extra = (
        {"rotary": RotaryEmbedding()}
        if kind == "rope"
        else {"position_bias": BIASES[kind](2)}
    )
    layer = RelativeMultiHeadAttention(2, 4, attention_window=window, **extra)
    x = np.random.default_rng(prefill).normal(size=(1, 7, 6)).astype("float32")
    full = layer(x, use_causal_mask=True).numpy()
    cache = tf.zeros((1, 2, 9, 2, 4))
    outputs = []
    out, cache = layer(x[:, :prefill], cache=cache, cache_update_index=0)
    outputs.append(out.numpy())
    for t in range(prefill, 7):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        outputs.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)


@FEW
@given(t=st.integers(1, 9), kind=st.sampled_from(["t5", "dynamic", "rope"]))
def test_graph_equals_eager_at_any_length(t, kind):
    tf.keras.utils.set_random_seed(0)
    extra = (
        {"rotary": RotaryEmbedding()}
        if kind == "rope"
        else {"position_bias": BIASES[kind](2)}
    )
    layer = RelativeMultiHeadAttention(2, 4, **extra)
    x = np.random.default_rng(t).normal(size=(2, t, 6)).astype("float32")
    eager = layer(x).numpy()
    graph = tf.function(lambda v: layer(v), reduce_retracing=True)(x).numpy()
    np.testing.assert_allclose(graph, eager, atol=1e-5)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    position=st.sampled_from(POSITION_METHODS),
    batch=st.integers(1, 3),
    length=st.integers(1, 9),
    pad=st.integers(1, 5),
    window=st.sampled_from([None, 2, 4]),
    heads=st.sampled_from([1, 2]),
)
def test_every_builder_method_is_finite_padding_invariant_and_graph_equal(
    position, batch, length, pad, window, heads
):
    tf.keras.utils.set_random_seed(length)
    model = build_token_classifier(
        3,
        vocab_size=9,
        hidden_dim=4 * heads,
        num_heads=heads,
        num_layers=1,
        position=position,
        mask_zero=True,
        attention_window=window,
        position_options={"max_length": 16},
    )
    real = np.random.default_rng(length).integers(1, 9, size=(batch, length))
    padded = np.pad(real, [(0, 0), (0, pad)])
    eager = model(padded).numpy()
    assert np.all(np.isfinite(eager))
    np.testing.assert_allclose(eager[:, :length], model(real).numpy(), atol=1e-5)
    graph = tf.function(lambda x: model(x))(tf.constant(padded)).numpy()
    np.testing.assert_allclose(graph, eager, atol=1e-5)
