"""`ops.lsh` against a NumPy LSH attention written from the Reformer paper."""

import numpy as np
import pytest
import tensorflow as tf
from oracles import lsh_oracle

from keras_posenc.ops import lsh


def _heads(seed, batch=2, heads=2, length=13, width=4):
    rng = np.random.default_rng(seed)
    q, v = (rng.normal(size=(batch, heads, length, width)) for _ in range(2))
    return q.astype("float32"), v.astype("float32")


def _rotations(num_hashes, width, length, size, seed=0):
    buckets = lsh.bucket_count(length, size)
    return lsh.random_rotations(num_hashes, width, buckets, seed).numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_attention_equals_the_paper_in_loops(causal):
    q, v = _heads(0)
    mask = np.arange(13)[None] < np.array([[13], [7]])  # 4 buckets and 2
    runs = np.array([[1] * 6 + [2] * 7, [1] * 4 + [2] * 9])
    slopes = np.array([0.3, -0.2])
    offsets = np.arange(13)[None, :] - np.arange(13)[:, None]
    bias = np.broadcast_to(slopes[:, None, None] * offsets, (2, 2, 13, 13))

    def pair_bias(q_index, k_index):  # the same bias at each pair's positions
        distance = tf.cast(k_index[..., None, :] - q_index[..., :, None], tf.float32)
        return tf.constant(slopes, tf.float32)[:, None, None, None, None] * distance

    got = lsh.lsh_attention(
        q,
        q,
        v,
        num_hashes=3,
        bucket_size=4,
        seed=0,
        key_mask=mask,
        causal=causal,
        runs=runs,
        pair_bias=pair_bias,
    )
    want = lsh_oracle(q, q, v, _rotations(3, 4, 13, 4), 4, mask, causal, runs, bias)
    real = np.transpose(got.numpy(), (0, 2, 1, 3))[mask]  # padded queries: any
    np.testing.assert_allclose(real, np.transpose(want, (0, 2, 1, 3))[mask], atol=1e-5)


def test_one_chunk_is_dense_shared_qk_attention():
    q, v = _heads(1, length=9)
    got = lsh.lsh_attention(q, q, v, num_hashes=4, bucket_size=9, seed=3)
    unit = q / np.linalg.norm(q, axis=-1, keepdims=True)
    logits = np.einsum("bnth,bnsh->bnts", q, unit)
    logits[..., np.arange(9), np.arange(9)] = lsh.SELF_VALUE
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    want = weights / weights.sum(-1, keepdims=True) @ v
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_the_same_seed_gives_the_same_buckets_in_eager_graph_and_xla():
    q, v = _heads(2, length=24)

    def run(seed):
        return lsh.lsh_attention(q, q, v, 2, 4, seed, causal=True)

    eager = run(5).numpy()
    np.testing.assert_array_equal(run(5).numpy(), eager)
    for compiled in (tf.function(run), tf.function(run, jit_compile=True)):
        np.testing.assert_allclose(compiled(5).numpy(), eager, atol=1e-5)
    assert np.abs(run(6).numpy() - eager).max() > 1e-3  # other rotations


def test_a_query_with_nothing_else_attends_to_itself_and_padding_stays_finite():
    q, v = _heads(3, batch=1, length=6)
    got = lsh.lsh_attention(q, q, v, 2, 2, 0, causal=True)
    np.testing.assert_allclose(got.numpy()[:, :, 0], v[:, :, 0], atol=1e-6)
    nothing = np.zeros((1, 6), bool)  # every key masked: finite, no NaN
    assert np.isfinite(lsh.lsh_attention(q, q, v, 2, 2, 0, key_mask=nothing)).all()


def test_a_dynamic_length_gives_the_static_result():
    q, v = _heads(4, length=11)
    spec = tf.TensorSpec((None, 2, None, 4))
    dynamic = tf.function(
        lambda q, v: lsh.lsh_attention(q, q, v, 2, 3, 0, causal=True),
        input_signature=[spec, spec],
    )
    static = lsh.lsh_attention(q, q, v, 2, 3, 0, causal=True)
    np.testing.assert_allclose(dynamic(q, v).numpy(), static.numpy(), atol=1e-6)


@pytest.mark.parametrize(
    ("length", "size", "buckets"), [(8, 8, 2), (9, 8, 2), (17, 8, 4), (64, 4, 16)]
)
def test_bucket_count_is_the_chunk_count_made_even(length, size, buckets):
    assert lsh.bucket_count(length, size) == buckets
    assert int(lsh.bucket_count(tf.constant(length), size)) == buckets


@pytest.mark.parametrize(("few", "many"), [(2, 8), (4, 6), (2, 3)])
def test_fewer_buckets_rotate_on_the_first_columns_of_more(few, many):
    # Odd sizes too (R H K/2 = 1 * 3 * 1): a counter-based prefix.
    for num_hashes, width in ((2, 4), (1, 3)):
        small = lsh.random_rotations(num_hashes, width, few, 7).numpy()
        large = lsh.random_rotations(num_hashes, width, many, 7).numpy()
        assert small.shape == (num_hashes, width, few // 2)
        np.testing.assert_array_equal(large[:, :, : few // 2], small)


def test_a_row_hashes_into_the_buckets_of_its_real_tokens():
    # K_b = 2 of 5 real tokens, K = 4 of the whole length: each bucket is
    # the argmax over the row's own [xR, -xR], R its first K_b / 2 columns.
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(2, 1, 6, 3)).astype("float32")
    rotations = lsh.random_rotations(2, 3, 4, 0)
    got = lsh.hash_buckets(vectors, rotations, row_buckets=[4, 2]).numpy()
    for row, buckets in ((0, 4), (1, 2)):
        turned = np.einsum("th,rhk->rtk", vectors[row, 0], rotations.numpy())
        turned = turned[..., : buckets // 2]
        want = np.argmax(np.concatenate([turned, -turned], -1), -1)
        np.testing.assert_array_equal(got[row, 0], want)


@pytest.mark.parametrize("causal", [False, True])
def test_padding_never_changes_a_real_tokens_output(causal):
    # 7 real tokens: 2 buckets alone, 6 once padded to 21; chunks of 3.
    q, v = _heads(5, batch=1, length=7)
    alone = lsh.lsh_attention(q, q, v, 3, 3, 0, causal=causal).numpy()
    pad = [(0, 0), (0, 0), (0, 14), (0, 0)]
    noise = np.random.default_rng(6).normal(size=(1, 2, 21, 4)).astype("float32")
    padded_q = np.where(np.arange(21)[:, None] < 7, np.pad(q, pad), noise)
    mask = np.arange(21)[None] < 7
    padded = lsh.lsh_attention(
        padded_q, padded_q, np.pad(v, pad), 3, 3, 0, key_mask=mask, causal=causal
    )
    np.testing.assert_allclose(padded.numpy()[:, :, :7], alone, atol=1e-5)
