"""keras_posenc: Transformer-style position encodings for TensorFlow/Keras.

The root holds the public layers and the role namespaces, as keras-hub's:
`keras_posenc.layers`, `keras_posenc.models`, `keras_posenc.ops`,
`keras_posenc.data`, `keras_posenc.training`, `keras_posenc.generation`,
`keras_posenc.samplers` and
`keras_posenc.utils` (`keras_posenc.viz` needs matplotlib: import it by name).
"""

from keras_posenc import _startup  # noqa: F401, I001 (first: TF start-up lines off)
from keras_posenc import (
    data,
    generation,
    layers,
    models,
    ops,
    samplers,
    training,
    utils,
)
from keras_posenc._compat import IS_KERAS_3
from keras_posenc.layers import *  # noqa: F403 (its __all__: the one list)

__version__ = "0.1.0"

__all__ = [
    "IS_KERAS_3",
    *layers.__all__,  # the public layers, listed once (`keras_posenc.layers`)
    "data",
    "generation",
    "layers",
    "models",
    "ops",
    "samplers",
    "training",
    "utils",
]
