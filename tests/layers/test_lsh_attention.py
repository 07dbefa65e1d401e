"""LSH attention (`attention_options={"attention_type": "lsh"}`): Reformer's."""

import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer
from oracles import lsh_oracle

from keras_posenc import (
    FireBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    ops,
)

PRODUCERS = {
    "t5": lambda: RelativePositionBias(2),
    "fire": lambda: FireBias(2, hidden_dim=8),  # reads the query position
}


def _lsh(bias=None, **kwargs):
    options = {"attention_type": "lsh", "num_hashes": 2, "bucket_size": 4}
    options.update(
        {
            k: kwargs.pop(k)
            for k in ("attention_type", "num_hashes", "bucket_size", "hash_seed")
            if k in kwargs
        }
    )
    kwargs = {"attention_options": options, **kwargs}
    producer = None if bias is None else PRODUCERS[bias]()
    return RelativeMultiHeadAttention(2, 3, position_bias=producer, **kwargs)


def _oracle(layer, x, bias=None, **kwargs):
    """The layer's output from its weights, by `lsh_oracle`."""
    batch, length, _ = x.shape

    def heads(dense):
        projected = x @ dense.kernel.numpy() + dense.bias.numpy()
        return projected.reshape(batch, length, 2, -1).transpose(0, 2, 1, 3)

    q, v = heads(layer.query_dense), heads(layer.value_dense)
    buckets = ops.lsh.bucket_count(length, layer.bucket_size)
    rotations = ops.lsh.random_rotations(layer.num_hashes, 3, buckets, layer.hash_seed)
    context = lsh_oracle(
        q / np.sqrt(3), q, v, rotations.numpy(), layer.bucket_size, bias=bias, **kwargs
    )
    merged = context.transpose(0, 2, 1, 3).reshape(batch, length, -1)
    out = layer.output_dense
    return merged @ out.kernel.numpy() + out.bias.numpy()


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(2, 9, 4)).astype("float32")
    check_layer(
        lambda **kw: _lsh("t5", **kw),
        x,
        tmp_path,
        num_weights=3 * 2 + 1,  # query, value, output Dense (no key: shared QK) + T5
        expected_output_shape=(2, 9, 4),
    )


@pytest.mark.parametrize("bias", sorted(PRODUCERS))
def test_every_scored_pair_gets_the_bias_of_its_true_positions(bias):
    # Several chunks, causal, with padding: the layer equals the loops of the
    # paper fed the producer's whole (T, T) bias.
    x = np.random.default_rng(0).normal(size=(2, 14, 6)).astype("float32")
    layer = _lsh(bias, num_hashes=3)
    mask = np.arange(14)[None] < np.array([[14], [6]])  # 4 buckets and 2
    got = layer(x, x, use_causal_mask=True, query_mask=mask, value_mask=mask)
    table = layer.position_bias(x, x).numpy()
    table = np.broadcast_to(table, (2, 2, 14, 14))
    want = _oracle(layer, x, table, key_mask=mask, causal=True)
    np.testing.assert_allclose(got.numpy()[mask], want[mask], atol=1e-4)


def test_one_chunk_is_dense_attention_with_shared_keys():
    x = np.random.default_rng(1).normal(size=(2, 7, 6)).astype("float32")
    layer = _lsh("t5", num_hashes=4, bucket_size=7)
    got = layer(x, x).numpy()
    wq, bq = layer.query_dense.kernel.numpy(), layer.query_dense.bias.numpy()
    q = (x @ wq + bq).reshape(2, 7, 2, 3).transpose(0, 2, 1, 3)
    k = q / np.linalg.norm(q, axis=-1, keepdims=True)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(3) + layer.position_bias(x, x)
    logits = np.array(logits)
    logits[..., np.arange(7), np.arange(7)] = -1e5  # itself only when alone
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    wv, bv = layer.value_dense.kernel.numpy(), layer.value_dense.bias.numpy()
    v = (x @ wv + bv).reshape(2, 7, 2, 3).transpose(0, 2, 1, 3)
    merged = (weights @ v).transpose(0, 2, 1, 3).reshape(2, 7, 6)
    out = layer.output_dense
    want = merged @ out.kernel.numpy() + out.bias.numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_fixed_seed_is_deterministic_and_the_seed_chooses_the_buckets():
    x = tf.random.stateless_normal((1, 32, 6), seed=[1, 2])
    layer = _lsh("t5", hash_seed=7)
    first = layer(x, x, use_causal_mask=True).numpy()
    np.testing.assert_array_equal(layer(x, x, use_causal_mask=True).numpy(), first)
    config = layer.get_config()
    config["attention_options"] = {**config["attention_options"], "hash_seed": 8}
    other = RelativeMultiHeadAttention.from_config(config)
    other(x, x)
    other.set_weights(layer.get_weights())
    assert np.abs(other(x, x, use_causal_mask=True).numpy() - first).max() > 1e-4


def test_long_padding_stays_finite_and_never_reaches_real_tokens():
    x = np.random.default_rng(2).normal(size=(1, 16, 6)).astype("float32")
    layer = _lsh("fire")
    mask = np.arange(16)[None] < 5
    out = layer(x, x, query_mask=mask, value_mask=mask).numpy()
    assert np.isfinite(out).all()
    noisy = x.copy()
    noisy[:, 5:] = 1e4  # what padding holds moves no real token
    moved = layer(noisy, noisy, query_mask=mask, value_mask=mask).numpy()
    np.testing.assert_allclose(moved[:, :5], out[:, :5], atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attention_type": "sparse"}, "attention_type.*'dense', 'lsh'"),
        ({"attention_window": 4}, "attention_window.*None with attention_type='lsh'"),
        ({"quantize": True}, "quantize.*False with attention_type='lsh'"),
        ({"num_hashes": 0}, "num_hashes"),
        ({"bucket_size": 0}, "bucket_size.*>= 1"),
    ],
)
def test_rejects_what_lsh_cannot_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _lsh(**kwargs)


def test_rejects_a_non_integer_seed_and_an_overridden_attention():
    with pytest.raises(TypeError, match="hash_seed.*int.*'0'"):
        _lsh(hash_seed="0")

    class Custom(RelativeMultiHeadAttention):
        def compute_attention(self, *args, **kwargs):
            return super().compute_attention(*args, **kwargs)

    with pytest.raises(ValueError, match="attention_type.*'dense' for a subclass"):
        Custom(2, 3, attention_options={"attention_type": "lsh"})


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ({"return_attention_scores": True}, "return_attention_scores.*False"),
        ({"attention_mask": np.ones((1, 6, 6), bool)}, "attention_mask.*None"),
        ({"positions": np.arange(6)}, "positions.*None"),
        ({"segment_ids": np.ones((1, 6), "int32")}, "segment_ids.*None.*documents"),
        ({"cache": np.zeros((1, 2, 6, 2, 3), "float32")}, "cache.*no cached"),
        ({"value": np.zeros((1, 4, 6), "float32")}, "key.*as long as the query"),
    ],
)
def test_rejects_calls_lsh_cannot_honour(call, match):
    x = np.zeros((1, 6, 6), "float32")
    call = {"value": x, **call}
    if "cache" in call:
        call["cache_update_index"] = 0
    with pytest.raises(ValueError, match=match):
        _lsh("t5")(x, **call)


def test_lsh_options_have_one_form_the_attention_options():
    layer = RelativeMultiHeadAttention(
        2,
        3,
        attention_options={
            "attention_type": "lsh",
            "num_hashes": 3,
            "bucket_size": 5,
            "hash_seed": 1,
        },
    )
    assert (layer.num_hashes, layer.bucket_size, layer.hash_seed) == (3, 5, 1)
    assert layer.get_config()["attention_options"] == layer.attention_options
    for flat in ({"attention_type": "lsh"}, {"num_hashes": 3}, {"quantize_cache": 1}):
        with pytest.raises((TypeError, ValueError), match=next(iter(flat))):
            RelativeMultiHeadAttention(2, 3, **flat)
    window = RelativeMultiHeadAttention(2, 3, attention_window=4)
    assert window.attention_window == 4 and window.attention_type == "dense"
    assert window.get_config()["attention_window"] == 4
    with pytest.raises(ValueError, match="keywords of their own"):
        RelativeMultiHeadAttention(2, 3, attention_options={"attention_window": 4})
    with pytest.raises(ValueError, match="attention_options.*Unknown keys"):
        RelativeMultiHeadAttention(
            2, 3, attention_options={"attention_type": "lsh", "buckets": 3}
        )
    with pytest.raises(ValueError, match="attention_options.*None with attention_"):
        RelativeMultiHeadAttention(2, 3, attention_options={"num_hashes": 3})
