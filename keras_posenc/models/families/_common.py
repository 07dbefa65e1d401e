"""What the family mappings share: config reading, RoPE and weight assignment."""

import numpy as np

from keras_posenc import _checks

#: HF `hidden_act` names -> the feed-forward activations of `block_options`.
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
#: HF `rope_parameters` keys each `rope_type` may carry (beside `rope_type`,
#: `rope_theta` and `partial_rotary_factor`), and our name for each.
ROPE_KEYS = {
    "default": {},
    "linear": {"factor": "scaling_factor"},
    "dynamic": {"factor": "scaling_factor"},
    "yarn": {
        "factor": "scaling_factor",
        "original_max_position_embeddings": "original_max_position_embeddings",
        "beta_fast": "beta_fast",
        "beta_slow": "beta_slow",
        "attention_factor": "attention_factor",
        "truncate": "truncate",
        "mscale": None,  # DeepSeek's: refused unless unset
        "mscale_all_dim": None,
    },
    "longrope": {
        "factor": "scaling_factor",
        "original_max_position_embeddings": "original_max_position_embeddings",
        "short_factor": "short_factor",
        "long_factor": "long_factor",
        "attention_factor": "attention_factor",
    },
    "proportional": {"factor": "scaling_factor"},  # p-RoPE (Gemma 4)
    "llama3": {
        "factor": "scaling_factor",
        "original_max_position_embeddings": "original_max_position_embeddings",
        "low_freq_factor": "low_freq_factor",
        "high_freq_factor": "high_freq_factor",
    },
}
#: HF `layer_types` names -> ours.
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
#: Our rotary options that are `RotaryEmbedding` arguments of their own (the
#: rest go in its `rope_parameters`).
_SHARED = {
    "max_wavelength",
    "rotary_dim",
    "rope_type",
    "scaling_factor",
    "original_max_position_embeddings",
}


def get(config, key, default=None):
    """`config[key]`, or `default` when absent or null."""
    value = config.get(key)
    return default if value is None else value


def activation(config, key="hidden_act"):
    """The block activation of the config's `key`, or the refusal."""
    name = config.get(key)
    if name not in ACTIVATIONS:
        _checks.fail(f"config[{key!r}]", f"one of {sorted(ACTIVATIONS)}", name)
    return ACTIVATIONS[name]


def refuse_set(config, keys, why):
    """Refuses config keys that would change the answer when they are set."""
    for key in keys:
        if config.get(key) not in (None, False, 0):
            _checks.fail(f"config[{key!r}]", f"unset ({why})", config[key])


def rope_options(rope, config, head_dim):
    """The `RotaryEmbedding` options of one HF `rope_parameters` dict."""
    if not isinstance(rope, dict) or "rope_theta" not in rope:
        _checks.fail("config['rope_parameters']", "a dict with rope_theta", rope)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_KEYS:
        _checks.fail(
            "config['rope_parameters']['rope_type']",
            f"one of {sorted(ROPE_KEYS)}",
            rope_type,
        )
    names = ROPE_KEYS[rope_type]
    extra = set(rope) - set(names) - {"rope_type", "type", "rope_theta"}
    extra -= {"partial_rotary_factor"}
    if extra:
        _checks.fail(
            "config['rope_parameters']",
            f"keys among {sorted(names)} for rope_type={rope_type!r}",
            sorted(extra),
        )
    options = {"max_wavelength": float(rope["rope_theta"]), "rope_type": rope_type}
    fraction = float(get(rope, "partial_rotary_factor", 1.0))
    params = {}
    if rope_type == "proportional":  # turns part of the slots of every pair
        params["partial_rotary_factor"] = fraction
    elif fraction != 1.0:
        options["rotary_dim"] = int(head_dim * fraction)
    for key, ours in names.items():
        if rope.get(key) is None:
            continue
        if ours is None:
            _checks.fail(f"config['rope_parameters'][{key!r}]", "unset", rope[key])
        if ours in _SHARED:
            options[ours] = rope[key]
        else:
            params[ours] = rope[key]
    _fill_lengths(rope_type, options, config)
    if params:
        options["rope_parameters"] = params
    return options


def _fill_lengths(rope_type, options, config):
    """The factor and training length HF reads from the config itself."""
    if rope_type == "dynamic":  # HF: the config's max_position_embeddings
        options["original_max_position_embeddings"] = config["max_position_embeddings"]
    if rope_type in ("yarn", "longrope") and "scaling_factor" not in options:
        original = options.get("original_max_position_embeddings")
        if original is None:
            original = config.get("original_max_position_embeddings")
            options["original_max_position_embeddings"] = original
        options["scaling_factor"] = config["max_position_embeddings"] / original
    if rope_type == "longrope" and options["scaling_factor"] < 1.0:
        options["scaling_factor"] = 1.0  # HF: no attention factor then


def layer_types(config, num_layers):
    """Ours of the config's `layer_types` (every layer full when absent)."""
    types = config.get("layer_types")
    if types is None:
        return None
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown or len(types) != num_layers:
        _checks.fail(
            "config['layer_types']",
            f"{num_layers} names among {sorted(LAYER_TYPES)}",
            types,
        )
    return [LAYER_TYPES[t] for t in types]


def positions(config, head_dim, kinds):
    """`position_options` of the config's RoPE: shared, or per layer type."""
    rope = config.get("rope_parameters")
    if rope is None:  # an older config: rope_theta (and rope_scaling) apart
        rope = dict(
            config.get("rope_scaling") or {},
            rope_theta=config.get("rope_theta", 10000.0),
        )
    options = {"max_length": int(config["max_position_embeddings"])}
    if set(rope) <= set(LAYER_TYPES) and rope:  # nested by layer type
        options["layer_rope"] = {
            LAYER_TYPES[kind]: rope_options(value, config, head_dim)
            for kind, value in rope.items()
            if LAYER_TYPES[kind] in (kinds or ["full"])
        }
        return options
    options.update(rope_options(rope, config, head_dim))
    return options


class Entry:
    """One checkpoint tensor and where it goes.

    Attributes:
        name: str, the tensor's name in the checkpoint.
        shape: tuple, the shape the config implies for it.
        target: tuple of str, the layer name then attributes of the weight
            (`("attention_0", "query_dense", "kernel")`).
        transform: callable `array -> array` (a transpose, a slice of a
            fused tensor), or None.
    """

    def __init__(self, name, shape, target, transform=None):
        self.name, self.shape = name, tuple(shape)
        self.target, self.transform = tuple(target), transform


def transposed(array):
    return np.transpose(array)


def rows(begin, end, transpose=True):
    """A slice of a fused `(out, in)` tensor's rows, transposed to a kernel."""

    def take(array):
        part = array[begin:end]
        return np.transpose(part) if transpose else part

    return take


def columns(begin, end):
    """A slice of a fused Conv1D `(in, out)` kernel's columns (GPT-2)."""
    return lambda array: array[..., begin:end]


def dense(name, shape, layer, sublayer, bias=False, transform=transposed):
    """The entries of one linear layer: HF's `(out, in)` weight (and bias)."""
    target = (layer,) if sublayer is None else (layer, sublayer)
    found = [Entry(f"{name}.weight", shape, target + ("kernel",), transform)]
    if bias:
        found.append(Entry(f"{name}.bias", shape[:1], target + ("bias",)))
    return found
