import numpy as np
import pytest
import tensorflow as tf

import keras_posenc
from keras_posenc import RotaryEmbedding, models, utils

keras = tf.keras


def test_package_classes_are_the_registered_layers():
    classes = utils.package_classes()
    for name in ("RelativeMultiHeadAttention", "RotaryEmbedding", "LayerNorm"):
        assert classes[name] is getattr(keras_posenc, name)
        found = keras.utils.get_registered_object(f"keras_posenc>{name}")
        assert found is classes[name]


def test_nested_layers_reach_sublayers_once():
    model = models.build_encoder(
        vocab_size=9, hidden_dim=8, num_heads=2, num_layers=1, position="recursive"
    )
    found = utils.nested_layers(model)
    assert len(found) == len({id(layer) for layer in found})
    names = {layer.name for layer in found}
    assert {"recursive_0", "position_attention", "position_bias", "query"} <= names


def rope_model():
    return models.build_encoder(
        vocab_size=9, hidden_dim=16, num_heads=2, num_layers=2, position="rope"
    )


def test_set_rope_scaling_switches_every_rotary_and_keeps_weights(tmp_path):
    model = rope_model()
    ids = np.random.randint(1, 9, size=(2, 12))
    weights = [w.copy() for w in model.get_weights()]
    before = model(ids).numpy()
    count = utils.set_rope_scaling(model, rope_type="linear", scaling_factor=3.0)
    assert count == 2
    ropes = [
        layer
        for layer in utils.nested_layers(model)
        if isinstance(layer, RotaryEmbedding)
    ]
    assert [(r.rope_type, r.scaling_factor) for r in ropes] == [("linear", 3.0)] * 2
    for old, new in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    after = model(ids).numpy()
    assert not np.allclose(before, after)
    # The switched rotary equals a fresh linear one.
    x = np.random.normal(size=(1, 12, 2, 8)).astype("float32")
    fresh = RotaryEmbedding(rope_type="linear", scaling_factor=3.0)
    np.testing.assert_allclose(ropes[0](x).numpy(), fresh(x).numpy(), atol=1e-6)
    model.save(tmp_path / "switched.keras")
    loaded = keras.models.load_model(tmp_path / "switched.keras")
    np.testing.assert_allclose(loaded(ids).numpy(), after, atol=1e-5)


def test_set_rope_scaling_checks_everything_before_changing_anything():
    model = rope_model()
    with pytest.raises(ValueError, match="`original_max_position_embeddings` must be"):
        utils.set_rope_scaling(model, rope_type="yarn", scaling_factor=2.0)
    with pytest.raises(ValueError, match="`scaling_factor` must be a finite number"):
        utils.set_rope_scaling(model, rope_type="linear", scaling_factor=0.5)
    with pytest.raises(ValueError, match="`long_factor` must be a list"):
        utils.set_rope_scaling(
            model,
            rope_type="longrope",
            scaling_factor=2.0,
            original_max_position_embeddings=8,
            short_factor=[1.0] * 4,
            long_factor=[1.0] * 3,
        )
    ropes = [
        layer
        for layer in utils.nested_layers(model)
        if isinstance(layer, RotaryEmbedding)
    ]
    assert all(r.rope_type == "default" for r in ropes)


def test_set_rope_scaling_needs_a_rotary_layer():
    model = models.build_encoder(vocab_size=9, hidden_dim=8, num_heads=2)
    with pytest.raises(ValueError, match="`model` must hold a RotaryEmbedding"):
        utils.set_rope_scaling(model, rope_type="linear", scaling_factor=2.0)


def test_set_rope_scaling_switches_between_length_dependent_types():
    model = rope_model()
    ids = np.random.randint(1, 9, size=(1, 40))
    for rope_type, extra in [
        ("dynamic", {}),
        ("longrope", {"short_factor": [1.0] * 4, "long_factor": [4.0] * 4}),
        ("yarn", {}),
    ]:
        utils.set_rope_scaling(
            model,
            rope_type=rope_type,
            scaling_factor=4.0,
            original_max_position_embeddings=16,
            **extra,
        )
        assert np.all(np.isfinite(model(ids).numpy())), rope_type


def test_set_rope_scaling_resets_generation_and_travels_with_the_model(tmp_path):
    tf.keras.utils.set_random_seed(2)
    model = models.build_causal_lm(
        13,
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        position="rope",
        position_options={"max_length": 32},
    )
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6]]
    model.generate(prompts, 8)  # traces the steps with the old frequencies
    utils.set_rope_scaling(model, "linear", scaling_factor=8.0)
    scaled = model.generate(prompts, 8)
    # A fresh model built with the scaling and the same weights: same tokens.
    config = model.get_config()
    assert config["position_options"]["rope_type"] == "linear"
    assert config["position_options"]["scaling_factor"] == 8.0
    fresh = models.CausalLM.from_config(config)
    fresh.set_weights(model.get_weights())
    np.testing.assert_array_equal(fresh.generate(prompts, 8), scaled)
    ids = np.array(prompts, "int32")
    np.testing.assert_allclose(fresh(ids), model(ids), atol=1e-6)
    model.save(tmp_path / "scaled.keras")
    loaded = keras.models.load_model(tmp_path / "scaled.keras")
    np.testing.assert_allclose(loaded(ids), model(ids), atol=1e-6)


def test_set_rope_scaling_refuses_a_non_model_and_bad_parameters():
    with pytest.raises(TypeError, match="model"):
        utils.set_rope_scaling(None)
    model = models.build_encoder(
        vocab_size=9, hidden_dim=8, num_heads=2, position="rope"
    )
    model(np.ones((1, 4), "int32"))
    before = [layer.get_config() for layer in model.layers]
    with pytest.raises(ValueError, match="beta_fast"):
        utils.set_rope_scaling(model, "yarn", 2.0, 8, beta_fast=0)
    assert [layer.get_config() for layer in model.layers] == before
