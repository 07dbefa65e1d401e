"""Writes transformers' own answers for the importer tests (a child process).

`python tests/models/hf_reference.py OUT CASE...` builds each case with
transformers from a small config (random weights, nothing downloaded),
saves it with `save_pretrained` into `OUT/CASE/`, and writes `OUT/CASE/
reference.npz`: a prompt, transformers' float32 logits on it, and its greedy
`generate(do_sample=False)` tokens with and without its cache. TensorFlow is
never imported here (torch's triton and TensorFlow do not share a process).
"""

import copy
import json
import os
import sys

import numpy as np
import torch
import transformers

SIZES = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    rms_norm_eps=1e-6,
)
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 8,
}
#: Each case: the model type, its config over `SIZES`, and whether its greedy
#: decoding is compared (HF caches keys rotated at their own length, so its
#: cached tokens differ from a recompute for length-dependent RoPE).
CASES = {
    "llama": ("llama", {}, True),
    "llama_tied": ("llama", {"tie_word_embeddings": True}, True),
    "llama_yarn": ("llama", {"rope_parameters": _YARN}, True),
    "llama_linear": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "linear",
                "rope_theta": 10000.0,
                "factor": 2.0,
            }
        },
        True,
    ),
    "llama_llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
        True,
    ),
    "llama_proportional": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "proportional",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "partial_rotary_factor": 0.5,
            }
        },
        True,
    ),
    "llama_dynamic": (
        "llama",
        {
            "max_position_embeddings": 8,
            "rope_parameters": {
                "rope_type": "dynamic",
                "rope_theta": 10000.0,
                "factor": 2.0,
            },
        },
        False,
    ),
    "mistral": ("mistral", {"sliding_window": 4}, True),
    "qwen2": ("qwen2", {}, True),
    "qwen3": (
        "qwen3",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        True,
    ),
    "gemma": ("gemma", {"head_dim": 16}, True),
    "gemma3_text": (
        "gemma3_text",
        {
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 12,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {
                    "rope_type": "linear",
                    "rope_theta": 1e6,
                    "factor": 2.0,
                },
            },
        },
        True,
    ),
    "smollm3": ("smollm3", {"no_rope_layer_interval": 2}, True),
    "phi3": (
        "phi3",
        {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            }
        },
        True,
    ),
    "phi3_longrope": (
        "phi3",
        {
            "max_position_embeddings": 32,
            "original_max_position_embeddings": 8,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.2, 1.5],
                "long_factor": [1.0, 2.0, 3.0, 4.0],
            },
        },
        False,
    ),
    "gpt2": ("gpt2", {}, True),
    # Weights as checkpoints ship them: bfloat16, in shards of ~20 KB.
    "qwen3_bfloat16_sharded": ("qwen3", {}, True),
}
#: Cases saved in bfloat16 and in shards (transformers' float32 forward of
#: the same bfloat16 weights is the reference: bfloat16 -> float32 is exact).
BFLOAT16 = ("qwen3_bfloat16_sharded",)
PROMPT_LENGTH, PREFIX, NEW_TOKENS = 20, 5, 10


def build(model_type, overrides, seed):
    if model_type == "gpt2":
        sizes = dict(
            vocab_size=96,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=64,
            bos_token_id=1,
            eos_token_id=2,
        )
    else:
        sizes = dict(SIZES)
    sizes.update(overrides)
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # weights large enough for decisive greedy tokens
        for name, weight in model.named_parameters():
            if "norm" in name or "ln_" in name:
                offset = 0.0 if model_type.startswith("gemma") else 1.0
                if name.endswith("bias"):
                    offset = 0.0
                weight.copy_(offset + 0.1 * torch.randn_like(weight))
            else:
                weight.copy_(0.2 * torch.randn_like(weight))
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def write(out, case):
    model_type, overrides, greedy = CASES[case]
    model = build(model_type, overrides, seed=len(case))
    folder = os.path.join(out, case)
    if case in BFLOAT16:  # float32 weights rounded to bfloat16 first
        with torch.no_grad():
            for weight in model.parameters():
                weight.copy_(weight.to(torch.bfloat16).float())
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(
            folder, max_shard_size="20KB"
        )
    else:
        model.save_pretrained(folder)
    rng = np.random.default_rng(len(case))
    prompt = rng.integers(3, 96, (2, PROMPT_LENGTH))
    ids = torch.tensor(prompt)
    with torch.no_grad():
        logits = model(ids).logits.numpy()
        result = {"prompt": prompt, "logits": logits}
        if greedy:
            for cache in (True, False):
                tokens = model.generate(
                    ids[:, :PREFIX],
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    use_cache=cache,
                )
                result[f"tokens_cache_{cache}"] = tokens.numpy()
    np.savez(os.path.join(folder, "reference.npz"), **result)
    with open(os.path.join(folder, "case.json"), "w") as file:
        json.dump({"model_type": model_type, "greedy": greedy}, file)


#: Not a model: Qwen3-VL's interleaved M-RoPE on 3-D positions (`write_rotary`).
ROTARY = "qwen3_vl_rotary"
ROTARY_SECTIONS = (6, 5, 5)


def write_rotary(out):
    """`OUT/qwen3_vl_rotary/reference.npz`: Qwen3-VL's own cos and sin of
    random (t, h, w) positions, head size 32 (16 slots: sections 6, 5, 5)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    config = transformers.AutoConfig.for_model(
        "qwen3_vl_text",
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5000.0,
            "mrope_section": list(ROTARY_SECTIONS),
            "mrope_interleaved": True,
        },
    )
    rotary = modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding(config)
    positions = np.random.default_rng(3).integers(0, 50, (3, 2, 7))
    x = torch.zeros(2, 7, 64)
    with torch.no_grad():
        cos, sin = rotary(x, torch.tensor(positions))
    folder = os.path.join(out, ROTARY)
    os.makedirs(folder, exist_ok=True)
    np.savez(
        os.path.join(folder, "reference.npz"),
        positions=positions,
        cos=cos.numpy(),
        sin=sin.numpy(),
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[2:]:
        if name == ROTARY:
            write_rotary(sys.argv[1])
        else:
            write(sys.argv[1], name)
