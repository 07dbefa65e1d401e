"""`models.from_hf` against transformers itself: logits and greedy tokens.

transformers builds each family from a small config with random weights in a
child process (`hf_reference.py`: TensorFlow and torch's triton do not share
a process) and saves it with `save_pretrained`; ours imports the folder.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from keras_posenc import IS_KERAS_3, models

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from hf_reference import (  # noqa: E402
    CASES,
    NEW_TOKENS,
    PREFIX,
    ROTARY,
    ROTARY_SECTIONS,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None
        or importlib.util.find_spec("torch") is None,
        reason="needs transformers and torch (the dev and backends extras)",
    ),
]
#: The Keras 2 pass imports one case of each layout (the mapping is the
#: same code in both modes; each block option is met in both).
KERAS2_CASES = ("llama", "gemma3_text", "phi3", "gpt2", "qwen3_bfloat16_sharded")
RUN = list(CASES) if IS_KERAS_3 else list(KERAS2_CASES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """`{case: folder}` written by transformers in one child process."""
    out = tmp_path_factory.mktemp("hf")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "hf_reference.py"),
            str(out),
            *RUN,
            ROTARY,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {case: str(out / case) for case in [*RUN, ROTARY]}


def _reference(folder):
    return dict(np.load(os.path.join(folder, "reference.npz")))


def test_interleaved_mrope_turns_as_qwen3_vl_does(folders):
    """`interleaved_sections=True` gives Qwen3-VL's own cos and sin of 3-D
    (t, h, w) positions (its rotary class, in the child process)."""
    from keras_posenc import RotaryEmbedding

    reference = _reference(folders[ROTARY])
    positions = np.moveaxis(reference["positions"], 0, -1).astype("float32")
    rope = RotaryEmbedding(
        max_wavelength=5000.0,
        coordinate_dim=3,
        sections=ROTARY_SECTIONS,
        interleaved_sections=True,
    )
    rope.build((2, 7, 32))
    cos, sin = rope.cos_sin(positions)  # (B, T, 16): HF repeats them twice
    np.testing.assert_allclose(cos, reference["cos"][..., :16], atol=2e-6)
    np.testing.assert_allclose(sin, reference["sin"][..., :16], atol=2e-6)
    chunked = RotaryEmbedding(
        max_wavelength=5000.0, coordinate_dim=3, sections=ROTARY_SECTIONS
    )
    chunked.build((2, 7, 32))
    chunked_cos = chunked.cos_sin(positions)[0]
    assert np.abs(chunked_cos - reference["cos"][..., :16]).max() > 0.1


@pytest.mark.parametrize("case", RUN)
def test_imported_logits_are_transformers_logits(folders, case):
    """Float32 logits within 1e-4 of their scale, over a prompt longer than
    every sliding window and past every original_max_position_embeddings."""
    ref = _reference(folders[case])
    lm = models.from_hf(folders[case])
    logits = np.asarray(lm(ref["prompt"]))
    scale = np.abs(ref["logits"]).max()
    assert np.abs(logits - ref["logits"]).max() <= 1e-4 * scale


@pytest.mark.parametrize("case", [c for c in RUN if CASES[c][2]])
def test_imported_greedy_tokens_are_transformers_tokens(folders, case):
    """`generate` (the compiled cached loop, and a recompute) gives
    transformers' `generate(do_sample=False)` tokens, cached and not."""
    ref = _reference(folders[case])
    np.testing.assert_array_equal(ref["tokens_cache_True"], ref["tokens_cache_False"])
    lm = models.from_hf(folders[case])
    prompt = ref["prompt"][:, :PREFIX]
    for use_cache in (True, False):
        tokens = lm.generate(prompt, NEW_TOKENS, use_cache=use_cache)
        np.testing.assert_array_equal(np.asarray(tokens), ref["tokens_cache_True"])


def test_an_imported_model_round_trips_keras(folders, tmp_path):
    case = "gemma3_text" if "gemma3_text" in folders else RUN[0]
    ref = _reference(folders[case])
    lm = models.from_hf(folders[case])
    path = str(tmp_path / "imported.keras")
    lm.save(path)
    loaded = models.CausalLM.from_config(lm.get_config())
    loaded.set_weights(lm.get_weights())
    from keras_posenc.utils import keras

    reloaded = keras.models.load_model(path)
    want = np.asarray(lm(ref["prompt"]))
    np.testing.assert_allclose(np.asarray(reloaded(ref["prompt"])), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(loaded(ref["prompt"])), want, atol=1e-5)


def _copy(folders, tmp_path, case="llama"):
    target = tmp_path / case
    shutil.copytree(folders[case], target)
    return target


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"model_type": "bloom"}, r"config\['model_type'\]` must be one of"),
        ({"num_local_experts": 8}, r"mixture-of-experts layers are not built"),
        (
            {"quantization_config": {"quant_method": "gptq"}},
            r"pre-quantized checkpoint.*Received: .*gptq",
        ),
        ({"hidden_act": "mish"}, r"config\['hidden_act'\]` must be one of"),
        (
            {"rope_parameters": {"rope_type": "su", "rope_theta": 1.0}},
            r"rope_type'\]` must be one of",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "linear",
                    "rope_theta": 1.0,
                    "factor": 2.0,
                    "mrope_section": [1],
                }
            },
            r"keys among \['factor'\] for rope_type='linear'",
        ),
        (
            {"attention_bias": True},
            r"config\['attention_bias'\]` must be equal to mlp_bias=False",
        ),
        ({"intermediate_size": 40}, r"mlp.gate_proj.weight` must be shape \(40, 32\)"),
    ],
)
def test_a_config_that_would_change_the_answer_is_refused_by_name(
    folders, tmp_path, changes, match
):
    folder = _copy(folders, tmp_path)
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=match):
        models.from_hf(str(folder))


def test_unscaled_gpt2_logits_are_refused_by_name(folders, tmp_path):
    folder = _copy(folders, tmp_path, "gpt2")
    _edit_config(folder, scale_attn_weights=False)
    with pytest.raises(
        ValueError, match=r"config\['scale_attn_weights'\]` must be True"
    ):
        models.from_hf(str(folder))


def test_gemma3_logit_soft_capping_is_refused_by_name(folders, tmp_path):
    if "gemma3_text" not in folders:
        pytest.skip("gemma3_text runs in the Keras 3 pass")
    folder = _copy(folders, tmp_path, "gemma3_text")
    _edit_config(folder, final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="logit soft-capping is not built"):
        models.from_hf(str(folder))


def test_missing_and_left_over_tensors_are_refused_by_name(folders, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _copy(folders, tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    dropped = dict(weights)
    dropped.pop("model.layers.1.mlp.up_proj.weight")
    save_file(dropped, str(folder / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"`model.layers.1.mlp.up_proj.weight` must "
        r"be a tensor of the checkpoint. Received: .*'missing'",
    ):
        models.from_hf(str(folder))
    save_file(
        dict(weights, extra=np.zeros(3, "float32")), str(folder / "model.safetensors")
    )
    with pytest.raises(ValueError, match=r"every tensor has a place.*'extra'"):
        models.from_hf(str(folder))


def test_a_folder_it_cannot_read_is_refused_naming_what_is_missing(folders, tmp_path):
    with pytest.raises(ValueError, match="a checkpoint folder"):
        models.from_hf(str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="a folder with config.json"):
        models.from_hf(str(empty))
    folder = _copy(folders, tmp_path)
    os.remove(folder / "model.safetensors")
    with pytest.raises(ValueError, match="No weights found"):
        models.from_hf(str(folder))
