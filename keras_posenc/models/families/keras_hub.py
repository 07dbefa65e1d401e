"""keras-hub models in: a backbone's config and weights as the HF names give them.

keras-hub writes each family's Hugging Face config and tensor names itself
(its `export_to_transformers` mapping, used here in memory: nothing is
written); Qwen 3, which it does not export, and Gemma, whose export reads
one key head and square projections only (Gemma 1 2B's shapes), are mapped
here from the backbone's layers.
The config and tensors then take `from_hf`'s path: the same checks, the same
family mapping.
"""

import numpy as np

from keras_posenc import _checks

#: keras-hub backbone classes this reads, by class name.
BACKBONES = (
    "LlamaBackbone",
    "Llama3Backbone",
    "MistralBackbone",
    "QwenBackbone",
    "Qwen3Backbone",
    "GemmaBackbone",
    "Gemma3Backbone",
    "GPT2Backbone",
)
#: What a keras-hub config leaves out that the HF config needs.
DEFAULT_MAX_POSITIONS = 8192


#: `block_options` where a keras-hub family computes otherwise than HF's:
#: its Qwen 3 attention normalizes queries and keys with epsilon 1e-5 (the
#: attention's default; the backbone's `layer_norm_epsilon` is not passed on).
BLOCK_OVERRIDES = {"Qwen3Backbone": {"qk_norm_epsilon": 1e-5}}


def backbone_name(model):
    """The keras-hub backbone class `model` is (or holds) among `BACKBONES`."""
    backbone = getattr(model, "backbone", model)
    names = [cls.__name__ for cls in type(backbone).__mro__]
    return next((name for name in names if name in BACKBONES), None)


def hf_checkpoint(model):
    """`(config, {name: array})` of a keras-hub `CausalLM` or `Backbone`."""
    backbone = getattr(model, "backbone", model)
    found = backbone_name(model)
    if found is None:
        _checks.fail(
            "model",
            f"a keras-hub CausalLM or Backbone of {list(BACKBONES)}",
            type(model).__name__,
            error=TypeError,
        )
    if getattr(backbone, "vision_encoder", None) is not None:
        _checks.fail("model", "a text-only backbone", "one with a vision encoder")
    if found in OWN:
        config, weights = OWN[found](backbone)
    else:
        from keras_hub.src.utils.transformers.export import hf_exporter

        key = "Llama3Backbone" if found == "LlamaBackbone" else found
        config = hf_exporter.MODEL_CONFIGS[key](backbone)
        weights = hf_exporter.MODEL_EXPORTERS[key](backbone, include_lm_head=True)
    config = dict(config)
    config.setdefault("max_position_embeddings", DEFAULT_MAX_POSITIONS)
    _llama_scaling(backbone, found, config)
    arrays = {name: _numpy(value) for name, value in weights.items()}
    return config, arrays


def _numpy(value):
    import keras  # keras-hub's: Keras 3, whatever its backend

    return np.asarray(keras.ops.convert_to_numpy(getattr(value, "value", value)))


def _llama_scaling(backbone, found, config):
    """keras-hub's Llama `rope_position_scaling_factor`: HF's linear RoPE."""
    factor = getattr(backbone, "rope_position_scaling_factor", 1.0)
    if (
        found in ("LlamaBackbone", "Llama3Backbone", "MistralBackbone")
        and factor != 1.0
    ):
        if config.get("rope_scaling"):
            _checks.fail(
                "model",
                "one RoPE scaling (keras-hub's rope_position_scaling_factor or "
                "its llama3 frequency adjustment)",
                factor,
            )
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor}


def _qwen3(backbone):
    """Qwen 3's HF config and tensors, as keras-hub's converter reads them."""
    width, heads = backbone.hidden_dim, backbone.num_query_heads
    window = backbone.sliding_window_size
    config = {
        "model_type": "qwen3",
        "vocab_size": backbone.vocabulary_size,
        "hidden_size": width,
        "intermediate_size": backbone.intermediate_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": backbone.num_key_value_heads,
        "head_dim": backbone.head_dim,
        "rms_norm_eps": backbone.layer_norm_epsilon,
        "rope_theta": backbone.rope_max_wavelength,
        "tie_word_embeddings": backbone.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
    }
    factor = getattr(backbone, "rope_scaling_factor", 1.0) or 1.0
    if factor != 1.0:
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    if window:
        config["sliding_window"] = window
        config["layer_types"] = ["sliding_attention"] * backbone.num_layers
    embedding = backbone.get_layer("token_embedding")
    weights = {"model.embed_tokens.weight": embedding.embeddings}
    if not backbone.tie_word_embeddings:
        weights["lm_head.weight"] = np.transpose(_numpy(embedding.reverse_embeddings))
    weights["model.norm.weight"] = backbone.get_layer("sequence_output_layernorm").scale
    for i in range(backbone.num_layers):
        weights.update(_qwen3_layer(backbone.get_layer(f"transformer_layer_{i}"), i))
    return config, weights


def _qwen3_layer(layer, i):
    """One keras-hub Qwen 3 decoder layer's tensors under HF's names."""
    p, attention = f"model.layers.{i}.", layer._self_attention_layer

    def linear(kernel, out_first=True):  # EinsumDense kernels to (out, in)
        kernel = _numpy(kernel)
        if out_first:  # (D, N, H) -> (N H, D)
            return kernel.reshape(kernel.shape[0], -1).T
        return kernel.reshape(-1, kernel.shape[-1]).T  # (N, H, D) -> (D, N H)

    found = {
        f"{p}input_layernorm.weight": layer._self_attention_layernorm.scale,
        f"{p}post_attention_layernorm.weight": layer._feedforward_layernorm.scale,
        f"{p}self_attn.q_norm.weight": attention._query_dense_layer_norm.scale,
        f"{p}self_attn.k_norm.weight": attention._key_dense_layer_norm.scale,
        f"{p}self_attn.o_proj.weight": linear(attention._output_dense.kernel, False),
    }
    for side, dense in (
        ("q", attention._query_dense),
        ("k", attention._key_dense),
        ("v", attention._value_dense),
    ):
        found[f"{p}self_attn.{side}_proj.weight"] = linear(dense.kernel)
    for part, dense in (
        ("gate", layer._feedforward_gate_dense),
        ("up", layer._feedforward_intermediate_dense),
        ("down", layer._feedforward_output_dense),
    ):
        found[f"{p}mlp.{part}_proj.weight"] = np.transpose(_numpy(dense.kernel))
    return found


def _gemma(backbone):
    """Gemma's HF config and tensors from the backbone's decoder blocks."""
    embedding = backbone.get_layer("token_embedding")
    config = {
        "model_type": "gemma",
        "vocab_size": backbone.vocabulary_size,
        "hidden_size": backbone.hidden_dim,
        "intermediate_size": backbone.intermediate_dim // 2,  # keras-hub: 2x
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_query_heads,
        "num_key_value_heads": backbone.num_key_value_heads,
        "head_dim": backbone.head_dim,
        "rms_norm_eps": backbone.layer_norm_epsilon,
        "hidden_act": "gelu_pytorch_tanh",
        "tie_word_embeddings": bool(embedding.tie_weights),
        "max_position_embeddings": DEFAULT_MAX_POSITIONS,
    }
    weights = {"model.embed_tokens.weight": embedding.embeddings}
    if not embedding.tie_weights:
        weights["lm_head.weight"] = np.transpose(_numpy(embedding.reverse_embeddings))
    weights["model.norm.weight"] = backbone.get_layer("final_normalization").scale
    for i in range(backbone.num_layers):
        block, p = backbone.get_layer(f"decoder_block_{i}"), f"model.layers.{i}."
        attention = block.attention
        weights[f"{p}input_layernorm.weight"] = block.pre_attention_norm.scale
        weights[f"{p}post_attention_layernorm.weight"] = block.pre_ffw_norm.scale
        for side, dense in (
            ("q", attention.query_dense),
            ("k", attention.key_dense),
            ("v", attention.value_dense),
        ):
            kernel = _numpy(dense.kernel)  # (N, D, H) -> (N H, D)
            weights[f"{p}self_attn.{side}_proj.weight"] = np.transpose(
                kernel, (0, 2, 1)
            ).reshape(-1, kernel.shape[1])
        out = _numpy(attention.output_dense.kernel)  # (N, H, D) -> (D, N H)
        weights[f"{p}self_attn.o_proj.weight"] = out.reshape(-1, out.shape[-1]).T
        for part, dense in (
            ("gate", block.gating_ffw),
            ("up", block.gating_ffw_2),
            ("down", block.ffw_linear),
        ):
            weights[f"{p}mlp.{part}_proj.weight"] = np.transpose(_numpy(dense.kernel))
    return config, weights


#: Backbones mapped here rather than by keras-hub's exporter.
OWN = {"Qwen3Backbone": _qwen3, "GemmaBackbone": _gemma}
