import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import DecoderAttention, RMSNorm, RotaryEmbedding


def _layer(**kwargs):
    options = dict(
        num_key_value_heads=2,
        query_norm=RMSNorm(),
        key_norm=RMSNorm(),
        rotary=RotaryEmbedding(),
        sliding_window=3,
        attention_sinks=True,
    )
    options.update(kwargs)
    return DecoderAttention(4, 8, **options)


def _rope(x, positions, base=10000.0):
    """Rotate-half RoPE of `x` `(T, N, H)` (HF transformers' form)."""
    half = x.shape[-1] // 2
    inv = base ** -(np.arange(0, 2 * half, 2) / (2 * half))
    angles = positions[:, None] * inv[None]  # (T, H/2)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def _oracle(layer, x, window, scale, eps=1e-6):
    """The layer in NumPy: projections, per-head RMS norms, RoPE, the causal
    sliding window, the sinks in every denominator, the output."""

    def proj(dense, x):
        out = x @ dense.kernel.numpy()
        return out + dense.bias.numpy() if dense.bias is not None else out

    t = x.shape[1]
    q = proj(layer.query_dense, x).reshape(x.shape[0], t, 4, 8)
    k = proj(layer.key_dense, x).reshape(x.shape[0], t, 2, 8)
    v = proj(layer.value_dense, x).reshape(x.shape[0], t, 2, 8)

    def rms(h, norm):
        return h / np.sqrt((h * h).mean(-1, keepdims=True) + eps) * norm.scale.numpy()

    q, k = rms(q, layer.query_norm), rms(k, layer.key_norm)
    pos = np.arange(t, dtype="float64")
    q = np.stack([_rope(row, pos) for row in q]) * scale
    k = np.stack([_rope(row, pos) for row in k])
    k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)  # grouped heads
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    i, j = np.arange(t)[:, None], np.arange(t)[None]
    allowed = (j <= i) & (i - j < window)
    logits = np.where(allowed, logits, -np.inf)
    sink = layer.sinks.numpy()[None, :, None, None]
    top = np.maximum(logits.max(-1, keepdims=True), sink)
    e = np.exp(logits - top)
    weights = e / (e.sum(-1, keepdims=True) + np.exp(sink - top))
    context = np.einsum("bnts,bsnh->btnh", weights, v).reshape(x.shape[0], t, 32)
    return proj(layer.output_dense, context)


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(2, 6, 16)).astype("float32")
    check_layer(
        _layer,
        x,
        tmp_path,
        num_weights=11,  # sinks, two norm scales, 4 kernels and 4 biases
        expected_output_shape=(2, 6, 16),
        call_kwargs={"use_causal_mask": True},
    )


@pytest.mark.parametrize("query_scale", [None, 0.3])
def test_equals_the_numpy_attention(query_scale):
    layer = _layer(query_scale=query_scale)
    x = np.random.normal(size=(2, 9, 16)).astype("float32")
    layer(x, use_causal_mask=True)  # built
    layer.sinks.assign(np.array([0.5, -1.0, 2.0, 0.0], "float32"))
    for norm in (layer.query_norm, layer.key_norm):
        norm.scale.assign(np.random.uniform(0.5, 1.5, (8,)).astype("float32"))
    got = layer(x, use_causal_mask=True).numpy()
    scale = 8**-0.5 if query_scale is None else query_scale
    want = _oracle(layer, x.astype("float64"), 3, scale)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cached_decoding_equals_recompute_across_the_windows_edge():
    layer = _layer()
    x = tf.random.normal((2, 11, 16))
    whole = layer(x, use_causal_mask=True).numpy()
    cache = [tf.zeros((2, 2, 16, 8)), tf.zeros((2, 2, 16, 8))]
    out, cache = layer(x[:, :4], cache=cache, cache_update_index=0)  # prefill
    steps = [out.numpy()]
    for t in range(4, 11):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=1e-5)


def test_a_key_outside_the_window_never_changes_an_output():
    layer = _layer(attention_sinks=False)
    x = np.random.normal(size=(1, 8, 16)).astype("float32")
    y = layer(x, use_causal_mask=True).numpy()
    changed = x.copy()
    changed[:, 2] += 10.0  # keys 2 is out of reach from query 5 on (W = 3)
    z = layer(changed, use_causal_mask=True).numpy()
    np.testing.assert_allclose(z[:, 5:], y[:, 5:], atol=1e-5)
    assert np.abs(z[:, 2:5] - y[:, 2:5]).max() > 1e-3


def test_query_temperature_scales_each_query_by_llamas_factor():
    """A NoPE layer with Llama 4's temperature: the logits of the query at
    position p are `log(floor((p + 1) / F) + 1) a + 1` times the plain ones."""
    temperature = {"floor_scale": 3.0, "attn_scale": 0.5}
    plain = DecoderAttention(2, 4, use_bias=False)
    tempered = DecoderAttention(2, 4, use_bias=False, query_temperature=temperature)
    x = np.random.normal(size=(1, 9, 8)).astype("float32")
    plain(x)
    tempered(x)
    tempered.set_weights(plain.get_weights())
    _, plain_weights = plain(x, use_causal_mask=True, return_attention_scores=True)
    _, weights = tempered(x, use_causal_mask=True, return_attention_scores=True)
    p = np.arange(9.0)
    factor = np.log1p(np.floor((p + 1) / 3.0)) * 0.5 + 1.0
    logits = np.log(np.maximum(plain_weights.numpy(), 1e-30))  # up to a row shift
    want = np.exp(logits * factor[None, None, :, None])
    want = np.where(np.tril(np.ones((9, 9))) > 0, want, 0.0)
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights.numpy(), want, atol=1e-5)
    cache = [tf.zeros((1, 2, 12, 4)), tf.zeros((1, 2, 12, 4))]
    whole = tempered(x, use_causal_mask=True).numpy()
    steps = []
    for t in range(9):
        out, cache = tempered(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=1e-5)


def test_qkv_bias_gives_the_three_input_projections_their_biases():
    layer = DecoderAttention(2, 4, use_bias=False, qkv_bias=True)
    layer(np.ones((1, 3, 8), "float32"))
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        assert dense.bias is not None
    assert layer.output_dense.bias is None


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="`sliding_window` must be unset with"):
        DecoderAttention(2, 4, sliding_window=3, attention_window=4)
    with pytest.raises(ValueError, match="`attention_sinks` must be unset with"):
        DecoderAttention(
            2, 4, attention_sinks=True, attention_options={"attention_type": "lsh"}
        )
    with pytest.raises(ValueError, match="`quantize` must be False with query_norm"):
        DecoderAttention(2, 4, query_norm=RMSNorm(), quantize=True)
    with pytest.raises(ValueError, match="`sliding_window` must be"):
        DecoderAttention(2, 4, sliding_window=0)
    with pytest.raises(ValueError, match="`query_temperature` must be a dict of"):
        DecoderAttention(2, 4, query_temperature={"floor_scale": 8192})
    with pytest.raises(TypeError, match="`query_norm` must be"):
        DecoderAttention(2, 4, query_norm="rms")
    layer = _layer()
    cache = [tf.zeros((1, 2, 6, 8)), tf.zeros((1, 2, 6, 8))]
    with pytest.raises(
        ValueError, match="`sink_tokens` must be None for a layer with a sliding window"
    ):
        layer(tf.zeros((1, 1, 16)), cache=cache, cache_update_index=0, sink_tokens=2)
