"""Mistral: Llama's layout with a sliding window on every layer."""

from keras_posenc.models.families import llama

MODEL_TYPES = ("mistral",)
#: HF\'s config defaults of the keys read here.
DEFAULTS = {**llama.DEFAULTS, "max_position_embeddings": 32768}


def arguments(config):
    window = config.get("sliding_window")
    block = {}
    if window is not None:  # HF: every layer slides when a window is set
        block = {"sliding_window": int(window), "layer_types": None}
    return llama.arguments(config, **block)


tensors = llama.tensors
