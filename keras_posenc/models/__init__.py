"""Model builders: encoders, classifiers and causal LMs with any position method.

`keras_posenc.models` holds the builders (`build_encoder`,
`build_classifier`, `build_token_classifier`, `build_causal_lm`), the
`CausalLM` class, and the method table (`METHODS`) that every builder
assembles through one `TransformerStack` (or, with `block_options`, the
described `DecoderStack`); `from_hf` loads a Hugging Face checkpoint folder.
"""

from keras_posenc.models import blocks, capabilities, families
from keras_posenc.models.causal_lm import CausalLM, build_causal_lm
from keras_posenc.models.decoder_stack import DecoderStack
from keras_posenc.models.encoder import (
    POSITION_METHODS,
    RELATIVE_METHODS,
    build_classifier,
    build_encoder,
    build_token_classifier,
)
from keras_posenc.models.families import from_hf, from_keras_hub
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
    "DecoderStack",
    "PackedModel",
    "PositionMethod",
    "TransformerStack",
    "build_causal_lm",
    "build_classifier",
    "build_encoder",
    "blocks",
    "build_token_classifier",
    "capabilities",
    "families",
    "from_hf",
    "from_keras_hub",
]
