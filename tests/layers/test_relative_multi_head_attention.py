import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import (
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    ops,
)

keras = tf.keras


def make(bias_mode=None, **kwargs):
    bias = None
    if bias_mode is not None:
        bias = RelativePositionBias(
            num_heads=2,
            mode=bias_mode,
            num_buckets=8,
            max_distance=6,
            initializer=keras.initializers.RandomNormal(seed=3),
        )
    return RelativeMultiHeadAttention(
        num_heads=2, key_dim=3, position_bias=bias, **kwargs
    )


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_oracle(layer, query, value, bias=None, mask=None):
    """NumPy multi-head attention with the layer's own weights."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (
        (d.kernel.numpy(), d.bias.numpy())
        for d in (
            layer.query_dense,
            layer.key_dense,
            layer.value_dense,
            layer.output_dense,
        )
    )
    n = layer.num_heads

    def heads(x, w, b):
        y = x @ w + b
        return y.reshape(y.shape[0], y.shape[1], n, -1).transpose(0, 2, 1, 3)

    q, k, v = heads(query, wq, bq), heads(value, wk, bk), heads(value, wv, bv)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = np.where(mask[:, None], logits, -np.inf)
    context = softmax(logits) @ v  # (B, N, T, H)
    merged = context.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1)
    return merged @ wo + bo


@pytest.mark.parametrize("bias_mode", [None, "t5", "clipped", "alibi"])
def test_layer_checks(bias_mode, tmp_path):
    query = np.random.normal(size=(2, 5, 4)).astype("float32")
    value = np.random.normal(size=(2, 7, 6)).astype("float32")
    table = 1 if bias_mode in ("t5", "clipped") else 0
    check_layer(
        lambda **kw: make(bias_mode, **kw),
        [query, value],
        tmp_path,
        num_weights=2 * 4 + table,
        expected_output_shape=(2, 5, 4),
    )


def test_without_bias_equals_numpy_attention():
    layer = make()
    query = np.random.normal(size=(2, 4, 5)).astype("float32")
    value = np.random.normal(size=(2, 6, 3)).astype("float32")
    out = layer(query, value).numpy()
    np.testing.assert_allclose(out, attention_oracle(layer, query, value), atol=1e-5)


@pytest.mark.parametrize("bias_mode", ["t5", "alibi"])
def test_with_bias_equals_numpy_attention_plus_bias(bias_mode):
    layer = make(bias_mode)
    x = np.random.normal(size=(2, 6, 4)).astype("float32")
    out = layer(x, x).numpy()
    bias = layer.position_bias(x, x).numpy()
    np.testing.assert_allclose(out, attention_oracle(layer, x, x, bias), atol=1e-5)


def test_call_time_bias_is_added_to_the_logits():
    layer = make()
    x = np.random.normal(size=(1, 4, 4)).astype("float32")
    bias = np.random.normal(size=(1, 2, 4, 4)).astype("float32")
    out = layer(x, x, attention_bias=bias).numpy()
    np.testing.assert_allclose(out, attention_oracle(layer, x, x, bias), atol=1e-5)


def test_causal_mask_equals_numpy_causal_attention():
    layer = make("t5")
    x = np.random.normal(size=(2, 5, 4)).astype("float32")
    out = layer(x, x, use_causal_mask=True).numpy()
    mask = np.tril(np.ones((5, 5), bool))[None]
    bias = layer.position_bias(x, x).numpy()
    want = attention_oracle(layer, x, x, bias, mask)
    np.testing.assert_allclose(out, want, atol=1e-5)


@pytest.mark.parametrize("bias_mode", [None, "t5", "alibi"])
def test_padding_never_changes_real_tokens(bias_mode):
    layer = make(bias_mode)
    real = np.random.normal(size=(1, 4, 4)).astype("float32")
    pad_a = np.random.normal(size=(1, 3, 4)).astype("float32")
    pad_b = 10 * np.random.normal(size=(1, 6, 4)).astype("float32")
    short = layer(real, real).numpy()
    for pad in (pad_a, pad_b):
        x = np.concatenate([real, pad], axis=1)
        mask = np.arange(x.shape[1])[None] < 4
        out = layer(x, x, query_mask=mask, value_mask=mask).numpy()
        np.testing.assert_allclose(out[:, :4], short, atol=1e-5)


def test_keras_mask_from_embedding_is_honoured():
    tokens = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(20, 4, mask_zero=True)(tokens)
    model = keras.Model(tokens, make("t5")(emb, emb))
    layer, embedding = model.layers[-1], model.layers[1]
    short = np.array([[5, 6, 7, 0]])
    long = np.array([[5, 6, 7, 0, 0, 0, 0, 0, 0]])
    real = model(short).numpy()[:, :3]
    np.testing.assert_allclose(model(long).numpy()[:, :3], real, atol=1e-5)
    values = embedding(short).numpy()
    key_mask = np.broadcast_to((short != 0)[:, None, :], (1, 4, 4))
    bias = layer.position_bias(values).numpy()
    want = attention_oracle(layer, values, values, bias, key_mask)
    np.testing.assert_allclose(real, want[:, :3], atol=1e-5)


def test_fully_masked_rows_are_finite():
    layer = make("alibi")
    x = np.random.normal(size=(2, 4, 4)).astype("float32")
    mask = np.zeros((2, 4, 4), bool)
    out = layer(x, x, attention_mask=mask).numpy()
    assert np.all(np.isfinite(out))


def test_return_attention_scores_rows_sum_to_one():
    layer = make("clipped", dropout=0.5)
    x = np.random.normal(size=(2, 5, 4)).astype("float32")
    out, scores = layer(x, x, return_attention_scores=True)
    assert scores.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(scores.numpy().sum(-1), 1.0, atol=1e-5)
    symbolic = keras.Input((5, 4))
    sym_out, sym_scores = layer(symbolic, symbolic, return_attention_scores=True)
    assert tuple(sym_scores.shape) == (None, 2, 5, 5)


def test_accepts_a_combined_2d_input_and_projects_to_output_dim():
    layer = RelativeMultiHeadAttention(num_heads=2, key_dim=4, output_dim=8)
    x = np.random.normal(size=(2, 5, 16)).astype("float32")
    out = layer(x, x).numpy()
    assert out.shape == (2, 5, 8)
    np.testing.assert_allclose(out, attention_oracle(layer, x, x), atol=1e-5)


def test_masked_keys_get_exactly_zero_weight_in_float():
    """As Keras: even when every real logit is very negative (issue 12)."""
    layer = make()
    x = np.random.normal(size=(1, 4, 4)).astype("float32")
    mask = np.array([[True, True, True, False]])
    low = np.full((1, 2, 4, 4), -200.0, "float32")
    _, weights = layer(
        x, x, value_mask=mask, attention_bias=low, return_attention_scores=True
    )
    np.testing.assert_array_equal(weights.numpy()[..., 3], 0.0)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, atol=1e-6)


def test_int8_exports_trace_a_bounded_mask_penalty():
    layer = make()
    x = np.random.normal(size=(1, 4, 4)).astype("float32")
    mask = np.array([[True, True, True, False]])
    assert ops.mask_value() == ops.FLOAT_MASK_VALUE
    with ops.bounded_masking():
        assert ops.mask_value() == -ops.MASK_PENALTY
        _, weights = layer(x, x, value_mask=mask, return_attention_scores=True)
    assert ops.mask_value() == ops.FLOAT_MASK_VALUE
    assert 0.0 < weights.numpy()[..., 3].max() < 1e-10
    assert 10 <= ops.MASK_PENALTY <= 100


def test_a_bounded_mask_stays_below_logits_far_under_its_penalty():
    """Inside an export's bounded masking, a masked key gets at most e^-16
    (~1e-7) of a real key's weight even when every real logit is far below
    -30 (a fixed -30 gave the masked keys nearly all of it)."""
    layer = make()
    x = np.random.normal(size=(1, 4, 4)).astype("float32")
    mask = np.array([[True, True, True, False]])
    low = np.full((1, 2, 4, 4), -200.0, "float32")
    with ops.bounded_masking():
        _, weights = layer(
            x, x, value_mask=mask, attention_bias=low, return_attention_scores=True
        )
    weights = weights.numpy()
    ratio = weights[..., 3] / weights[..., :3].min(axis=-1)  # per query row
    assert ratio.max() <= np.exp(-ops.attention.MASK_GAP) * 1.001
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_heads": 0}, ValueError, "`num_heads` must be an integer >= 1"),
        ({"key_dim": None}, TypeError, "`key_dim` must be an integer >= 1"),
        ({"value_dim": 0}, ValueError, "`value_dim` must be an integer >= 1"),
        ({"output_dim": 2.0}, TypeError, "`output_dim` must be an integer"),
        ({"dropout": 1.0}, ValueError, r"`dropout` must be a number in \[0, 1\)"),
        ({"use_bias": "yes"}, TypeError, "`use_bias` must be a bool"),
        ({"position_bias": "t5"}, TypeError, "`position_bias` must be a Keras layer"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"num_heads": 2, "key_dim": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        RelativeMultiHeadAttention(**args)


def test_key_and_value_of_different_lengths_are_an_error():
    layer = make()
    with pytest.raises(ValueError, match="`key` and `value` must have the same length"):
        layer(tf.zeros((1, 3, 4)), tf.zeros((1, 5, 4)), key=tf.zeros((1, 4, 4)))


def test_projections_are_public_read_only_properties():
    layer = make()
    assert layer.query_dense is None
    layer(tf.zeros((1, 3, 4)), tf.zeros((1, 5, 6)))
    for name, width in [("query", 4), ("key", 6), ("value", 6)]:
        dense = getattr(layer, f"{name}_dense")
        assert isinstance(dense, keras.layers.Dense)
        assert dense.kernel.shape == (width, 6)
    assert layer.output_dense.kernel.shape == (6, 4)
    with pytest.raises(AttributeError):
        layer.query_dense = None


def test_compute_attention_is_the_override_point():
    seen = []

    class Uniform(RelativeMultiHeadAttention):
        def compute_attention(self, query, key, value, bias, mask, training=None):
            seen.append((tuple(query.shape), tuple(key.shape)))
            weights = tf.ones_like(tf.matmul(query, key, transpose_b=True))
            weights /= tf.reduce_sum(weights, -1, keepdims=True)
            return tf.matmul(weights, value), weights

    x = np.random.normal(size=(2, 5, 4)).astype("float32")
    layer = Uniform(num_heads=2, key_dim=3)
    out = layer(x, x).numpy()
    v = x @ layer.value_dense.kernel.numpy() + layer.value_dense.bias.numpy()
    # Uniform weights: every query sees the mean value.
    mean = v.mean(1, keepdims=True) @ layer.output_dense.kernel.numpy()
    want = np.broadcast_to(mean + layer.output_dense.bias.numpy(), out.shape)
    np.testing.assert_allclose(out, want, atol=1e-5)
    assert seen == [((2, 2, 5, 3), (2, 2, 5, 3))]
    # Block-local: the same method runs on the band, 3 blocks of W=2, 3W keys.
    Uniform(num_heads=2, key_dim=3, attention_window=2)(x, x)
    assert seen[-1] == ((2, 6, 2, 3), (2, 6, 6, 3))
    # Cached decoding: heads-first too, the queries against every cached slot.
    cache = tf.zeros((2, 2, 8, 2, 3))
    _, cache = layer(x[:, :3], cache=cache, cache_update_index=0)
    assert seen[-1] == ((2, 2, 3, 3), (2, 2, 8, 3))


def rotary_attention_oracle(layer, x, positions, key_x=None, key_positions=None):
    """NumPy attention whose projected q, k are rotated by the layer's rotary."""
    key_x = x if key_x is None else key_x
    key_positions = positions if key_positions is None else key_positions
    n = layer.num_heads

    def heads(inputs, dense):
        y = inputs @ dense.kernel.numpy() + dense.bias.numpy()
        return y.reshape(y.shape[0], y.shape[1], n, -1)  # (B, L, N, H)

    rope = layer.rotary
    q = rope(heads(x, layer.query_dense), positions=positions).numpy()
    k = rope(heads(key_x, layer.key_dense), positions=key_positions).numpy()
    v = heads(key_x, layer.value_dense)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    context = softmax(logits) @ v
    merged = context.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return merged @ layer.output_dense.kernel.numpy() + layer.output_dense.bias.numpy()


def make_rotary(**kwargs):
    return RelativeMultiHeadAttention(
        num_heads=2, key_dim=4, rotary=RotaryEmbedding(), **kwargs
    )


def test_rotary_rotates_projected_queries_and_keys(tmp_path):
    layer = make_rotary()
    x = np.random.normal(size=(2, 6, 5)).astype("float32")
    out = layer(x).numpy()
    want = rotary_attention_oracle(layer, x, np.arange(6))
    np.testing.assert_allclose(out, want, atol=1e-5)
    check_layer(
        make_rotary,
        [x, x],
        tmp_path,
        num_weights=2 * 4,
        expected_output_shape=(2, 6, 5),
    )


def test_rotary_honours_start_index_against_cached_keys():
    layer = make_rotary()
    x = np.random.normal(size=(1, 9, 5)).astype("float32")
    full = layer(x).numpy()
    tail = layer(x[:, 6:], x, start_index=6).numpy()
    np.testing.assert_allclose(tail, full[:, 6:], atol=1e-5)


def test_rotary_attention_is_shift_invariant():
    layer = make_rotary()
    x = np.random.normal(size=(2, 5, 5)).astype("float32")
    base = layer(x).numpy()
    shifted = layer(x, positions=np.arange(100, 105), key_positions=np.arange(100, 105))
    np.testing.assert_allclose(shifted.numpy(), base, atol=1e-4)


def test_rotary_with_a_window_equals_dense_with_the_band_mask():
    local = make_rotary(attention_window=3)
    x = np.random.normal(size=(2, 8, 5)).astype("float32")
    out = local(x, use_causal_mask=True).numpy()
    dense = make_rotary()
    dense(x)
    dense.set_weights(local.get_weights())
    band = ops.band_mask(8, 3, causal=True).numpy()
    want = dense(x, attention_mask=np.broadcast_to(band, (2, 8, 8))).numpy()
    np.testing.assert_allclose(out, want, atol=1e-5)


def test_rotary_must_be_a_rotary_embedding():
    with pytest.raises(TypeError, match="`rotary` must be a RotaryEmbedding or None"):
        make_rotary().__class__(2, 4, rotary=RelativePositionBias(2))


def test_a_rank_4_input_is_refused_not_folded_into_the_batch():
    with pytest.raises(ValueError, match=r"`query` must have rank 3, \(B, L, D\)"):
        make()(tf.zeros((2, 5, 8, 3)))


def test_a_bias_with_another_head_count_is_refused_at_construction():
    with pytest.raises(ValueError, match="`position_bias` must be a producer of "):
        RelativeMultiHeadAttention(2, 4, position_bias=RelativePositionBias(3))


@pytest.mark.parametrize("window", [None, 2])
def test_nan_in_padded_tokens_never_reaches_real_tokens(window):
    layer = make("t5", attention_window=window)
    x = np.random.normal(size=(2, 6, 4)).astype("float32")
    mask = np.arange(6)[None] < np.array([[4], [6]])
    clean = layer(x, x, query_mask=mask, value_mask=mask).numpy()
    poisoned = x.copy()
    poisoned[0, 4:] = np.nan
    out = layer(poisoned, poisoned, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(out[mask], clean[mask], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("bias_mode", ["t5", "rope"])
def test_quantized_layer_checks(bias_mode, tmp_path):
    query = np.random.normal(size=(2, 5, 4)).astype("float32")
    value = np.random.normal(size=(2, 7, 6)).astype("float32")
    table = 1 if bias_mode == "t5" else 0
    points = 6 if bias_mode == "t5" else 11  # rope: 6 rotary, no scaled_query
    check_layer(
        lambda **kw: make_quantized(bias_mode, **kw),
        [query, value],
        tmp_path,
        num_weights=4 * (2 + 3) + points * 3 + table,  # QuantizedDense x4
        expected_output_shape=(2, 5, 4),
    )


def make_quantized(mode, **kwargs):
    """A quantized layer with a T5 bias, or RoPE ("rope")."""
    kwargs = {"quantize": True, **kwargs}
    if mode == "rope":
        return make_rotary(**kwargs)
    return make(mode, **kwargs)


@pytest.mark.parametrize("mode", ["t5", "rope"])
def test_quantized_attention_stays_near_float_once_ranges_are_learned(mode):
    x = np.random.default_rng(2).normal(size=(4, 6, 8)).astype("float32")
    float_layer = make(mode) if mode == "t5" else make_rotary()
    want = float_layer(x).numpy()
    quantized = make_quantized(mode)
    quantized(x)  # build, then share the float weights
    ranges = ("minimum", "maximum", "batches")
    floats = [
        w
        for w in quantized.weights
        if w.name.split("/")[-1].split(":")[0] not in ranges
    ]
    for source, target in zip(float_layer.weights, floats, strict=True):
        target.assign(source)
    got = quantized(x, training=True).numpy()
    span = np.ptp(want)
    assert np.abs(got - want).max() < 0.1 * span  # int8 rounding, not garbage
    assert np.abs(got - want).max() > 0  # it rounds


def test_quantized_xpos_rounds_the_key_tables_on_the_bound_trained_on():
    """xPos' key scales zeta_i^(-n / base) grow with n: the keys' cos and sin
    tables round on the largest |entry| of the lengths trained on (an
    oracle from the xPos formula), and a longer text saturates there."""
    base, width = 4.0, 4
    layer = RelativeMultiHeadAttention(
        2, width, rotary=RotaryEmbedding(xpos_scale_base=base), quantize=True
    )
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    layer(x, training=True)
    slots = np.arange(0, width, 2)
    zeta = (slots / width + 0.4) / 1.4
    angles = np.arange(6)[:, None] * 10000.0 ** (-slots / width)  # (T, H/2)
    scales = zeta ** (-np.arange(6)[:, None] / base)
    want = np.abs(np.stack([np.cos(angles), np.sin(angles)]) * scales).max()
    bound = float(layer.rounding["key_table"].maximum.numpy())
    np.testing.assert_allclose(bound, want, rtol=1e-5)
    assert want > 1.5  # the keys' scales did grow past cos and sin's own 1
    longer = np.random.default_rng(1).normal(size=(2, 12, 8)).astype("float32")
    out = layer(longer).numpy()
    assert np.isfinite(out).all()
    assert float(layer.rounding["key_table"].maximum.numpy()) == bound  # inference


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"rotary": RotaryEmbedding(rotary_dim=2)}, "rotary_dim=2 .must rotate all"),
        (
            {
                "rotary": RotaryEmbedding(
                    rope_type="dynamic",
                    scaling_factor=2.0,
                    original_max_position_embeddings=8,
                )
            },
            "rope_type=.dynamic.",
        ),
        ({"rotary": RotaryEmbedding(coordinate_dim=2)}, "coordinate_dim=2"),
        ({"attention_options": {"attention_type": "lsh"}}, "attention_type='lsh'"),
    ],
)
def test_quantize_refuses_what_it_does_not_model(kwargs, reason):
    with pytest.raises(ValueError, match=f"`quantize` must be False .*{reason}"):
        RelativeMultiHeadAttention(num_heads=2, key_dim=4, quantize=True, **kwargs)


def test_quantized_attention_refuses_a_cache_without_its_range():
    layer = make(quantize=True)
    x = tf.ones((1, 1, 6))
    cache = tf.zeros((1, 2, 4, 2, 3))
    with pytest.raises(ValueError, match="`cache` must be None for a layer with"):
        layer(x, cache=cache, cache_update_index=0)


def test_quantize_takes_three_values():
    with pytest.raises(ValueError, match="`quantize` must be False, True or 'cache'"):
        RelativeMultiHeadAttention(num_heads=2, key_dim=3, quantize="keys")


def test_a_quantized_cache_holds_values_of_their_own_size():
    """Keys and values are two caches: `value_dim` need not be `key_dim`
    (keras-hub's one-tensor form still needs it)."""
    layer = RelativeMultiHeadAttention(2, 3, value_dim=5, quantize="cache")
    x = tf.random.stateless_normal((1, 4, 6), seed=(0, 1))
    layer(x, use_causal_mask=True, training=True)  # the ranges of one batch
    full = layer(x, use_causal_mask=True).numpy()
    cache = [tf.zeros((1, 2, 4, 3)), tf.zeros((1, 2, 4, 5))]
    steps = []
    for t in range(4):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    with pytest.raises(ValueError, match="`value_dim` must equal key_dim"):
        layer(x[:, :1], cache=tf.zeros((1, 2, 4, 2, 3)), cache_update_index=0)


def test_a_quantized_cache_has_one_form_quantize_cache():
    layer = RelativeMultiHeadAttention(2, 3, quantize="cache")
    assert layer.quantize == "cache" and layer.quantize_cache
    assert layer.get_config()["quantize"] == "cache"
    assert "quantize_cache" not in layer.get_config()
    with pytest.raises((TypeError, ValueError), match="quantize_cache"):
        RelativeMultiHeadAttention(2, 3, quantize=True, quantize_cache=True)


@pytest.mark.parametrize("mode", ["t5", "rope"])
def test_a_quantized_cache_decodes_as_the_sequence_recomputes(mode):
    """Keys and values each on their cache's own range, in training and
    decoding (RoPE: the rotated keys)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 6)).astype("float32")
    layer = make_quantized(mode, quantize="cache")
    layer(x, use_causal_mask=True, training=True)  # the ranges of one batch
    full = layer(x, use_causal_mask=True).numpy()
    cache = [tf.zeros((2, 2, 5, layer.key_dim)) for _ in range(2)]
    steps = []
    for t in range(5):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy()[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)
    ranges = []
    for cached, name in zip(cache, ("cache_key", "cache_value")):
        point = layer.rounding[name]  # every cached value on its int8 grid
        low, high = float(point.minimum), float(point.maximum)
        grid = cached.numpy() / ((high - low) / 255)  # the grid holds 0 exactly
        np.testing.assert_allclose(grid, np.round(grid), atol=1e-3)
        assert len(np.unique(np.round(grid))) > 10
        ranges.append((low, high))
    assert ranges[0] != ranges[1]  # keys and values: a range each
