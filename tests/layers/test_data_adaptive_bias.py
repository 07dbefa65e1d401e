"""DAPE: the MLP over each pair's logits and bias, against NumPy oracles."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import (
    DataAdaptiveBias,
    KerpleBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    ops,
)


def leaky(x, slope=0.01):
    return np.where(x > 0, x, slope * x)


def term_oracle(logits, bias, weights):
    """`f([A, B])` pair by pair: `(B, N, T, S)` in, `(B, N, T, S)` out."""
    wa, wb, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    a = np.moveaxis(logits, 1, -1)  # (B, T, S, N)
    b = np.moveaxis(np.broadcast_to(bias, logits.shape), 1, -1)
    pairs = np.concatenate([a, b], -1)  # (B, T, S, 2N), the paper's input
    hidden = leaky(pairs @ np.concatenate([wa, wb], 0) + b1)
    return np.moveaxis(hidden @ w2 + b2, -1, 1)


def random_weights(rng, heads, width):
    shapes = [(heads, width), (heads, width), (width,), (width, heads), (heads,)]
    return [rng.normal(size=s).astype("float32") for s in shapes]


def attention_oracle(x, layer, causal):
    """softmax(QK^T/sqrt(H) + B + f([A, B])) V, projections from the layer."""
    heads, size = layer.num_heads, layer.key_dim
    w = {
        name: [v.numpy() for v in getattr(layer, name).weights]
        for name in ("query_dense", "key_dense", "value_dense", "output_dense")
    }

    def project(name, inputs):
        kernel, bias = w[name]
        out = inputs @ kernel + bias
        return out.reshape(x.shape[0], x.shape[1], heads, size).transpose(0, 2, 1, 3)

    q = project("query_dense", x) / np.sqrt(size)
    k, v = project("key_dense", x), project("value_dense", x)
    logits = q @ k.transpose(0, 1, 3, 2)  # (B, N, T, T)
    dape = layer.position_bias
    static = dape.static_bias(tf.constant(x)).numpy()
    names = ("logit_kernel", "bias_kernel", "hidden_bias", "output_kernel")
    weights = [getattr(dape, name).numpy() for name in (*names, "output_bias")]
    biased = logits + static + term_oracle(logits, static, weights)
    if causal:
        t = x.shape[1]
        biased = np.where(np.tril(np.ones((t, t), bool)), biased, -np.inf)
    probs = np.exp(biased - biased.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    kernel, bias = w["output_dense"]
    return context @ kernel + bias


@pytest.mark.parametrize("batch_of_bias", [1, 3])
def test_the_term_is_the_papers_mlp_of_the_concatenated_pair(batch_of_bias):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 5, 6)).astype("float32")
    bias = rng.normal(size=(batch_of_bias, 4, 5, 6)).astype("float32")
    weights = random_weights(rng, 4, 7)
    got = ops.kernels.data_adaptive_term(logits, tf.constant(bias), weights, 4)
    want = term_oracle(logits, bias, weights)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_folded_band_is_read_head_by_head():
    """Block-local logits `(B, N*nb, W, 3W)`: the MLP mixes the N heads of
    each pair, never two blocks."""
    rng = np.random.default_rng(1)
    heads, blocks = 2, 3
    logits = rng.normal(size=(2, heads * blocks, 4, 12)).astype("float32")
    bias = rng.normal(size=(1, heads * blocks, 4, 12)).astype("float32")
    weights = random_weights(rng, heads, 5)
    got = ops.kernels.data_adaptive_term(logits, tf.constant(bias), weights, heads)

    def unfold(x):  # (b, N*nb, W, 3W) -> (b, N, nb*W, 3W)
        return x.reshape(x.shape[0], heads, blocks * 4, 12)

    want = term_oracle(unfold(logits), unfold(bias), weights)
    np.testing.assert_allclose(got.numpy(), want.reshape(got.shape), atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_adds_the_static_bias_and_its_term(causal):
    tf.keras.utils.set_random_seed(2)
    dape = DataAdaptiveBias(2, KerpleBias(2, bidirectional=not causal), hidden_dim=6)
    layer = RelativeMultiHeadAttention(2, 4, position_bias=dape)
    x = np.random.default_rng(2).normal(size=(2, 7, 8)).astype("float32")
    got = layer(x, x, use_causal_mask=causal).numpy()
    np.testing.assert_allclose(got, attention_oracle(x, layer, causal), atol=1e-5)


def test_the_term_changes_the_output_and_reads_the_logits():
    """Zero output weights: the static bias alone; otherwise the term moves
    the output, and by an amount that depends on the content."""
    tf.keras.utils.set_random_seed(4)
    static = KerpleBias(2, bidirectional=False)
    dape = DataAdaptiveBias(2, static, hidden_dim=6)
    with_dape = RelativeMultiHeadAttention(2, 4, position_bias=dape)
    plain = RelativeMultiHeadAttention(2, 4, position_bias=static)
    x = np.random.default_rng(4).normal(size=(2, 7, 8)).astype("float32")
    with_dape(x, x)
    plain(x, x)
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        getattr(plain, name).set_weights(getattr(with_dape, name).get_weights())
    moved = with_dape(x, x, use_causal_mask=True) - plain(x, x, use_causal_mask=True)
    assert np.abs(moved.numpy()).max() > 1e-3
    dape.output_kernel.assign(tf.zeros_like(dape.output_kernel))
    dape.output_bias.assign(tf.zeros_like(dape.output_bias))
    np.testing.assert_allclose(
        with_dape(x, x, use_causal_mask=True), plain(x, x, use_causal_mask=True)
    )


def test_mixed_precision_keeps_the_term_finite_in_float32():
    policy = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        dape = DataAdaptiveBias(2, KerpleBias(2), hidden_dim=4)
        layer = RelativeMultiHeadAttention(2, 4, position_bias=dape)
        x = 30.0 * np.random.default_rng(5).normal(size=(1, 300, 8))
        out = layer(x.astype("float16"), x.astype("float16"))
        assert np.isfinite(out.numpy()).all()
        assert dape.logit_kernel.dtype == "float32"
    finally:
        tf.keras.mixed_precision.set_global_policy(policy)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(TypeError, match="`static_bias` must be a BiasLayer"):
        DataAdaptiveBias(2, "kerple")
    with pytest.raises(TypeError, match="`static_bias` must be a bias producer"):
        DataAdaptiveBias(2, None)
    inner = DataAdaptiveBias(2, KerpleBias(2))
    with pytest.raises(TypeError, match="does not read the logits"):
        DataAdaptiveBias(2, inner)
    with pytest.raises(ValueError, match="`static_bias` must be a producer of num_"):
        DataAdaptiveBias(3, KerpleBias(2))
    with pytest.raises(ValueError, match="`hidden_dim` must be"):
        DataAdaptiveBias(2, KerpleBias(2), hidden_dim=0)


def test_the_attention_refuses_paths_that_would_skip_the_mlp():
    def dape():
        return DataAdaptiveBias(2, RelativePositionBias(2, "alibi"), hidden_dim=4)

    with pytest.raises(ValueError, match="`position_bias` must be .* quantize=False"):
        RelativeMultiHeadAttention(2, 4, position_bias=dape(), quantize=True)
    with pytest.raises(ValueError, match="`position_bias` must be .*'dense'"):
        RelativeMultiHeadAttention(
            2, 4, position_bias=dape(), attention_options={"attention_type": "lsh"}
        )

    class Custom(RelativeMultiHeadAttention):
        def compute_attention(self, *args, **kwargs):
            return super().compute_attention(*args, **kwargs)

    with pytest.raises(ValueError, match="keeps compute_attention"):
        Custom(2, 4, position_bias=dape())
    layer = RelativeMultiHeadAttention(2, 4, position_bias=dape())
    x = tf.zeros((1, 3, 8))
    with pytest.raises(ValueError, match="`attention_bias` must be None for an "):
        layer(x, x, attention_bias=tf.zeros((1, 2, 3, 3)))
