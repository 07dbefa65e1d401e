"""KERPLE: a learned conditionally-positive-definite kernel of the distance."""

import numpy as np

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import add_float32_weight, keras, register
from keras_posenc.layers._bias_layer import BiasLayer
from keras_posenc.ops.kernels import KERPLE_KERNELS

#: The smallest `r1` and `r2` (the paper's clamp), and the largest power.
MIN_PARAMETER = 0.01
MAX_POWER = 2.0


class _Clamp(keras.constraints.Constraint):
    """Keeps a weight in `[low, high]` after every optimizer step."""

    def __init__(self, low, high=None):
        self.low, self.high = low, high

    def __call__(self, w):
        return xp.clip_by_value(w, self.low, np.inf if self.high is None else self.high)

    def get_config(self):
        return {"low": self.low, "high": self.high}


@register
class KerpleBias(BiasLayer):
    """Per-head bias `B[h, i, j] = -r1 log(1 + r2 |j - i|)` or `-r1 |j - i|^r2`.

    KERPLE (Chi et al. 2022): a shift-invariant, conditionally positive
    definite kernel of the distance `d = |j - i|` with two learned positive
    parameters per head, the log kernel `-r1 log(1 + r2 d)` (the paper's
    best) or the power kernel `-r1 d^r2` (`0 < r2 <= 2`; ALiBi is `r2 = 1`
    with fixed `r1`). Both are 0 at `d = 0` and fall without bound, so the
    bias extrapolates to any length. `r1` and `r2` stay at or above 0.01
    (and the power at most 2): a constraint clamps them after every step, as
    the paper does, and the call clamps them too. With `bidirectional=True`,
    keys before and after the query have their own `r1, r2` (a symmetric
    kernel cannot tell left from right). Follows the bias contract:
    `(1, N, T, S)`, computed on the `T + S - 1` distinct distances; with
    static shapes it folds into a constant in TFLite (no LOG or POW runs on
    the device). Initial values as in the paper's code: for the log kernel
    `r1 ~ U(0, 2)`, `r2 ~ U(0, 1)`; for the power kernel `r1 ~ U(0, 1)`,
    `r2 ~ U(0, 2)`.

    Args:
        num_heads: int, the number of attention heads N.
        kernel: str, `"log"` or `"power"`. Defaults to `"log"`.
        bidirectional: bool, whether keys after the query get their own
            parameters (False for causal models). Defaults to `True`.

    Call arguments:
        query: tensor `(B, T, ...)`; only its length is used.
        key: optional tensor `(B, S, ...)`; defaults to `query`.
        start_index: int or scalar tensor, the position of the first query
            token. Defaults to `0`.
        positions: optional tensor `(T,)` or `(B, T)` of query positions.
        key_positions: optional tensor `(S,)` or `(B, S)` of key positions.

    Returns:
        A `(1, N, T, S)` (or `(B, N, T, S)`) bias in the compute dtype.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> bias = keras_posenc.KerpleBias(num_heads=4, bidirectional=False)
    >>> bias(tf.zeros((2, 6, 8))).shape
    TensorShape([1, 4, 6, 6])

    References:
        - [Chi et al., 2022 (KERPLE)](https://arxiv.org/abs/2205.09921)
    """

    def __init__(self, num_heads, kernel="log", bidirectional=True, **kwargs):
        num_heads = _checks.positive_int("num_heads", num_heads)
        kernel = _checks.choice("kernel", kernel, KERPLE_KERNELS)
        bidirectional = _checks.boolean("bidirectional", bidirectional)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.kernel = kernel
        self.bidirectional = bidirectional
        self.supports_masking = True

    def build(self, query_shape=None, key_shape=None):
        shape = (2, self.num_heads) if self.bidirectional else (self.num_heads,)
        r1_top, r2_top = (2.0, 1.0) if self.kernel == "log" else (1.0, MAX_POWER)
        r2_high = MAX_POWER if self.kernel == "power" else None
        for name, top, high in (("r1", r1_top, None), ("r2", r2_top, r2_high)):
            weight = add_float32_weight(
                self,
                name=name,
                shape=shape,
                initializer=keras.initializers.RandomUniform(0.0, top),
                constraint=_Clamp(MIN_PARAMETER, high),
                trainable=True,
            )
            setattr(self, name, weight)
        self.built = True

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "kernel": self.kernel,
                "bidirectional": self.bidirectional,
            }
        )
        return config

    def bias_between(self, query_positions, key_positions):
        """Float32 bias `(..., N, T, S)` between positions `(..., T)`, `(..., S)`."""
        relative = ops.relative_positions(query_positions, key_positions)
        high = MAX_POWER if self.kernel == "power" else np.inf
        r1 = xp.maximum(self.r1, MIN_PARAMETER)
        r2 = xp.clip_by_value(self.r2, MIN_PARAMETER, high)
        return ops.kernels.kerple_bias(relative, r1, r2, self.kernel)
