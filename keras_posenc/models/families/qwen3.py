"""Qwen 3: Llama's layout with an RMS norm of every query and key head."""

from keras_posenc.models.families import llama

MODEL_TYPES = ("qwen3",)
#: HF\'s config defaults of the keys read here.
DEFAULTS = {**llama.DEFAULTS, "max_position_embeddings": 32768}


def arguments(config):
    return llama.arguments(config, qk_norm=True)


tensors = llama.tensors
