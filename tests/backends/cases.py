"""The models every backend pass runs: each builder method, each attention
path, each rotary scaling, each method's causal LM; their inputs and what
each model gives (`results`), written with `keras.ops` and NumPy only.

`python tests/backends/reference.py DIR` writes every case's `.keras` file
and results under the backend it runs on; a pass on another backend loads
them (`tests/backends/test_backends.py`).
"""

import keras
import numpy as np

from keras_posenc import models
from keras_posenc.generation import Streaming
from keras_posenc.models.capabilities import streaming_methods
from keras_posenc.ops.rotary import ROPE_TYPES

VOCAB, WIDTH, HEADS = 24, 16, 2
#: Tokens every encoder case reads `(B, T)` (B=3, T=12; 0 never appears).
TOKENS = np.random.default_rng(0).integers(1, VOCAB, size=(3, 12)).astype("int32")
#: Three packed documents per row, for the packed encoder.
SEGMENTS = np.array([[1] * 5 + [2] * 4 + [3] * 3] * 3, "int32")
#: A rolling cache of 2 sinks and 6 recent tokens (8 slots).
STREAMING = Streaming(6, sink_tokens=2)
#: The length-dependent types' parameters are their paper's (small ones).
ROPE_OPTIONS = {
    "default": {},
    "linear": {"scaling_factor": 2.0},
    "ntk": {"scaling_factor": 2.0},
    "dynamic": {"scaling_factor": 2.0, "original_max_position_embeddings": 8},
    "yarn": {"scaling_factor": 2.0, "original_max_position_embeddings": 8},
    "llama3": {"scaling_factor": 2.0, "original_max_position_embeddings": 8},
    "longrope": {
        "scaling_factor": 4.0,
        "original_max_position_embeddings": 8,
        "rope_parameters": {
            "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0],
        },
    },
    "proportional": {
        "scaling_factor": 2.0,
        "rope_parameters": {"partial_rotary_factor": 0.5},
    },
}
assert set(ROPE_OPTIONS) == set(ROPE_TYPES), "a rope type without a case"


def _encoder(position, **kwargs):
    return models.build_token_classifier(
        5,
        vocab_size=VOCAB,
        hidden_dim=WIDTH,
        num_heads=HEADS,
        num_layers=2,
        position=position,
        **kwargs,
    )


def _lm(position, block_options=None, layers=2, **options):
    return models.build_causal_lm(
        VOCAB,
        hidden_dim=WIDTH,
        num_heads=HEADS,
        num_layers=layers,
        position=position,
        position_options={"max_length": 32, **options},
        block_options=block_options,
    )


#: Decoder blocks (`block_options`): a Qwen 3 / Gemma 3 shape (every
#: per-layer position: sliding and full layers with their own bases, a NoPE
#: layer, QK and post norms, sinks) and a GPT-2 shape (learned table, GELU).
DECODER_CASES = {
    "decoder-modern": lambda: _lm(
        "rope",
        block_options={
            "norm": "rms",
            "norm_first": True,
            "norm_unit_offset": True,
            "post_norms": True,
            "gated": True,
            "activation": "silu",
            "use_bias": False,
            "qk_norm": True,
            "tie_embeddings": True,
            "scale_embeddings": True,
            "layer_types": ["sliding", "full", "sliding"],
            "sliding_window": 4,
            "attention_sinks": True,
        },
        layers=3,
        nope_layers=[2],
        layer_rope={"full": {"max_wavelength": 1e6}},
    ),
    "decoder-gpt2": lambda: _lm(
        "learned",
        block_options={"norm_first": True, "activation": "gelu_tanh"},
    ),
}


def encoder_cases():
    """`{name: build()}`: each method, then the attention paths."""
    cases = {f"encoder-{m}": (lambda m=m: _encoder(m)) for m in models.METHODS}
    cases["window-t5"] = lambda: _encoder("t5", attention_window=4)
    cases["window-fox"] = lambda: _encoder("fox", attention_window=4)
    cases["grouped-rope"] = lambda: _encoder("rope", num_key_value_heads=1)
    cases["packed-alibi"] = lambda: _encoder("alibi", packed=True)
    cases["packed-sinusoidal"] = lambda: _encoder("sinusoidal", packed=True)
    cases["classifier-t5"] = lambda: models.build_classifier(
        3, vocab_size=VOCAB, hidden_dim=WIDTH, num_heads=HEADS, mask_zero=True
    )
    lsh = {"attention_type": "lsh", "num_hashes": 2, "bucket_size": 4}
    for method in ("t5", "rope"):
        cases[f"lsh-{method}"] = lambda m=method: _encoder(m, attention_options=lsh)
    return cases


def lm_cases():
    """`{name: build()}`: each method's causal LM, then each rotary scaling."""
    cases = {f"lm-{m}": (lambda m=m: _lm(m)) for m in models.METHODS}
    for rope_type, options in ROPE_OPTIONS.items():
        if rope_type != "default":
            cases[f"rope-{rope_type}"] = lambda t=rope_type, o=options: _lm(
                "rope", rope_type=t, **o
            )
    cases.update(DECODER_CASES)
    return cases


def all_cases():
    return {**encoder_cases(), **lm_cases()}


def inputs(name):
    """What case `name`'s model reads."""
    if name.startswith("packed-"):
        return {"token_ids": TOKENS, "segment_ids": SEGMENTS}
    return TOKENS


def shared_weights(model):
    """Gives `model` weights every backend draws alike: constant ones (zeros,
    ones, tables) kept, random ones redrawn from NumPy, normal with the
    spread `sqrt(2 / (fan_in + fan_out))` (0.1 for vectors), so each
    backend's file of a case holds the same weights and gives its results."""
    rng = np.random.default_rng(0)
    weights = []
    for w in model.get_weights():
        if np.issubdtype(w.dtype, np.floating) and w.size > 1 and w.std() > 0:
            fans = w.shape[-2] + w.shape[-1] if w.ndim > 1 else 200
            w = (np.sqrt(2.0 / fans) * rng.standard_normal(w.shape)).astype(w.dtype)
        weights.append(w)
    model.set_weights(weights)
    return model


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def results(name, model):
    """`{key: array}` of what `model` (case `name`) gives: its outputs, and
    for a causal LM its greedy tokens (the compiled loop), its scores and,
    where the method streams, its tokens through a rolling cache."""
    got = {"outputs": numpy(model(inputs(name)))}
    assert np.isfinite(got["outputs"]).all()
    if isinstance(model, models.CausalLM):
        prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
        got["tokens"] = model.generate(prompts, 6)
        got["scores"] = model.score(TOKENS)
        if name.startswith("lm-") and name[3:] in streaming_methods():
            got["streamed"] = model.generate(prompts, 12, streaming=STREAMING)
    return got
