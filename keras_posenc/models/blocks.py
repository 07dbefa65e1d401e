"""`block_options`: what a decoder layer is made of, one dict of that concern.

The keys are the names keras-hub and HF transformers users know. Every key
has a default that keeps the package's first block (post-norm LayerNorm, a
ReLU feed-forward of width 2D, biases everywhere, untied embeddings), so
`block_options={}` describes it; a family's mapping (`keras_posenc.models.
families`) sets the keys its config names. `DecoderStack` reads the checked
record. Per-layer positions (`nope_layers`, `layer_rope`) are position keys:
`position_options`.
"""

import dataclasses
import math

from keras_posenc import _checks
from keras_posenc.layers.decoder_attention import check_temperature
from keras_posenc.ops.activations import ACTIVATIONS

#: The norms a block may use.
NORMS = ("layer", "rms")
#: The attention kinds of `layer_types`: every key, or a sliding window.
LAYER_TYPES = ("full", "sliding")
#: `position_options` keys that `block_options` models read per layer.
LAYER_POSITION_KEYS = ("nope_layers", "layer_rope")


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """The checked `block_options` of a stack of `num_layers` layers.

    Attributes:
        norm: `"layer"` (LayerNorm) or `"rms"` (RMSNorm).
        norm_epsilon: float, every norm's epsilon (1e-5 layer, 1e-6 rms).
        norm_unit_offset: bool, RMS norms scale by `1 + w` (Gemma).
        norm_first: bool, pre-norm blocks `x + f(norm(x))` (else post-norm
            `norm(x + f(x))`).
        embedding_norm: bool, a norm on the embeddings (default: post-norm).
        final_norm: bool, a norm before the head (default: pre-norm).
        post_norms: bool, norms on the attention's and the feed-forward's
            outputs before their residual sums (Gemma 2/3).
        intermediate_dim: int, the feed-forward width I (default 2D).
        activation: str, a key of `ops.activations.ACTIVATIONS`.
        gated: bool, a gated feed-forward (SwiGLU, GeGLU).
        use_bias: bool, biases on every projection.
        qkv_bias: bool or None, query/key/value biases apart (Qwen 2).
        tie_embeddings: bool, the head is the embedding's transpose.
        qk_norm: bool, an RMS norm of every query and key head (Qwen 3,
            Gemma 3).
        qk_norm_epsilon: float or None, its epsilon (default `norm_epsilon`).
        head_dim: int, H (default D / N).
        query_scale: float or None, the queries' factor (default H^-1/2).
        scale_embeddings: bool, embeddings times sqrt(D) (Gemma).
        layer_types: tuple of `LAYER_TYPES`, one per layer.
        sliding_window: int or None, the sliding layers' window W.
        attention_sinks: bool, a learned sink logit per head (gpt-oss).
        nope_temperature: dict or None, Llama 4's query temperature
            (`floor_scale`, `attn_scale`) on the NoPE layers (`nope_layers`).
    """

    norm: str = "layer"
    norm_epsilon: float = None
    norm_unit_offset: bool = False
    norm_first: bool = False
    embedding_norm: bool = None
    final_norm: bool = None
    post_norms: bool = False
    intermediate_dim: int = None
    activation: str = "relu"
    gated: bool = False
    use_bias: bool = True
    qkv_bias: bool = None
    tie_embeddings: bool = False
    qk_norm: bool = False
    qk_norm_epsilon: float = None
    head_dim: int = None
    query_scale: float = None
    scale_embeddings: bool = False
    layer_types: tuple = None
    sliding_window: int = None
    attention_sinks: bool = False
    nope_temperature: dict = None


#: Every key of `block_options`, in `BlockOptions`' order.
BLOCK_KEYS = tuple(field.name for field in dataclasses.fields(BlockOptions))
_BOOLEANS = (
    "norm_unit_offset",
    "norm_first",
    "embedding_norm",
    "final_norm",
    "post_norms",
    "gated",
    "use_bias",
    "qkv_bias",
    "tie_embeddings",
    "qk_norm",
    "scale_embeddings",
    "attention_sinks",
)


def check_block_options(block_options, hidden_dim, num_heads, num_layers):
    """The `BlockOptions` of `block_options` (a dict), every key checked."""
    if not isinstance(block_options, dict):
        _checks.fail(
            "block_options", "a dict (or None)", block_options, error=TypeError
        )
    unknown = sorted(set(block_options) - set(BLOCK_KEYS))
    if unknown:
        _checks.fail(
            "block_options",
            f"a dict with keys among {list(BLOCK_KEYS)}",
            block_options,
            fix=f"Unknown: {unknown}",
        )
    given = dict(block_options)
    for key in _BOOLEANS:
        if given.get(key) is not None:
            given[key] = _checks.boolean(key, given[key])
    given["norm"] = _checks.choice("norm", given.get("norm", "layer"), NORMS)
    epsilon = given.get("norm_epsilon")
    if epsilon is None:
        epsilon = 1e-5 if given["norm"] == "layer" else 1e-6
    given["norm_epsilon"] = _checks.positive_float("norm_epsilon", epsilon)
    if given.get("norm_unit_offset") and given["norm"] != "rms":
        _checks.fail("norm_unit_offset", "False unless norm='rms'", True)
    first = given.get("norm_first", False)
    for key, default in (("embedding_norm", not first), ("final_norm", first)):
        given[key] = default if given.get(key) is None else given[key]
    for key, default in (("intermediate_dim", 2 * hidden_dim), ("head_dim", None)):
        value = given.get(key, default)
        given[key] = _checks.positive_int(key, value, allow_none=True)
    if given["head_dim"] is None and hidden_dim % num_heads:
        _checks.fail("hidden_dim", f"divisible by num_heads={num_heads}", hidden_dim)
    given["head_dim"] = given["head_dim"] or hidden_dim // num_heads
    given["activation"] = _checks.choice(
        "activation", given.get("activation", "relu"), tuple(ACTIVATIONS)
    )
    if given.get("qk_norm_epsilon") is not None:
        given["qk_norm_epsilon"] = _checks.positive_float(
            "qk_norm_epsilon", given["qk_norm_epsilon"]
        )
    if given.get("query_scale") is not None:
        given["query_scale"] = _checks.positive_float(
            "query_scale", given["query_scale"]
        )
    given["nope_temperature"] = check_temperature(given.get("nope_temperature"))
    given.update(_layer_types(given, num_layers))
    return BlockOptions(**given)


def _layer_types(given, num_layers):
    """`{"layer_types": tuple, "sliding_window": W}`, checked together."""
    window = _checks.positive_int(
        "sliding_window", given.get("sliding_window"), allow_none=True
    )
    types = given.get("layer_types")
    if types is None:
        types = ("sliding" if window else "full",) * num_layers
    if not isinstance(types, (list, tuple)) or len(types) != num_layers:
        _checks.fail(
            "layer_types", f"a list of {num_layers} names (one per layer)", types
        )
    types = tuple(_checks.choice("layer_types", t, LAYER_TYPES) for t in types)
    if "sliding" in types and window is None:
        _checks.fail(
            "sliding_window",
            "an int >= 1 when layer_types has 'sliding' layers",
            window,
        )
    return {"layer_types": types, "sliding_window": window}


def embedding_factor(options, hidden_dim):
    """The embeddings' factor: sqrt(D) with `scale_embeddings`, else None."""
    return math.sqrt(hidden_dim) if options.scale_embeddings else None
