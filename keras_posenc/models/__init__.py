"""Model builders: encoders, classifiers and causal LMs with any position method.

`keras_posenc.models` holds the builders (`build_encoder`,
`build_classifier`, `build_token_classifier`, `build_causal_lm`), the
`CausalLM` class, and the method table (`METHODS`) that every builder
assembles through one `TransformerStack`.
"""

from keras_posenc.models import capabilities
from keras_posenc.models.causal_lm import CausalLM, build_causal_lm
from keras_posenc.models.encoder import (
    POSITION_METHODS,
    RELATIVE_METHODS,
    build_classifier,
    build_encoder,
    build_token_classifier,
)
from keras_posenc.models.methods import (
    LOCAL_METHODS,
    LSH_METHODS,
    METHODS,
    SHARED_BIAS_METHODS,
    PositionMethod,
)
from keras_posenc.models.packed import PackedModel
from keras_posenc.models.stack import TransformerStack

__all__ = [
    "LOCAL_METHODS",
    "LSH_METHODS",
    "METHODS",
    "POSITION_METHODS",
    "RELATIVE_METHODS",
    "SHARED_BIAS_METHODS",
    "CausalLM",
    "PackedModel",
    "PositionMethod",
    "TransformerStack",
    "build_causal_lm",
    "build_classifier",
    "build_encoder",
    "build_token_classifier",
    "capabilities",
]
