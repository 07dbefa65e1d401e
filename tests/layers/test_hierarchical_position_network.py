import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

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
