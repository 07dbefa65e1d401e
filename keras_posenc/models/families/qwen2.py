"""Qwen 2 / 2.5: Llama's layout with biases on the query, key and value only."""

from keras_posenc.models.families import llama

MODEL_TYPES = ("qwen2",)
#: HF\'s config defaults of the keys read here.
DEFAULTS = {**llama.DEFAULTS, "max_position_embeddings": 32768}


def arguments(config):
    return llama.arguments(dict(config, attention_bias=False), qkv_bias=True)


tensors = llama.tensors
