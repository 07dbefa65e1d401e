"""The package's quantization-aware copy of a model: structure, weights, training."""

import numpy as np
import pytest
import tensorflow as tf

import keras_posenc
from keras_posenc.layers import (
    ActivationRange,
    GatedPositionFusion,
    LayerNorm,
    QuantizedAdd,
    QuantizedDense,
    RelativeMultiHeadAttention,
)
from keras_posenc.models import build_classifier
from keras_posenc.training.quantization import quantize_model

keras = tf.keras


def classifier(position="t5"):
    keras.utils.set_random_seed(1)
    return build_classifier(
        2,
        vocab_size=12,
        sequence_length=8,
        position=position,
        hidden_dim=16,
        num_heads=2,
        num_layers=1,
    )


def ids(rows=64, seed=0):
    return np.random.default_rng(seed).integers(1, 12, (rows, 8)).astype("int32")


@pytest.mark.parametrize("position", ["learned", "dynamic_bias"])
def test_every_layer_rounds_and_keeps_its_float_weights(position):
    model = classifier(position)
    qat = quantize_model(model)
    kinds = {type(layer) for layer in qat.layers}
    assert keras.layers.Dense not in kinds and keras.layers.Add not in kinds
    assert QuantizedDense in kinds and QuantizedAdd in kinds
    for layer in qat.layers:
        if isinstance(layer, (LayerNorm, RelativeMultiHeadAttention)):
            assert layer.quantize
    ranges = [w for layer in qat.layers for w in layer.weights if "batches" in w.name]
    assert ranges and all(float(w) == 0.0 for w in ranges)  # nothing seen yet
    float_values = [w.numpy() for w in model.weights]
    kept = [
        w.numpy()
        for w in qat.weights
        if w.name.split("/")[-1].split(":")[0] not in ("minimum", "maximum", "batches")
    ]
    assert len(kept) == len(float_values)
    for want, got in zip(float_values, kept):
        np.testing.assert_array_equal(got, want)


def test_with_ranges_seen_the_copy_predicts_as_the_float_model_to_int8_steps():
    model = classifier()
    x = ids()
    qat = quantize_model(model)
    qat(x, training=True)  # ranges from this batch; no weight changes
    ours, theirs = model(x).numpy(), qat(x).numpy()
    span = np.ptp(ours)
    assert np.abs(ours - theirs).max() < 0.03 * span  # a few of 255 levels
    assert np.abs(ours - theirs).max() > 0  # and it does round


@pytest.mark.slow
def test_fits_saves_and_reloads_with_identical_outputs(tmp_path):
    x = ids(128)
    y = (x == 3).any(axis=1).astype("int32")
    qat = quantize_model(classifier())
    qat.compile(
        keras.optimizers.SGD(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = qat.fit(x, y, epochs=2, batch_size=32, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    path = tmp_path / "qat.keras"
    qat.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), qat(x).numpy(), atol=1e-6)
    assert any(
        isinstance(layer, ActivationRange)
        for layer in keras_posenc.utils.nested_layers(loaded)
    )


def test_refuses_layers_whose_rounding_is_not_modelled():
    model = classifier("fox")  # cumulative sums and logarithms: no int8 kernels
    with pytest.raises(ValueError, match="whose int8 rounding is modelled.*gate"):
        quantize_model(model)
    fusion = GatedPositionFusion(max_distance=2, quantize=True)
    x, mask = tf.zeros((1, 4, 8)), tf.constant([[True, True, False, False]])
    with pytest.raises(ValueError, match="`quantize` must be False with a Keras mask"):
        fusion(x, mask=mask)
    keras.utils.set_random_seed(1)
    dynamic = build_classifier(
        2,
        vocab_size=12,
        position="rope",
        hidden_dim=16,
        num_heads=2,
        num_layers=1,
        position_options={
            "rope_type": "dynamic",
            "scaling_factor": 2.0,
            "original_max_position_embeddings": 8,
        },
    )
    with pytest.raises(ValueError, match="attention_0: rope_type='dynamic'"):
        quantize_model(dynamic)


def test_refuses_a_subclassed_model():
    class Plain(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(TypeError, match="`model` must be a functional keras.Model"):
        quantize_model(Plain())


def features_classifier():
    keras.utils.set_random_seed(2)
    return build_classifier(
        2, input_dim=4, sequence_length=8, position="alibi", hidden_dim=16, num_heads=2
    )


def test_a_float_input_is_rounded_by_the_dense_that_reads_it():
    qat = quantize_model(features_classifier())
    rounding_inputs = [
        layer.name
        for layer in qat.layers
        if isinstance(layer, QuantizedDense) and layer.quantize_inputs
    ]
    assert rounding_inputs == ["input_projection"]


def test_refuses_a_float_input_read_by_another_layer():
    inputs = keras.Input((8, 4))
    outputs = keras.layers.Dense(2)(LayerNorm()(inputs))
    with pytest.raises(ValueError, match="reads a float model input"):
        quantize_model(keras.Model(inputs, outputs))
