import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import RecursivePositionUpdate, RelativePositionBias
from keras_posenc.layers import QuantizedDense

keras = tf.keras


def layer_norm(x, norm):
    mean = x.mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + norm.epsilon)
    return y * norm.gamma.numpy() + norm.beta.numpy()


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(2, 5, 6)).astype("float32")
    check_layer(
        lambda **kw: RecursivePositionUpdate(num_heads=2, key_dim=3, ff_dim=5, **kw),
        x,
        tmp_path,
        # Two attentions (4 Dense each), the T5 table, two Dense, the norm.
        num_weights=2 * 4 * 2 + 1 + 2 * 2 + 2,
        expected_output_shape=(2, 5, 6),
    )


def test_stacked_blocks_equal_the_unrolled_formula():
    blocks = [RecursivePositionUpdate(num_heads=2, key_dim=4) for _ in range(3)]
    inputs = keras.Input((6, 8))
    h = inputs
    for block in blocks:
        h = block(h)
    model = keras.Model(inputs, h)
    x = np.random.normal(size=(2, 6, 8)).astype("float32")
    want = x
    for block in blocks:
        attention = block.attention(want, want).numpy()
        update = block.position_update(want).numpy()
        want = layer_norm(want + attention + update, block.norm)
    np.testing.assert_allclose(model(x).numpy(), want, atol=1e-4)


def test_position_update_is_a_narrow_relative_attention_then_feed_forward():
    block = RecursivePositionUpdate(num_heads=2, key_dim=4, position_heads=1)
    x = np.random.normal(size=(1, 5, 8)).astype("float32")
    block(x)
    assert block.position_attention.num_heads == 1
    assert isinstance(block.position_attention.position_bias, RelativePositionBias)
    hidden = block.position_hidden(block.position_attention(x, x)).numpy()
    want = hidden @ block.position_output.kernel.numpy() + block.position_output.bias
    np.testing.assert_allclose(block.position_update(x).numpy(), want, atol=1e-5)


def test_padding_never_changes_real_tokens():
    tokens = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    model = keras.Model(tokens, RecursivePositionUpdate(2, 4)(h))
    short = model(np.array([[3, 4, 5]])).numpy()
    long = model(np.array([[3, 4, 5, 0, 0, 0, 0]])).numpy()
    np.testing.assert_allclose(long[:, :3], short, atol=1e-5)


def test_custom_position_bias_is_used_and_serialized():
    bias = RelativePositionBias(num_heads=1, mode="alibi")
    block = RecursivePositionUpdate(2, 4, position_bias=bias)
    clone = RecursivePositionUpdate.from_config(block.get_config())
    assert clone.position_bias.mode == "alibi"


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"num_heads": 0}, ValueError, "`num_heads` must be an integer >= 1"),
        ({"position_heads": 0}, ValueError, "`position_heads` must be an integer"),
        ({"position_key_dim": 0}, ValueError, "`position_key_dim` must be"),
        ({"ff_dim": "8"}, TypeError, "`ff_dim` must be an integer"),
        ({"dropout": 2.0}, ValueError, "`dropout` must be a number in"),
        ({"position_bias": 3}, TypeError, "`position_bias` must be a Keras layer"),
        ({"epsilon": -1.0}, ValueError, "`epsilon` must be a finite number"),
        ({"quantize": "yes"}, ValueError, "`quantize` must be False, True or 'cache'"),
        ({"quantize": 1}, ValueError, "`quantize` must be False, True or 'cache'"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"num_heads": 2, "key_dim": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        RecursivePositionUpdate(**args)


def test_sublayers_follow_the_parent_dtype_policy():
    block = RecursivePositionUpdate(num_heads=2, key_dim=2, dtype="mixed_bfloat16")
    block(tf.zeros((1, 3, 4), "bfloat16"))
    for layer in (
        block.attention,
        block.position_attention,
        block.position_hidden,
        block.position_output,
        block.norm,
    ):
        assert layer.dtype_policy.name == "mixed_bfloat16", layer.name


def test_a_quantized_block_rounds_every_part_and_reloads(tmp_path):
    """quantize="cache" (a causal LM's blocks): both attentions round, their
    caches too; the feed-forward is QuantizedDense; the ranges reload."""
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    inputs = keras.Input((5, 8))
    block = RecursivePositionUpdate(2, 4, quantize="cache")
    model = keras.Model(inputs, block(inputs))
    plain = RecursivePositionUpdate(2, 4)
    want = plain(x).numpy()
    floats = [w for w in block.weights if "minimum" not in w.name]
    floats = [w for w in floats if "maximum" not in w.name and "batches" not in w.name]
    for source, target in zip(plain.weights, floats, strict=True):
        target.assign(source)
    got = model(x, training=True).numpy()
    assert 0 < np.abs(got - want).max() < 0.1 * np.ptp(want)  # rounded, not garbage
    for attention in (block.attention, block.position_attention):
        assert attention.quantize and attention.quantize_cache
    assert isinstance(block.position_hidden, QuantizedDense)
    assert isinstance(block.position_output, QuantizedDense)
    model.save(tmp_path / "block.keras")
    loaded = keras.models.load_model(tmp_path / "block.keras")
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)
    assert loaded.layers[-1].get_config()["quantize"] == "cache"
