"""Mistral: Llama's layout with a sliding window on every layer."""

from keras_posenc.models.families import llama

MODEL_TYPES = ("mistral",)


def arguments(config):
    window = config.get("sliding_window")
    block = {}
    if window is not None:  # HF: every layer slides when a window is set
        block = {"sliding_window": int(window), "layer_types": None}
    return llama.arguments(config, **block)


tensors = llama.tensors
