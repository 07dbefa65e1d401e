"""GPT-2: pre-norm LayerNorm blocks, a learned absolute position table, GELU
(tanh) and Conv1D `(in, out)` weights with a fused query-key-value kernel."""

from keras_posenc import _checks
from keras_posenc.models.families import _common
from keras_posenc.models.families._common import Entry, columns

MODEL_TYPES = ("gpt2",)
#: HF's `GPT2Config` defaults of the keys read here.
DEFAULTS = {
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "n_positions": 1024,
    "tie_word_embeddings": True,
}


def arguments(config):
    _common.refuse_set(
        config,
        [
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "add_cross_attention",
        ],
        "not built",
    )
    if config.get("scale_attn_weights") is False:
        _checks.fail(
            "config['scale_attn_weights']",
            "True (unscaled logits are not built)",
            False,
        )
    width = config["n_embd"]
    return dict(
        vocab_size=config["vocab_size"],
        hidden_dim=width,
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        position="learned",
        position_options={"max_length": int(config["n_positions"])},
        block_options=dict(
            norm="layer",
            norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
            norm_first=True,
            intermediate_dim=_common.get(config, "n_inner", 4 * width),
            activation=_common.activation(config, "activation_function"),
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        ),
    )


def tensors(kwargs):
    """Every GPT-2 tensor: Conv1D kernels as they are, c_attn split in three."""
    width, inner = kwargs["hidden_dim"], kwargs["block_options"]["intermediate_dim"]
    p = "transformer."
    found = [
        Entry(
            f"{p}wte.weight", (kwargs["vocab_size"], width), ("embedding", "embeddings")
        ),
        Entry(
            f"{p}wpe.weight",
            (kwargs["position_options"]["max_length"], width),
            ("learned_positions", "embeddings"),
        ),
    ]
    found += _layer_norm(f"{p}ln_f", width, "final_norm")
    for i in range(kwargs["num_layers"]):
        h, attention = f"{p}h.{i}.", f"attention_{i}"
        found += _layer_norm(f"{h}ln_1", width, f"attention_norm_{i}")
        found += _layer_norm(f"{h}ln_2", width, f"ffn_norm_{i}")
        for n, sublayer in enumerate(("query_dense", "key_dense", "value_dense")):
            span = (n * width, (n + 1) * width)
            found.append(
                Entry(
                    f"{h}attn.c_attn.weight",
                    (width, 3 * width),
                    (attention, sublayer, "kernel"),
                    columns(*span),
                )
            )
            found.append(
                Entry(
                    f"{h}attn.c_attn.bias",
                    (3 * width,),
                    (attention, sublayer, "bias"),
                    columns(*span),
                )
            )
        for name, sublayer, shape in (
            ("attn.c_proj", (attention, "output_dense"), (width, width)),
            ("mlp.c_fc", (f"ffn_{i}", "up_dense"), (width, inner)),
            ("mlp.c_proj", (f"ffn_{i}", "down_dense"), (inner, width)),
        ):
            found.append(Entry(f"{h}{name}.weight", shape, sublayer + ("kernel",)))
            found.append(Entry(f"{h}{name}.bias", shape[1:], sublayer + ("bias",)))
    return found


def _layer_norm(name, width, layer):
    return [
        Entry(f"{name}.weight", (width,), (layer, "gamma")),
        Entry(f"{name}.bias", (width,), (layer, "beta")),
    ]
