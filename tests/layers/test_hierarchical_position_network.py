import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer
from oracles import sinusoid_oracle

from keras_posenc import HierarchicalPositionNetwork, RelativeMultiHeadAttention

keras = tf.keras


@pytest.mark.parametrize("features", ["sinusoid", "conv"])
def test_layer_checks(features, tmp_path):
    x = np.random.normal(size=(2, 5, 6)).astype("float32")
    check_layer(
        lambda **kw: HierarchicalPositionNetwork(
            dim=6, depth=3, num_generators=2, position_features=features, **kw
        ),
        x,
        tmp_path,
        # Two generators: hidden and output Dense (+ a depthwise conv).
        num_weights=2 * (4 if features == "sinusoid" else 6),
        expected_output_shape=(2, 5, 6),
        call_kwargs={"layer_idx": 2},
        # The convolution reads padded neighbours (issue 12 makes it mask-aware).
        padding_invariant=features == "sinusoid",
    )


def test_positional_layer_idx_works_as_in_the_design_document(tmp_path):
    hpn = HierarchicalPositionNetwork(dim=4, depth=2)
    inputs = keras.Input((5, 4))
    model = keras.Model(inputs, hpn(hpn(inputs, 0), 1))
    x = np.random.normal(size=(2, 5, 4)).astype("float32")
    want = hpn(hpn(x, 0), 1).numpy()
    np.testing.assert_allclose(model(x).numpy(), want, atol=1e-6)
    model.save(tmp_path / "hpn.keras")
    loaded = keras.models.load_model(tmp_path / "hpn.keras")
    np.testing.assert_allclose(loaded(x).numpy(), want, atol=1e-6)


def test_each_layer_has_its_own_generator_with_its_own_weights():
    hpn = HierarchicalPositionNetwork(dim=4, depth=3)
    x = np.random.normal(size=(1, 5, 4)).astype("float32")
    outs = [hpn(x, i).numpy() for i in range(3)]
    assert len(hpn.trainable_weights) == 3 * 4
    assert not np.allclose(outs[0], outs[1]) and not np.allclose(outs[1], outs[2])


def test_one_shared_generator_serves_every_layer():
    hpn = HierarchicalPositionNetwork(dim=4, depth=3, num_generators=1)
    x = np.random.normal(size=(1, 5, 4)).astype("float32")
    np.testing.assert_array_equal(hpn(x, 0).numpy(), hpn(x, 2).numpy())
    assert len(hpn.trainable_weights) == 4


def test_groups_share_generators():
    hpn = HierarchicalPositionNetwork(dim=4, depth=4, num_generators=2)
    assert [hpn.generator_index(i) for i in range(4)] == [0, 0, 1, 1]


def test_generated_positions_depend_on_the_index():
    hpn = HierarchicalPositionNetwork(dim=4, depth=1)
    same_token = np.ones((1, 6, 4), "float32")
    out = hpn(same_token, 0).numpy()[0]
    assert not np.allclose(out[0], out[3])


def test_conv_features_derive_position_from_the_boundaries():
    hpn = HierarchicalPositionNetwork(dim=4, depth=1, position_features="conv")
    out = hpn(np.ones((1, 6, 4), "float32"), 0).numpy()[0]
    assert not np.allclose(out[0], out[2])  # the edge sees zero padding
    np.testing.assert_allclose(out[2], out[3], atol=1e-6)  # the middle cannot


def test_position_l2_adds_the_mean_square_of_generated_positions():
    hpn = HierarchicalPositionNetwork(dim=4, depth=1, position_l2=0.5)
    x = np.random.normal(size=(2, 3, 4)).astype("float32")
    pos_info = hpn(x, 0).numpy() - x
    np.testing.assert_allclose(
        float(hpn.losses[-1]), 0.5 * np.mean(pos_info**2), rtol=1e-5
    )


def test_dropout_only_in_training():
    hpn = HierarchicalPositionNetwork(dim=4, depth=1, dropout=0.5)
    x = np.random.normal(size=(2, 8, 4)).astype("float32")
    np.testing.assert_array_equal(hpn(x, 0).numpy(), hpn(x, 0).numpy())
    assert not np.allclose(hpn(x, 0, training=True), hpn(x, 0, training=False))


def _order_model(use_hpn, vocab, length, width):
    tokens = keras.Input((length,), dtype="int32")
    h = keras.layers.Embedding(vocab, width)(tokens)
    if use_hpn:
        h = HierarchicalPositionNetwork(dim=width, depth=1)(h, 0)
    h = h + RelativeMultiHeadAttention(num_heads=2, key_dim=16)(h, h)
    h = keras.layers.Dense(64, "relu")(h)
    return keras.Model(tokens, keras.layers.Dense(vocab)(h))


@pytest.mark.slow
def test_generator_injects_position_that_attention_alone_lacks():
    vocab, length, k = 8, 10, 2
    rng = np.random.default_rng(0)
    x = rng.integers(1, vocab, size=(2500, length))
    y = np.zeros_like(x)
    y[:, k:] = x[:, :-k]  # output the token k places to the left
    accuracy = {}
    for use_hpn in (True, False):
        keras.utils.set_random_seed(1)
        model = _order_model(use_hpn, vocab, length, 32)
        model.compile(
            keras.optimizers.Adam(3e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x[:2000], y[:2000], epochs=10, batch_size=64, verbose=0)
        pred = model.predict(x[2000:], verbose=0).argmax(-1)
        accuracy[use_hpn] = (pred[:, k:] == y[2000:, k:]).mean()
    assert accuracy[True] > 0.9, accuracy
    assert accuracy[False] < 0.5, accuracy


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"dim": 0}, ValueError, "`dim` must be an integer >= 1"),
        ({"depth": 1.5}, TypeError, "`depth` must be an integer"),
        ({"num_generators": 5}, ValueError, r"`num_generators` must be <= depth"),
        ({"position_features": "rope"}, ValueError, "`position_features` must be"),
        ({"kernel_size": 4}, ValueError, "`kernel_size` must be an odd integer"),
        ({"position_l2": -1.0}, ValueError, "`position_l2` must be a finite"),
        ({"dropout": -0.1}, ValueError, "`dropout` must be a number in"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"dim": 4, "depth": 3}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        HierarchicalPositionNetwork(**args)


def test_rejects_a_layer_index_out_of_range():
    hpn = HierarchicalPositionNetwork(dim=4, depth=2)
    with pytest.raises(ValueError, match=r"`layer_idx` must be in \[0, depth=2\)"):
        hpn(np.zeros((1, 3, 4), "float32"), 2)


def test_rejects_a_tensor_layer_index():
    hpn = HierarchicalPositionNetwork(dim=4, depth=2)
    with pytest.raises(TypeError, match="`layer_idx` must be a Python int"):
        hpn(np.zeros((1, 3, 4), "float32"), layer_idx=tf.constant(0))


def test_rejects_an_input_of_the_wrong_width():
    hpn = HierarchicalPositionNetwork(dim=4, depth=2)
    with pytest.raises(ValueError, match="The input width must equal `dim`"):
        hpn(np.zeros((1, 3, 5), "float32"), 0)


def test_generators_follow_the_parent_dtype_policy():
    hpn = HierarchicalPositionNetwork(
        4, 2, position_features="conv", dtype="mixed_float16"
    )
    out = hpn(tf.zeros((1, 5, 4), "float16"), 1)
    assert out.dtype == tf.float16
    for part, layer in hpn.generator(1).items():
        assert layer.dtype_policy.name == "mixed_float16", part
    assert list(hpn.generator(1)) == ["conv", "hidden", "output"]


def fake_quant(x, low, high):
    """TensorFlow's fake quantization to 256 levels, zero nudged onto the grid."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = (high - low) / 255
    zero = np.round(-low / scale)
    low, high = -zero * scale, (255 - zero) * scale
    return np.round((np.clip(x, low, high) - low) / scale) * scale + low


def on_own_range(x):
    """A first training batch's rounding: on the tensor's own range (with 0)."""
    return fake_quant(x, x.min(), x.max())


def weight_grid(w):
    """A kernel on 127 symmetric steps of its largest magnitude."""
    step = np.abs(w).max() / 127
    return np.round(w / step) * step


def generator_oracle(hpn, x, features):
    """NumPy: the quantized generator of layer 0, rounded where int8 rounds."""
    parts = hpn.generator(0)
    hidden_kernel, hidden_bias = (w.numpy() for w in parts["hidden"].weights[:2])
    out_kernel, out_bias = (w.numpy() for w in parts["output"].weights[:2])
    d = x.shape[-1]
    if features == "sinusoid":
        table = sinusoid_oracle(np.arange(x.shape[1]), d, 10000.0)  # (T, D)
        content = on_own_range(x @ weight_grid(hidden_kernel[:d]))
        half = on_own_range(table @ hidden_kernel[d:] + hidden_bias)
        hidden = on_own_range(np.maximum(content + half, 0.0))
    else:
        kernel, bias = (w.numpy() for w in parts["conv"].weights)  # (k, D, 1), (D,)
        kernel = weight_grid(kernel)[:, :, 0]
        padded = np.pad(x, [(0, 0), (1, 1), (0, 0)])  # "same", kernel 3
        conv = sum(padded[:, t : t + x.shape[1]] * kernel[t] for t in range(3))
        conv = on_own_range(conv + bias)
        hidden = conv @ weight_grid(hidden_kernel) + hidden_bias
        hidden = on_own_range(np.maximum(hidden, 0.0))
    pos_info = on_own_range(hidden @ weight_grid(out_kernel) + out_bias)
    return on_own_range(x + pos_info)


@pytest.mark.parametrize("features", ["sinusoid", "conv"])
def test_a_quantized_generator_rounds_where_the_int8_model_rounds(features, tmp_path):
    """Its first training batch sets every range to that tensor's own: the
    sinusoid features' first layer in two halves (content, then the folded
    position table), the convolution on its kernel's int8 grid."""
    x = np.random.default_rng(3).normal(size=(2, 6, 4)).astype("float32")
    plain = HierarchicalPositionNetwork(dim=4, depth=2, position_features=features)
    rounded = HierarchicalPositionNetwork(
        dim=4, depth=2, position_features=features, quantize=True
    )
    plain(x, 0)
    rounded(x, 0)
    for source, target in zip(plain.generator_layers, rounded.generator_layers):
        for value, variable in zip(source.weights, target.weights[:2]):
            variable.assign(value)
    got = rounded(x, 0, training=True).numpy()
    np.testing.assert_allclose(got, generator_oracle(rounded, x, features), atol=1e-5)
    want = plain(x, 0).numpy()
    assert 0 < np.abs(got - want).max() < 0.1  # rounded, near the float layer
    assert rounded.get_config()["quantize"] is True
    model_input = keras.Input((6, 4))
    model = keras.Model(model_input, rounded(model_input, 0))
    model.save(tmp_path / "quantized.keras")  # ranges saved and read back
    loaded = keras.models.load_model(tmp_path / "quantized.keras")
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())


def test_a_quantized_generator_refuses_packed_rows_and_a_state_without_its_range():
    hpn = HierarchicalPositionNetwork(4, 1, quantize=True)
    x = tf.zeros((1, 3, 4))
    with pytest.raises(ValueError, match="`segment_ids` must be None for a layer"):
        hpn(x, 0, segment_ids=tf.ones((1, 3), "int32"))
    conv = HierarchicalPositionNetwork(
        4, 1, position_features="conv", causal=True, quantize=True
    )
    with pytest.raises(TypeError, match="`state_range` must be the ActivationRange"):
        conv(x, 0, state=tf.zeros((1, 8, 4)), start_index=0)
