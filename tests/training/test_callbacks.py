import doctest

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import models
from keras_posenc.training.callbacks import PositionWarmup, find_generators

keras = tf.keras


def _model(position="hpn"):
    model = models.build_classifier(
        2, vocab_size=6, hidden_dim=8, num_heads=2, num_layers=2, position=position
    )
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 6, size=(32, 5)), rng.integers(0, 2, size=32)


def _generator_weights(model):
    return [w.numpy().copy() for g in find_generators(model) for w in g.weights]


def _other_weight(model):
    return model.get_layer("logits").kernel.numpy().copy()


@pytest.mark.slow
def test_generators_are_frozen_during_warmup_and_train_after():
    model = _model()
    x, y = _data()
    before, other = _generator_weights(model), _other_weight(model)
    warmup = PositionWarmup(warmup_steps=4)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[warmup], verbose=0)  # 4 steps
    for a, b in zip(before, _generator_weights(model)):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(other, _other_weight(model))  # the rest learned
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[warmup], verbose=0)
    changed = [not np.allclose(a, b) for a, b in zip(before, _generator_weights(model))]
    assert any(changed)


def test_ramp_scales_each_update():
    warmup = PositionWarmup(warmup_steps=2, ramp_steps=3)
    scales = []
    for _ in range(7):
        scales.append(warmup.scale())
        warmup.step += 1
    assert scales == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_ramp_applies_the_scaled_update():
    layer = keras.layers.Dense(1)
    layer.build((None, 1))
    warmup = PositionWarmup(warmup_steps=0, ramp_steps=1, layers=[layer])
    warmup.on_train_begin()
    start = layer.kernel.numpy().copy()
    warmup.on_train_batch_begin(0)
    layer.kernel.assign(start + 1.0)  # what the optimizer did
    warmup.on_train_batch_end(0)
    np.testing.assert_allclose(layer.kernel.numpy(), start + 0.5)


@pytest.mark.parametrize(
    "position,kinds",
    [
        ("hpn", {"HierarchicalPositionNetwork"}),
        ("t5", {"RelativePositionBias"}),
        ("dynamic_bias", {"DynamicPositionBias"}),
        ("recursive", {"RelativeMultiHeadAttention", "Dense"}),
        ("learned", {"LearnedPositionEmbedding"}),
        ("none", set()),
    ],
)
def test_find_generators(position, kinds):
    found = find_generators(_model(position))
    assert {type(layer).__name__ for layer in found} == kinds


def test_docstring_has_an_example():
    """`tests/test_doctests.py` runs it; here, that there is one."""
    tests = doctest.DocTestFinder().find(PositionWarmup, globs={})
    assert tests and tests[0].examples


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"warmup_steps": -1}, ValueError, "`warmup_steps` must be an integer >= 0"),
        ({"warmup_steps": 1, "ramp_steps": 0.5}, TypeError, "`ramp_steps` must be"),
        ({"warmup_steps": 1, "layers": ["x"]}, TypeError, "`layers` must be a list"),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        PositionWarmup(**kwargs)
