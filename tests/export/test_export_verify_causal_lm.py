"""`verify_causal_lm`: size, arena, teacher-forced bits per token, agreement."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.models import build_causal_lm
from tflite_export import convert_causal_lm, verify_causal_lm

VOCAB = 13

pytestmark = pytest.mark.slow  # every test converts a model


def lm():
    tf.keras.utils.set_random_seed(4)
    return build_causal_lm(VOCAB, hidden_dim=16, num_layers=1, num_heads=2)


def ids(rows=3, length=10):
    return np.random.default_rng(2).integers(0, VOCAB, (rows, length))


def bits_oracle(logits, targets):
    """-log2 softmax, written out in NumPy."""
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    picked = np.take_along_axis(probs, targets[..., None], -1)[..., 0]
    return float(np.mean(-np.log2(picked)))


@pytest.fixture(scope="module")
def float32_export():
    """`(model, bytes)`: one float32 LiteRT export, read by several tests."""
    model = lm()
    return model, convert_causal_lm(model, ids(), mode="float32", max_length=12)


def test_float32_litert_reads_the_text_as_keras_does(float32_export):
    (model, model_bytes), tokens = float32_export, ids()
    report = verify_causal_lm(model_bytes, model, tokens)
    want = bits_oracle(model(tokens).numpy()[:, :-1].astype("float64"), tokens[:, 1:])
    assert report.bits_per_token_keras == pytest.approx(want, abs=1e-5)
    assert report.bits_per_token_litert == pytest.approx(want, abs=1e-4)
    assert report.size_bytes == len(model_bytes) and report.cache_length == 12
    assert report.arena_bytes is None and report.greedy_agreement is None  # LiteRT
    assert report.arena is None and report.arena_bytes_32bit is None
    assert "bits per token, LiteRT" in report.table()


def test_an_int8_tflm_export_reports_its_arena_and_agreement():
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model, tokens = lm(), ids()
    model_bytes = convert_causal_lm(model, tokens, max_length=12, target="tflm")
    report = verify_causal_lm(model_bytes, model, tokens)
    assert report.signatures == ["decode"]
    assert report.arena_bytes > 1000
    assert 0.6 * report.arena_bytes < report.arena_bytes_32bit < report.arena_bytes
    assert "| TFLM arena, 32-bit part " in report.table()
    assert 0.0 <= report.greedy_agreement <= 1.0
    # int8 reads the text close to float: within 5% of Keras' bits per token.
    assert report.bits_per_token_litert == pytest.approx(
        report.bits_per_token_keras, rel=0.05
    )


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda b, m: verify_causal_lm(b, object(), ids()), TypeError, "keras_model"),
        (lambda b, m: verify_causal_lm("x", m, ids()), TypeError, "model_bytes"),
        (lambda b, m: verify_causal_lm(b, m, ids(length=13)), ValueError, "cache"),
        (lambda b, m: verify_causal_lm(b, m, ids() + VOCAB), ValueError, "vocab_size"),
        (lambda b, m: verify_causal_lm(b, m, ids()[0]), ValueError, "token_ids"),
    ],
)
def test_bad_arguments_are_refused(call, error, match, float32_export):
    model, model_bytes = float32_export
    with pytest.raises(error, match=match):
        call(model_bytes, model)
