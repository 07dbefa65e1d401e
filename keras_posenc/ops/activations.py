"""The feed-forward activations of the decoder blocks, written out in float32.

Each is built from ops that int8 TFLite and TFLM have kernels for where one
exists: GELU's tanh form from MUL, ADD and TANH (the converter would turn
`tf.nn.gelu` into the builtin GELU, which TFLM lacks), SiLU from LOGISTIC and
MUL. The exact GELU needs the error function (float only on a device).
"""

import math

from keras_posenc._backend import xp


def relu(x):
    """`max(x, 0)`."""
    return xp.nn.relu(x)


def gelu(x):
    """`x Phi(x)`, the exact GELU (HF's `"gelu"`)."""
    return 0.5 * x * (1.0 + xp.math.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    """GELU's tanh approximation (HF's `"gelu_new"`, `"gelu_pytorch_tanh"`)."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + xp.tanh(inner))


def silu(x):
    """`x sigmoid(x)` (SiLU, swish)."""
    return x * xp.sigmoid(x)


#: Every feed-forward activation, by the name `block_options` takes.
ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}
