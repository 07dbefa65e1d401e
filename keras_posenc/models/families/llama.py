"""Llama (1-3.x): pre-norm RMS blocks, SwiGLU, grouped-query RoPE attention.

The layout Mistral, Qwen 2/3 and SmolLM3 share: `model.embed_tokens`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`, `model.norm`, `lm_head`.
"""

from keras_posenc import _checks
from keras_posenc.models.families import _common
from keras_posenc.models.families._common import Entry, dense

MODEL_TYPES = ("llama",)
#: HF's `LlamaConfig` defaults of the keys read here (a config may omit them).
DEFAULTS = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
}


def arguments(config, **block):
    """`CausalLM` keyword arguments of a Llama-shaped config (`block`: the
    family's own `block_options` over Llama's)."""
    width, heads = config["hidden_size"], config["num_attention_heads"]
    layers = config["num_hidden_layers"]
    head_dim = _common.get(config, "head_dim", width // heads)
    kinds = _common.layer_types(config, layers)
    options = dict(
        norm="rms",
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        norm_first=True,
        intermediate_dim=config["intermediate_size"],
        activation=_common.activation(config),
        gated=True,
        use_bias=bool(config.get("mlp_bias", False)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=head_dim,
    )
    if bool(config.get("attention_bias")) != options["use_bias"]:
        _checks.fail(
            "config['attention_bias']",
            f"equal to mlp_bias={options['use_bias']} (one bias setting for the "
            "attention's output and the feed-forward projections)",
            config.get("attention_bias"),
        )
    if kinds is not None and "sliding" in kinds:
        options["layer_types"] = kinds
        options["sliding_window"] = int(config["sliding_window"])
    options.update(block)
    return dict(
        vocab_size=config["vocab_size"],
        hidden_dim=width,
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=_common.get(config, "num_key_value_heads", heads),
        position="rope",
        position_options=_common.positions(config, head_dim, kinds),
        block_options=options,
    )


def tensors(kwargs, prefix="model."):
    """Every checkpoint tensor of a Llama-shaped model and where it goes."""
    block = kwargs["block_options"]
    width, heads = kwargs["hidden_dim"], kwargs["num_heads"]
    kv, head_dim = kwargs["num_key_value_heads"], block["head_dim"]
    inner = block["intermediate_dim"]
    qkv_bias = block.get("qkv_bias", block["use_bias"])
    found = [
        Entry(
            f"{prefix}embed_tokens.weight",
            (kwargs["vocab_size"], width),
            ("embedding", "embeddings"),
        ),
        Entry(f"{prefix}norm.weight", (width,), ("final_norm", "scale")),
    ]
    for i in range(kwargs["num_layers"]):
        p, attention = f"{prefix}layers.{i}.", f"attention_{i}"
        for side, size in (("q", heads), ("k", kv), ("v", kv)):
            found += dense(
                f"{p}self_attn.{side}_proj",
                (size * head_dim, width),
                attention,
                {"q": "query_dense", "k": "key_dense", "v": "value_dense"}[side],
                qkv_bias,
            )
        found += dense(
            f"{p}self_attn.o_proj",
            (width, heads * head_dim),
            attention,
            "output_dense",
            block["use_bias"],
        )
        for part, shape in (
            ("gate", (inner, width)),
            ("up", (inner, width)),
            ("down", (width, inner)),
        ):
            found += dense(
                f"{p}mlp.{part}_proj",
                shape,
                f"ffn_{i}",
                f"{part}_dense",
                block["use_bias"],
            )
        found += norms(p, i, width, head_dim, block)
    if not block["tie_embeddings"]:
        found.append(
            Entry(
                "lm_head.weight",
                (kwargs["vocab_size"], width),
                ("logits", "kernel"),
                _common.transposed,
            )
        )
    return found


def norms(p, i, width, head_dim, block):
    """A layer's norms: the two residual norms, the QK norms when present."""
    found = [
        Entry(f"{p}input_layernorm.weight", (width,), (f"attention_norm_{i}", "scale")),
        Entry(
            f"{p}post_attention_layernorm.weight", (width,), (f"ffn_norm_{i}", "scale")
        ),
    ]
    if block.get("qk_norm"):
        for side in ("q", "k"):
            target = (f"attention_{i}", f"{'query' if side == 'q' else 'key'}_norm")
            found.append(
                Entry(
                    f"{p}self_attn.{side}_norm.weight", (head_dim,), target + ("scale",)
                )
            )
    return found
