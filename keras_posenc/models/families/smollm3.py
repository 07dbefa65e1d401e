"""SmolLM3: Llama's layout with NoPE layers (`no_rope_layers`: 0 = no RoPE)."""

from keras_posenc.models.families import llama

MODEL_TYPES = ("smollm3",)
#: HF\'s config defaults of the keys read here.
DEFAULTS = {
    **llama.DEFAULTS,
    "max_position_embeddings": 32768,
    "rope_theta": 2000000.0,
    "tie_word_embeddings": True,
}


def arguments(config):
    kwargs = llama.arguments(config)
    flags = config.get("no_rope_layers")
    if flags is None:  # HF's default: every `no_rope_layer_interval`-th layer
        interval = config.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(kwargs["num_layers"])]
    nope = [i for i, uses_rope in enumerate(flags) if not uses_rope]
    if nope:
        kwargs["position_options"]["nope_layers"] = nope
    return kwargs


tensors = llama.tensors
