"""Checkpoints in: each family's config keys and tensors mapped onto a `CausalLM`.

A family is one module with `MODEL_TYPES`, `arguments(config)` (the
`CausalLM` keyword arguments its config describes, `block_options` included)
and `tensors(config, arguments)` (every checkpoint tensor: its name, the
shape the config implies and the weight it fills). `from_hf(path)` reads a
folder as `save_pretrained` writes it; everything is checked before a model
is built: the model type, keys that would change the answer, missing, extra
and misshapen tensors.
"""

import numpy as np

from keras_posenc import _checks
from keras_posenc.models.causal_lm import CausalLM
from keras_posenc.models.families import (
    gemma,
    gemma3,
    gpt2,
    llama,
    mistral,
    phi3,
    qwen2,
    qwen3,
    smollm3,
)
from keras_posenc.models.families.folder import Tensors, read_config

#: Every importable HF `model_type`, with its family module.
FAMILIES = {
    model_type: module
    for module in (llama, mistral, qwen2, qwen3, gemma, gemma3, smollm3, gpt2, phi3)
    for model_type in module.MODEL_TYPES
}
#: Config keys of layers the package does not build (mixture of experts).
MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
)
#: Checkpoint tensors a model may hold that carry no weight of ours.
DERIVED = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")

__all__ = ["FAMILIES", "from_hf", "from_keras_hub", "import_arguments"]


def import_arguments(config):
    """`(family module, CausalLM arguments)` of an HF config dict, checked."""
    if not isinstance(config, dict):
        _checks.fail("config", "a dict (a config.json)", config, error=TypeError)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        _checks.fail(
            "config['model_type']",
            f"one of {sorted(FAMILIES)}",
            model_type,
            fix="Other families are not mapped yet",
        )
    for key in MOE_KEYS:
        if config.get(key):
            _checks.fail(
                f"config[{key!r}]",
                "unset (mixture-of-experts layers are not built)",
                config[key],
            )
    if config.get("quantization_config"):
        _checks.fail(
            "config['quantization_config']",
            "absent (a pre-quantized checkpoint, e.g. GPTQ, AWQ or "
            "bitsandbytes, holds no float weights to import)",
            config["quantization_config"].get("quant_method", "set"),
        )
    family = FAMILIES[model_type]
    given = {key: value for key, value in config.items() if value is not None}
    return family, family.arguments({**family.DEFAULTS, **given})


def from_hf(path):
    """A `CausalLM` with the weights of a Hugging Face checkpoint folder.

    Args:
        path: str, a folder as `save_pretrained` writes it: `config.json`,
            `model.safetensors` or its shards, weights in float32, float16 or
            bfloat16 (read as float32, exactly).

    Returns:
        A `CausalLM` (block options, per-layer positions and RoPE scaling
        from the config) whose logits are the checkpoint's.

    Example:

    >>> import keras_posenc  # doctest: +SKIP
    >>> lm = keras_posenc.models.from_hf("path/to/Qwen3-0.6B")  # doctest: +SKIP
    >>> lm.generate([[9707, 11]], max_new_tokens=8)  # doctest: +SKIP
    """
    config = read_config(path)
    family, kwargs = import_arguments(config)
    return _load(family, kwargs, Tensors(path))


def from_keras_hub(model):
    """A `CausalLM` with the weights of a keras-hub `CausalLM` or `Backbone`.

    Args:
        model: a keras-hub Llama, Llama 3, Mistral, Qwen (2), Qwen 3, Gemma,
            Gemma 3 (text) or GPT-2 `CausalLM` or `Backbone`.

    Returns:
        A `CausalLM` whose logits are the keras-hub model's.

    Example:

    >>> import keras_hub, keras_posenc  # doctest: +SKIP
    >>> hub = keras_hub.models.Gemma3CausalLM.from_preset(  # doctest: +SKIP
    ...     "gemma3_instruct_1b")
    >>> lm = keras_posenc.models.from_keras_hub(hub)  # doctest: +SKIP
    """
    from keras_posenc.models.families import keras_hub

    config, arrays = keras_hub.hf_checkpoint(model)
    family, kwargs = import_arguments(config)
    overrides = keras_hub.BLOCK_OVERRIDES.get(keras_hub.backbone_name(model), {})
    kwargs["block_options"].update(overrides)
    return _load(family, kwargs, ArrayTensors(arrays))


class ArrayTensors:
    """Tensors held in memory, read as `Tensors` reads a folder's."""

    def __init__(self, arrays):
        self.arrays = dict(arrays)

    def names(self):
        return set(self.arrays)

    def shape(self, name):
        return tuple(self.arrays[name].shape)

    def read(self, name):
        return self.arrays[name]


def _load(family, kwargs, tensors):
    """The `CausalLM` of `kwargs` with `tensors`, every tensor checked first."""
    entries = family.tensors(kwargs)
    _check_tensors(entries, tensors, kwargs)
    model = CausalLM(**kwargs)
    read = {}
    for entry in entries:
        if entry.name not in read:
            read[entry.name] = tensors.read(entry.name).astype(np.float32)
        array = read[entry.name]
        if entry.transform is not None:
            array = entry.transform(array)
        _assign(_weight(model, entry.target), array, entry.name)
    return model


def _check_tensors(entries, tensors, kwargs):
    """Missing, left-over and misshapen tensors, each refused by name."""
    names = tensors.names()
    wanted = {entry.name: entry.shape for entry in entries}
    for name, shape in wanted.items():
        if name not in names:
            _checks.fail(name, "a tensor of the checkpoint", "missing")
        found = tensors.shape(name)
        if tuple(found) != tuple(shape):
            _checks.fail(
                name,
                f"shape {tuple(shape)} (the config's sizes)",
                f"shape {tuple(found)}",
            )
    tied = kwargs["block_options"].get("tie_embeddings")
    extra = sorted(
        name
        for name in names - set(wanted)
        if not name.endswith(DERIVED) and not (tied and name == "lm_head.weight")
    )
    if extra:
        _checks.fail(
            "path",
            "a checkpoint whose every tensor has a place in the model",
            extra[:5],
            fix=f"{len(extra)} tensors left over",
        )


def _weight(model, target):
    layer = model.get_layer(target[0])
    for name in target[1:]:
        layer = getattr(layer, name)
    return layer


def _assign(variable, array, name):
    expected = tuple(variable.shape)
    if tuple(array.shape) != expected:
        _checks.fail(name, f"a tensor of shape {expected}", f"shape {array.shape}")
    variable.assign(array)
