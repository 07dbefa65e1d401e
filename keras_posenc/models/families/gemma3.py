"""Gemma 3 (text): Gemma's blocks with QK norms, post-attention and post-FFN
norms, `query_pre_attn_scalar`, and sliding local layers with their own RoPE."""

from keras_posenc.models.families import _common, gemma, llama
from keras_posenc.models.families._common import Entry

MODEL_TYPES = ("gemma3_text",)
#: HF's `Gemma3TextConfig` defaults of the keys read here.
DEFAULTS = {
    **gemma.DEFAULTS,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "query_pre_attn_scalar": 256,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


def arguments(config):
    _common.refuse_set(
        config,
        ["final_logit_softcapping", "attn_logit_softcapping"],
        "logit soft-capping is not built",
    )
    kwargs = gemma.arguments(config)
    block = kwargs["block_options"]
    block.update(qk_norm=True, post_norms=True)
    scalar = config.get("query_pre_attn_scalar")
    if scalar is not None:
        block["query_scale"] = float(scalar) ** -0.5
    return kwargs


def tensors(kwargs):
    """Llama's tensors, the four norms of a layer named as Gemma 3 names them."""
    width = kwargs["hidden_dim"]
    renamed = {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffn_norm",
    }
    found = [
        e
        for e in llama.tensors(kwargs)
        if not e.name.endswith("post_attention_layernorm.weight")
    ]
    for i in range(kwargs["num_layers"]):
        for hf, ours in renamed.items():
            found.append(
                Entry(
                    f"model.layers.{i}.{hf}.weight", (width,), (f"{ours}_{i}", "scale")
                )
            )
    return found
