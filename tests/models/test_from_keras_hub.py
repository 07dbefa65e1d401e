"""`models.from_keras_hub` against keras-hub itself: logits and greedy tokens.

keras-hub builds each family's backbone from a small config (random weights,
nothing downloaded); ours imports it.
"""

import importlib.util

import numpy as np
import pytest

from keras_posenc import IS_KERAS_3, models

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("keras_hub") is None,
        reason="needs keras-hub (the bench extra)",
    ),
    pytest.mark.skipif(not IS_KERAS_3, reason="keras-hub runs on Keras 3 only"),
]
SIZES = dict(vocabulary_size=96, num_layers=2, hidden_dim=32, intermediate_dim=48)
GQA = dict(num_query_heads=4, num_key_value_heads=2)


def _backbones():
    import keras_hub

    m = keras_hub.models
    return {
        "llama": (m.LlamaBackbone, m.LlamaCausalLM, dict(**GQA, **SIZES)),
        "llama3": (
            m.Llama3Backbone,
            m.Llama3CausalLM,
            dict(
                **GQA,
                **SIZES,
                rope_max_wavelength=500000,
                rope_frequency_adjustment_factor=8.0,
                rope_low_freq_factor=1.0,
                rope_high_freq_factor=4.0,
                rope_pretraining_sequence_length=8,
            ),
        ),
        "mistral": (
            m.MistralBackbone,
            m.MistralCausalLM,
            dict(**GQA, **SIZES, sliding_window=4),
        ),
        "qwen": (m.QwenBackbone, m.QwenCausalLM, dict(**GQA, **SIZES)),
        "qwen3": (
            m.Qwen3Backbone,
            m.Qwen3CausalLM,
            dict(
                **GQA,
                **SIZES,
                head_dim=8,
                layer_norm_epsilon=1e-6,
                rope_max_wavelength=10000,
            ),
        ),
        "gemma": (m.GemmaBackbone, m.GemmaCausalLM, dict(**GQA, **SIZES, head_dim=16)),
        "gemma3": (
            m.Gemma3Backbone,
            m.Gemma3CausalLM,
            dict(
                **GQA,
                **SIZES,
                image_size=16,
                head_dim=16,
                sliding_window_size=4,
                query_head_dim_normalize=True,
                use_post_ffw_norm=True,
                use_post_attention_norm=True,
                use_qk_norm=True,
            ),
        ),
        "gpt2": (
            m.GPT2Backbone,
            m.GPT2CausalLM,
            dict(
                vocabulary_size=96,
                num_layers=2,
                num_heads=4,
                hidden_dim=32,
                intermediate_dim=64,
                max_sequence_length=64,
            ),
        ),
    }


CASES = ["llama", "llama3", "mistral", "qwen", "qwen3", "gemma", "gemma3", "gpt2"]


def _hub_lm(case):
    """A keras-hub CausalLM of `case` with weights large enough for decisive
    greedy tokens (norm scales near their identity)."""
    import keras

    backbone_class, lm_class, config = _backbones()[case]
    keras.utils.set_random_seed(len(case))
    backbone = backbone_class(**config)
    rng = np.random.default_rng(len(case))
    for w in backbone.weights:
        value = 0.2 * rng.standard_normal(w.shape)
        scale = w.path.endswith(("scale", "gamma")) and not case.startswith("gemma")
        w.assign((value * 0.5 + 1.0 if scale else value).astype("float32"))
    hub = lm_class(backbone=backbone, preprocessor=None)
    hub.compile(sampler="greedy")  # keras-hub samples top-k by default
    return hub


@pytest.mark.parametrize("case", CASES)
def test_imported_model_gives_keras_hubs_logits_and_tokens(case):
    hub = _hub_lm(case)
    ids = np.random.default_rng(1).integers(3, 96, (2, 12)).astype("int32")
    want = np.asarray(hub({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    lm = models.from_keras_hub(hub)
    got = np.asarray(lm(ids))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert models.from_keras_hub(hub.backbone).count_params() == lm.count_params()
    prompt, total = ids[:, :5], 15
    padded = np.zeros((2, total), "int32")
    padded[:, :5] = prompt
    mask = np.zeros((2, total), bool)
    mask[:, :5] = True
    if case == "gemma3":  # its generate asks for image inputs: greedy by hand
        tokens = prompt
        for _ in range(total - 5):
            logits = hub({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
            best = np.argmax(np.asarray(logits)[:, -1], -1).astype("int32")
            tokens = np.concatenate([tokens, best[:, None]], 1)
    else:
        tokens = hub.generate(
            {"token_ids": padded, "padding_mask": mask},
            max_length=total,
            stop_token_ids=None,
        )["token_ids"]
    np.testing.assert_array_equal(np.asarray(lm.generate(prompt, total - 5)), tokens)


def test_other_models_are_refused_by_name():
    with pytest.raises(
        TypeError, match="`model` must be a keras-hub CausalLM or Backbone of"
    ):
        models.from_keras_hub(models.build_causal_lm(10, hidden_dim=8, num_heads=2))
