"""Gemma (1): Llama's layout with `(1 + w)` RMS scales, sqrt(D) embeddings,
GeGLU and tied embeddings."""

from keras_posenc.models.families import _common, llama

MODEL_TYPES = ("gemma",)
#: HF's `GemmaConfig` defaults of the keys read here.
DEFAULTS = {
    **llama.DEFAULTS,
    "hidden_act": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "head_dim": 256,
    "max_position_embeddings": 8192,
}


def arguments(config):
    config = dict(
        config, hidden_act=config.get("hidden_activation") or config.get("hidden_act")
    )
    _common.refuse_set(config, ["use_bidirectional_attention"], "causal LMs only")
    return llama.arguments(config, norm_unit_offset=True, scale_embeddings=True)


tensors = llama.tensors
