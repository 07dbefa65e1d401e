import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer
from marks import kinds_fast

import tflite_export
from keras_posenc import (
    ContextualPosition,
    DynamicPositionBias,
    ForgettingGate,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    models,
)
from keras_posenc.ops import band_mask

keras = tf.keras


def _pair(bias_kind, window):
    """A dense and a block-local attention with the same weights and bias."""
    keras.utils.set_random_seed(1)
    bias = {
        None: None,
        "t5": RelativePositionBias(2, mode="t5", initializer="random_normal"),
        "alibi": RelativePositionBias(2, mode="alibi"),
        "dynamic": DynamicPositionBias(2),
        "grid": DynamicPositionBias(2, coordinate_dim=2, grid_shape=(4, 4)),
    }[bias_kind]
    dense = RelativeMultiHeadAttention(2, 4, position_bias=bias)
    config = dense.get_config()
    config["attention_window"] = window
    local = RelativeMultiHeadAttention.from_config(config)
    return dense, local


@pytest.mark.parametrize("bias_kind", [None, "t5", "alibi", "dynamic", "grid"])
@pytest.mark.parametrize(
    "length,window,causal,padding",
    [
        (16, 4, False, 0),
        (13, 4, False, 3),
        (13, 4, True, 0),
        (10, 3, True, 4),
        (5, 8, False, 1),
        (16, 5, True, 2),
    ],
)
def test_local_equals_dense_with_the_band_mask(
    bias_kind, length, window, causal, padding
):
    dense, local = _pair(bias_kind, window)
    x = np.random.default_rng(length).normal(size=(2, length, 6)).astype("float32")
    mask = np.ones((2, length), bool)
    if padding:
        mask[1, -padding:] = False
    dense(x)
    local(x)
    local.set_weights(dense.get_weights())
    band = tf.broadcast_to(band_mask(length, window, causal)[None], (2, length, length))
    want = dense(x, attention_mask=band, query_mask=mask, value_mask=mask).numpy()
    got = local(x, use_causal_mask=causal, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)


@pytest.mark.parametrize("bias_kind", ["t5", "dynamic", "grid"])
def test_local_bias_gradients_equal_dense_with_the_band_mask(bias_kind):
    # One bias evaluation repeated over the blocks (translation-invariant
    # producers) or one per block (the grid): the same weight gradients.
    dense, local = _pair(bias_kind, 4)
    x = np.random.default_rng(3).normal(size=(2, 13, 6)).astype("float32")
    mask = np.ones((2, 13), bool)
    mask[1, -3:] = False
    dense(x)
    local(x)
    local.set_weights(dense.get_weights())
    band = tf.broadcast_to(band_mask(13, 4, True)[None], (2, 13, 13))
    weights = np.random.default_rng(4).normal(size=(2, 13, 6)).astype("float32")
    gradients = []
    for layer, kwargs in (
        (dense, dict(attention_mask=band)),
        (local, dict(use_causal_mask=True)),
    ):
        with tf.GradientTape() as tape:
            out = layer(x, query_mask=mask, value_mask=mask, **kwargs)
            loss = tf.reduce_sum(tf.where(mask[..., None], out * weights, 0.0))
        variables = layer.position_bias.trainable_weights
        gradients.append(tape.gradient(loss, variables))
    for want, got in zip(*gradients):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_band_mask_sees_neighbour_blocks_only():
    mask = band_mask(6, 2).numpy().astype(int)
    want = [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
    ]
    np.testing.assert_array_equal(mask, want)


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(2, 9, 4)).astype("float32")
    check_layer(
        lambda **kw: RelativeMultiHeadAttention(
            2, 3, position_bias=RelativePositionBias(2), attention_window=4, **kw
        ),
        x,
        tmp_path,
        num_weights=2 * 4 + 1,  # q, k, v, output Dense + the T5 table
        expected_output_shape=(2, 9, 4),
    )


def test_padding_never_changes_real_tokens():
    _, local = _pair("t5", 4)
    real = np.random.normal(size=(1, 7, 6)).astype("float32")
    short = local(real).numpy()
    x = np.concatenate([real, 10 * np.ones((1, 9, 6), "float32")], axis=1)
    mask = np.arange(16)[None] < 7
    out = local(x, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(out[:, :7], short, atol=1e-5)


@pytest.mark.parametrize(
    "position",
    kinds_fast(models.LOCAL_METHODS),
)
def test_every_method_runs_local_and_sees_only_its_band(position):
    model = models.build_token_classifier(
        2,
        vocab_size=10,
        hidden_dim=8,
        num_heads=2,
        num_layers=1,
        position=position,
        attention_window=4,
        position_options={"max_length": 128},
    )
    ids = np.random.randint(1, 10, size=(1, 37))
    out = model(ids).numpy()
    assert out.shape == (1, 37, 2) and np.all(np.isfinite(out))
    assert model(ids[:, :8]).shape == (1, 8, 2)
    # One layer, W=4: token 36 (block 9) reaches blocks 8-10, and through a
    # width-3 position convolution block 7, so blocks 0-6 cannot see it.
    changed = ids.copy()
    changed[0, 36] = ids[0, 36] % 9 + 1
    np.testing.assert_allclose(model(changed).numpy()[:, :28], out[:, :28], atol=1e-6)


@pytest.mark.slow
def test_local_model_exports_to_int8_and_runs_in_tflm():
    model = models.build_classifier(
        3,
        vocab_size=10,
        hidden_dim=16,
        num_heads=2,
        position="t5",
        attention_window=4,
    )
    x = np.random.default_rng(0).integers(0, 10, size=(20, 14))
    report = tflite_export.verify(tflite_export.convert(model, x), None, x[:4])
    assert report.tflm_ok, report.tflm_error
    assert (report.input_dtype, report.output_dtype) == ("int32", "int8")


@pytest.mark.slow
def test_trained_at_length_l_keeps_accuracy_at_8l_and_32l():
    rng = np.random.default_rng(0)

    def task(n, length):  # per token: was the token 3 places to the left a 7?
        x = rng.integers(1, 10, size=(n, length))
        y = np.zeros_like(x)
        y[:, 3:] = x[:, :-3] == 7
        return x, y

    keras.utils.set_random_seed(0)
    model = models.build_token_classifier(
        2,
        vocab_size=10,
        hidden_dim=32,
        num_heads=4,
        num_layers=1,
        position="t5",
        attention_window=8,
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(*task(2048, 16), epochs=6, batch_size=64, verbose=0)
    accuracy = {n: model.evaluate(*task(64, 16 * n), verbose=0)[1] for n in (1, 8, 32)}
    assert accuracy[1] > 0.97, accuracy
    assert accuracy[8] >= 0.95 * accuracy[1] and accuracy[32] >= 0.95 * accuracy[1]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            {"attention_mask": np.ones((1, 6, 6), bool)},
            "`attention_mask` must be None with attention_window=4",
        ),
        (
            {"attention_bias": np.zeros((1, 2, 6, 6))},
            r"`attention_bias` with attention_window=4 must be the band's bias "
            r"\(B or 1, N\*nb, W, 3W\) = \(B or 1, 4, 4, 12\)",
        ),
        ({"positions": np.arange(6)}, "`positions` must be None with attention_w"),
        ({"return_attention_scores": True}, "`return_attention_scores` needs"),
        ({"value": np.zeros((1, 4, 6), "float32")}, "needs self-attention"),
    ],
)
def test_local_rejects_what_needs_the_full_grid(kwargs, match):
    _, local = _pair(None, 4)
    with pytest.raises(ValueError, match=match):
        local(np.zeros((1, 6, 6), "float32"), **kwargs)


def test_rejects_a_bad_window():
    with pytest.raises(ValueError, match="`attention_window` must be an integer >= 1"):
        RelativeMultiHeadAttention(2, 4, attention_window=0)


@pytest.mark.parametrize("length", [2, 4, 7])
def test_a_dynamic_length_shorter_than_the_window_is_exact(length):
    """The band's zero blocks keep W slots when T is unknown until run time."""
    layer = RelativeMultiHeadAttention(
        2, 3, position_bias=RelativePositionBias(2), attention_window=4
    )
    x = tf.random.normal((1, length, 4))
    eager = layer(x, use_causal_mask=True)
    traced = tf.function(
        lambda x: layer(x, use_causal_mask=True),
        input_signature=[tf.TensorSpec((1, None, 4))],
    )
    np.testing.assert_allclose(traced(x), eager, atol=1e-6)


@pytest.mark.parametrize("form", ["causal", "two-sided"])
@pytest.mark.parametrize("length,window,padding", [(13, 4, 3), (16, 5, 0), (5, 8, 1)])
def test_content_positions_on_the_band_equal_dense_with_the_band_mask(
    form, length, window, padding
):
    # The forgetting gate's band bias and CoPE's count over the band are the
    # dense ones under the band mask: every key between a band key and its
    # query is in the band.
    causal = form == "causal"
    keras.utils.set_random_seed(2)
    gates = [
        ForgettingGate(
            2, bidirectional=not causal, initial_bias=0.5, attention_window=w
        )
        for w in (None, window)
    ]
    copes = [ContextualPosition(3, bidirectional=not causal) for _ in range(2)]
    dense = RelativeMultiHeadAttention(2, 4, contextual_position=copes[0])
    local = RelativeMultiHeadAttention(
        2, 4, contextual_position=copes[1], attention_window=window
    )
    x = np.random.default_rng(length).normal(size=(2, length, 6)).astype("float32")
    mask = np.ones((2, length), bool)
    if padding:
        mask[1, -padding:] = False
    for pair in (gates, (dense, local)):
        for layer in pair:
            layer(x)
        pair[1].set_weights(pair[0].get_weights())
    band = tf.broadcast_to(band_mask(length, window, causal)[None], (2, length, length))
    keys = dict(query_mask=mask, value_mask=mask)
    want = dense(x, attention_mask=band, attention_bias=gates[0](x, mask=mask), **keys)
    got = local(
        x, use_causal_mask=causal, attention_bias=gates[1](x, mask=mask), **keys
    )
    np.testing.assert_allclose(got.numpy()[mask], want.numpy()[mask], atol=1e-5)
