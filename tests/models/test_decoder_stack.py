"""`CausalLM(block_options=...)`: the described stack (`models.DecoderStack`)."""

import numpy as np
import pytest

from keras_posenc import models
from keras_posenc.models.decoder_stack import UNBLOCKED

VOCAB = 40
TOKENS = np.random.default_rng(0).integers(1, VOCAB, size=(2, 11)).astype("int32")
MODERN = {
    "norm": "rms",
    "norm_first": True,
    "post_norms": True,
    "gated": True,
    "activation": "gelu_tanh",
    "use_bias": False,
    "qk_norm": True,
    "tie_embeddings": True,
    "head_dim": 8,
    "layer_types": ["sliding", "full", "sliding"],
    "sliding_window": 3,
}


def _lm(position="rope", block_options=None, **kwargs):
    position_options = kwargs.pop("position_options", {"max_length": 32})
    return models.build_causal_lm(
        VOCAB,
        hidden_dim=16,
        num_layers=3,
        num_heads=2,
        position=position,
        position_options=position_options,
        block_options=MODERN if block_options is None else block_options,
        **kwargs,
    )


def _decode_steps(lm, tokens, prefill=4):
    cache = lm.empty_cache(tokens.shape[0], 16)
    logits, cache = lm.call_with_cache(tokens[:, :prefill], cache, 0)
    steps = [np.asarray(logits)]
    for t in range(prefill, tokens.shape[1]):
        logits, cache = lm.call_with_cache(tokens[:, t : t + 1], cache, t)
        steps.append(np.asarray(logits))
    return np.concatenate(steps, 1)


BLOCKED = [name for name in models.METHODS if name not in UNBLOCKED]


@pytest.mark.parametrize("position", list(models.METHODS))
def test_every_method_decodes_as_it_recomputes_or_is_refused_by_name(position):
    """Across the sliding window's edge, a NoPE layer and per-type bases."""
    if position in UNBLOCKED:
        with pytest.raises(ValueError, match=f"with block_options \\({position!r}"):
            _lm(position)
        return
    options = {"max_length": 32, "nope_layers": [1]}
    if models.METHODS[position].rotary is not None:
        options["layer_rope"] = {"full": {"max_wavelength": 500.0}}
    temperature = {"floor_scale": 2.0, "attn_scale": 0.5}  # Llama 4's, on NoPE
    block = dict(MODERN, nope_temperature=temperature)
    lm = _lm(position, block_options=block, position_options=options)
    whole = np.asarray(lm(TOKENS))
    np.testing.assert_allclose(_decode_steps(lm, TOKENS), whole, atol=2e-5)


def _legacy_twin(position):
    """A first-block LM and its `block_options={}` twin with its weights."""
    kwargs = dict(hidden_dim=16, num_layers=2, num_heads=2, position=position)
    legacy = models.build_causal_lm(VOCAB, **kwargs)
    described = models.build_causal_lm(VOCAB, block_options={}, **kwargs)
    names = {"ffn_hidden": ("ffn", "up_dense"), "ffn_output": ("ffn", "down_dense")}
    for layer in legacy.layers:
        prefix, _, index = layer.name.rpartition("_")
        if prefix in names:
            part, sub = names[prefix]
            target = getattr(described.get_layer(f"{part}_{index}"), sub)
        elif layer.weights:
            target = described.get_layer(layer.name)
        else:
            continue
        target.set_weights(layer.get_weights())
    return legacy, described


@pytest.mark.parametrize("position", ["t5", "rope", "learned", "alibi"])
def test_empty_block_options_describe_the_first_block(position):
    """`block_options={}` is today's block (post-norm LayerNorm, ReLU of
    width 2D, biases, untied): the first stack's logits, given its weights."""
    legacy, described = _legacy_twin(position)
    assert len(described.weights) == len(legacy.weights)
    np.testing.assert_allclose(
        np.asarray(described(TOKENS)), np.asarray(legacy(TOKENS)), atol=1e-5
    )


def test_a_tied_model_reads_its_logits_off_the_embedding_table():
    from keras_posenc.utils import keras

    tied = _lm()
    untied = _lm(block_options=dict(MODERN, tie_embeddings=False))
    assert len(untied.weights) == len(tied.weights) + 1  # the head's kernel
    final = keras.Model(tied.inputs, tied.get_layer("final_norm").output)
    table = tied.get_layer("embedding").embeddings.numpy()
    want = np.asarray(final(TOKENS)) @ table.T
    np.testing.assert_allclose(np.asarray(tied(TOKENS)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_modern_block_lm_trains_generates_and_round_trips(tmp_path):
    lm = _lm(position_options={"max_length": 32, "nope_layers": [2]})
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 7, size=(64, 1))
    data = ((starts + np.arange(12)) % 7 + 1).astype("int32")
    from keras_posenc.utils import keras

    lm.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = lm.fit(data[:, :-1], data[:, 1:], epochs=6, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    cached = np.asarray(lm.generate(data[:2, :4], 6))
    np.testing.assert_array_equal(
        cached, np.asarray(lm.generate(data[:2, :4], 6, use_cache=False))
    )
    path = str(tmp_path / "modern.keras")
    lm.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(
        np.asarray(loaded(TOKENS)), np.asarray(lm(TOKENS)), atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"block_options": {"norms": "rms"}}, ValueError, "Unknown: \\['norms'\\]"),
        ({"block_options": {"norm": "batch"}}, ValueError, "`norm` must be one of"),
        ({"block_options": ["rms"]}, TypeError, "`block_options` must be a dict"),
        (
            {"block_options": {"layer_types": ["full"]}},
            ValueError,
            "`layer_types` must be a list of 3 names",
        ),
        (
            {"block_options": {"layer_types": ["full", "sliding", "full"]}},
            ValueError,
            "`sliding_window` must be an int >= 1 when layer_types has 'sliding'",
        ),
        (
            {"block_options": {"norm_unit_offset": True}},
            ValueError,
            "`norm_unit_offset` must be False unless norm='rms'",
        ),
        (
            {"position_options": {"nope_layers": [3]}},
            ValueError,
            "`nope_layers` must be a list of layer indices in \\[0, 3\\)",
        ),
        (
            {"position": "alibi", "position_options": {"layer_rope": {"full": {}}}},
            ValueError,
            "`layer_rope` must be unset unless position is a rotary method",
        ),
        (
            {"position_options": {"layer_rope": {"global": {}}}},
            ValueError,
            "`layer_rope` must be a dict keyed by layer types",
        ),
        ({"quantize": True}, ValueError, "`quantize` must be False with block_options"),
        (
            {"attention_options": {"attention_type": "lsh"}},
            ValueError,
            "`attention_options` must be None with block_options",
        ),
        (
            {"position_options": {"grid_shape": (2, 2)}},
            ValueError,
            "`grid_shape` must be unset with block_options",
        ),
        (
            {"num_key_value_heads": 3},
            ValueError,
            "`num_key_value_heads` must be a divisor of num_heads=2",
        ),
    ],
)
def test_bad_block_options_are_refused_by_name(kwargs, error, match):
    kwargs = dict(kwargs)
    block = kwargs.pop("block_options", {})
    with pytest.raises(error, match=match):
        _lm(block_options=block, **kwargs)


def test_the_exact_gelu_is_refused_at_int8_before_converting():
    """The capability says no int8, and the exporter says so by name (sinks
    and Llama 4's temperature have integer kernels: their conformance rows)."""
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from keras_posenc.models.capabilities import block_capabilities
    from tflite_export import ExportError, convert_causal_lm

    block, match = {"activation": "gelu"}, "the exact GELU's error function"
    options = {"max_length": 32, "nope_layers": [1]}
    assert not block_capabilities("rope", 3, dict(MODERN, **block), options).int8
    assert block_capabilities("rope", 3, MODERN, options).int8
    lm = _lm(block_options=dict(MODERN, **block), position_options=options)
    with pytest.raises(ExportError, match=match):
        convert_causal_lm(lm, TOKENS, mode="int8", max_length=16, target="tflm")


def test_a_rescaled_per_type_model_keeps_its_scaling_through_its_config():
    """`set_rope_scaling` on a `layer_rope` model: `get_config` records the
    scaling in force for each layer type, so a copy gives the same logits."""
    from keras_posenc.utils import set_rope_scaling

    options = {"max_length": 32, "layer_rope": {"full": {"max_wavelength": 500.0}}}
    lm = _lm(position_options=options)
    before = np.asarray(lm(TOKENS))
    set_rope_scaling(lm, "linear", scaling_factor=4.0)
    after = np.asarray(lm(TOKENS))
    assert np.abs(after - before).max() > 1e-4  # the scaling changed the logits
    config = lm.get_config()
    full = config["position_options"]["layer_rope"]["full"]
    assert full["max_wavelength"] == 500.0 and full["rope_type"] == "linear"
    assert config["position_options"]["layer_rope"]["sliding"]["scaling_factor"] == 4.0
    copy = models.CausalLM.from_config(config)
    copy.set_weights(lm.get_weights())
    np.testing.assert_allclose(np.asarray(copy(TOKENS)), after, atol=1e-6)
