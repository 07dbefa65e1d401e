"""Quantization-aware causal LMs: `CausalLM(quantize=True)`, a float LM's copy."""

import os

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import fast_only

import tflite_export
from keras_posenc._compat import keras
from keras_posenc.layers import (
    ActivationRange,
    QuantizedAdd,
    QuantizedDense,
    RelativeMultiHeadAttention,
)
from keras_posenc.models import CausalLM, build_causal_lm
from keras_posenc.models.methods import QUANTIZED_METHODS
from keras_posenc.utils import nested_layers

VOCAB = 11
RANGES = ("minimum", "maximum", "batches")


def small(position="alibi", **kwargs):
    tf.keras.utils.set_random_seed(4)
    options = dict(hidden_dim=8, num_layers=2, num_heads=2, max_length=24)
    options.update(kwargs)
    return build_causal_lm(VOCAB, position=position, **builder_kwargs(**options))


def tokens(batch=2, length=9, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, VOCAB, (batch, length)).astype("int32")


def stepwise(model, x):
    """Logits of `x` read one token at a time through the cache."""
    cache = model.empty_cache(x.shape[0], x.shape[1] + 2)
    logits = []
    for t in range(x.shape[1]):
        step, cache = model.call_with_cache(x[:, t : t + 1], cache, t)
        logits.append(step.numpy())
    return np.concatenate(logits, axis=1)


@pytest.mark.parametrize(
    "position", fast_only(QUANTIZED_METHODS, ("learned",), per_kind=True)
)
def test_a_quantized_lm_decodes_through_its_int8_cache_as_it_recomputes(position):
    model = small(position, num_layers=1, quantize=True)
    x = tokens(length=6)
    model(x, training=True)  # every range from one batch
    full = model(x).numpy()
    np.testing.assert_allclose(stepwise(model, x), full, atol=1e-5)
    # It rounds: the float LM of the same weights differs.
    float_model = small(position, num_layers=1)
    assert np.abs(float_model(x).numpy() - full).max() > 1e-4


def test_every_tensor_of_the_step_passes_a_rounding_layer():
    model = small("t5", quantize=True)
    kinds = {type(layer) for layer in nested_layers(model)}
    assert keras.layers.Dense not in kinds and keras.layers.Add not in kinds
    assert {QuantizedDense, QuantizedAdd, ActivationRange} <= kinds
    attentions = [
        layer for layer in model.layers if isinstance(layer, RelativeMultiHeadAttention)
    ]
    assert attentions and all(a.quantize and a.quantize_cache for a in attentions)


@pytest.mark.parametrize("kwargs", [{"position": "cope"}, {"position": "fox"}])
def test_quantize_is_refused_where_rounding_is_not_modelled(kwargs):
    with pytest.raises(ValueError, match="`quantize` must be False unless position"):
        build_causal_lm(VOCAB, hidden_dim=8, num_heads=2, quantize=True, **kwargs)


def test_quantize_aware_copies_a_float_lm_with_its_weights():
    model = small("learned")
    qat = tflite_export.quantize_aware(model)
    assert isinstance(qat, CausalLM) and qat.get_config()["quantize"]
    assert {**qat.get_config(), "quantize": False} == model.get_config()
    kept = [
        w.numpy()
        for w in qat.weights
        if w.name.split("/")[-1].split(":")[0] not in RANGES
    ]
    want = [w.numpy() for w in model.weights]
    assert len(kept) == len(want)
    for got, expected in zip(kept, want):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="`model` must be a float CausalLM"):
        tflite_export.quantize_aware(qat)


@pytest.mark.slow
def test_a_quantized_lm_fits_saves_and_reloads(tmp_path):
    qat = tflite_export.quantize_aware(small("dynamic_bias", num_layers=1))
    x = tokens(batch=16, length=10)
    qat.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = qat.fit(x[:, :-1], x[:, 1:], epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    path = os.path.join(tmp_path, "qat_lm.keras")
    qat.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_config() == qat.get_config()
    np.testing.assert_allclose(loaded(x), qat(x), atol=1e-6)  # ranges too
    np.testing.assert_allclose(stepwise(loaded, x), qat(x), atol=1e-5)


def test_a_4_bit_lm_keeps_its_kernel_grid_through_a_save(tmp_path):
    """`quantize_aware(kernel_bits=4)`: `CausalLM(quantize="int4")`, whose
    every projection (attention, feed-forward, logits) rounds its kernel to
    `max |W| / 7` steps; loaded from `.keras`, it rebuilds them so."""
    qat = tflite_export.quantize_aware(small(num_layers=1), kernel_bits=4)
    assert qat.get_config()["quantize"] == "int4"
    x = tokens()
    qat(x, training=True)  # the ranges from one batch
    path = os.path.join(tmp_path, "int4_lm.keras")
    qat.save(path)
    loaded = keras.models.load_model(path)
    for model in (qat, loaded):
        dense = [d for d in nested_layers(model) if isinstance(d, QuantizedDense)]
        assert len(dense) == 6 + 1
        assert {d.kernel_bits for d in dense} == {4}
    assert loaded.get_config() == qat.get_config()
    np.testing.assert_allclose(loaded(x), qat(x), atol=1e-6)
    eight = tflite_export.quantize_aware(small(num_layers=1))
    assert {
        d.kernel_bits for d in nested_layers(eight) if isinstance(d, QuantizedDense)
    } == {8}
