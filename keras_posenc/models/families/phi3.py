"""Phi-3: Llama's blocks with a fused query-key-value projection and a fused
gate-up projection (`qkv_proj`, `gate_up_proj`), partial rotary, LongRoPE."""

from keras_posenc.models.families import llama
from keras_posenc.models.families._common import Entry, rows

MODEL_TYPES = ("phi3",)
#: HF\'s config defaults of the keys read here.
DEFAULTS = {**llama.DEFAULTS, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}


def arguments(config):
    rope = dict(config.get("rope_parameters") or {})
    if "partial_rotary_factor" in config and "partial_rotary_factor" not in rope:
        rope["partial_rotary_factor"] = config["partial_rotary_factor"]
    if rope:
        config = dict(config, rope_parameters=rope)
    return llama.arguments(config)


def tensors(kwargs):
    """Llama's tensors, with the two fused projections split into ours."""
    width, heads = kwargs["hidden_dim"], kwargs["num_heads"]
    kv, head_dim = kwargs["num_key_value_heads"], kwargs["block_options"]["head_dim"]
    inner = kwargs["block_options"]["intermediate_dim"]
    fused = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")
    found = [
        e for e in llama.tensors(kwargs) if not any(part in e.name for part in fused)
    ]
    q, k = heads * head_dim, kv * head_dim
    for i in range(kwargs["num_layers"]):
        p, attention = f"model.layers.{i}.", f"attention_{i}"
        qkv = f"{p}self_attn.qkv_proj.weight"
        shape = (q + 2 * k, width)
        for sublayer, (begin, end) in (
            ("query_dense", (0, q)),
            ("key_dense", (q, q + k)),
            ("value_dense", (q + k, q + 2 * k)),
        ):
            found.append(
                Entry(qkv, shape, (attention, sublayer, "kernel"), rows(begin, end))
            )
        gate_up = f"{p}mlp.gate_up_proj.weight"
        for sublayer, (begin, end) in (
            ("gate_dense", (0, inner)),
            ("up_dense", (inner, 2 * inner)),
        ):
            found.append(
                Entry(
                    gate_up,
                    (2 * inner, width),
                    (f"ffn_{i}", sublayer, "kernel"),
                    rows(begin, end),
                )
            )
    return found
