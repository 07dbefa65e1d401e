"""FIRE: an MLP of progressively interpolated log distances."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    add_float32_weight,
    dim,
    keras,
    register,
)
from keras_posenc.layers._bias_layer import BiasLayer, distance_mlp


@register
class FireBias(BiasLayer):
    """Bias `B[h, i, j] = MLP(psi(i - j) / psi(max(i, L)))[h]`, `psi = log(|c x| + 1)`.

    FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions"):
    the log transform `psi` (learned `c`) spreads the near distances apart,
    and dividing by `psi(max(i, L))` of the query position ("progressive
    interpolation") maps every query's keys into `[0, 1]` however long the
    sequence grows, which is what lets FIRE extrapolate; the threshold `L`
    (a learned multiplier of `initial_threshold`) keeps short sequences from
    being stretched. A `1 -> hidden_dim -> N` ReLU MLP turns each value into
    a per-head bias. Initial values as in the paper's appendix: `c = 0.1`,
    `L = 512`. Bidirectional, the sign of `i - j` is kept so keys after the
    query are told apart (the paper is causal). Because of `max(i, L)` the
    bias is not a function of `j - i` alone: it is evaluated on the `(T, S)`
    grid (the MLP runs `T * S` times, `(T, S, hidden_dim)` floats; in
    training, while every query is below `L`, on the `T + S - 1` distinct
    distances, the same values: `call`), and a decoding export stores it for
    every `(S_max, S_max)` pair. With static
    shapes it folds into a constant in TFLite (no LOG runs on the device).
    Follows the bias contract: `(1, N, T, S)`, or `(B, N, T, S)` for
    per-example positions. All position math runs in float32.

    Args:
        num_heads: int, the number of attention heads N.
        hidden_dim: int, the MLP width. Defaults to `32`.
        bidirectional: bool, whether the sign of `i - j` is kept (False for
            causal models). Defaults to `True`.
        initial_threshold: float, `L` before training (the learned
            multiplier starts at 1). Defaults to `512.0`.
        kernel_initializer: str or initializer, for the MLP kernels.
            Defaults to `"glorot_uniform"`.

    Call arguments:
        query: tensor `(B, T, ...)`; only its length is used.
        key: optional tensor `(B, S, ...)`; defaults to `query`.
        start_index: int or scalar tensor, the position of the first query
            token. Defaults to `0`.
        positions: optional tensor `(T,)` or `(B, T)` of query positions.
        key_positions: optional tensor `(S,)` or `(B, S)` of key positions.
        training: bool or None, Keras' training flag. In training, while
            every query position is below `L`, the MLP runs on the distinct
            distances only (the same bias, faster: `call`). Defaults to
            `None` (the grid).

    Returns:
        A `(1, N, T, S)` (or `(B, N, T, S)`) bias in the compute dtype.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> bias = keras_posenc.FireBias(num_heads=4, bidirectional=False)
    >>> bias(tf.zeros((2, 6, 8))).shape
    TensorShape([1, 4, 6, 6])

    References:
        - [Li et al., 2024 (FIRE)](https://arxiv.org/abs/2310.04418)
    """

    translation_invariant = False

    def __init__(
        self,
        num_heads,
        hidden_dim=32,
        bidirectional=True,
        initial_threshold=512.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
        bidirectional = _checks.boolean("bidirectional", bidirectional)
        initial_threshold = _checks.positive_float(
            "initial_threshold", initial_threshold
        )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.bidirectional = bidirectional
        self.initial_threshold = initial_threshold
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, query_shape=None, key_shape=None):
        self.mlp = distance_mlp(
            1, self.hidden_dim, 1, self.num_heads, self.kernel_initializer
        )
        self.c = add_float32_weight(
            self, name="c", shape=(), initializer=keras.initializers.Constant(0.1)
        )
        self.threshold_multiplier = add_float32_weight(
            self,
            name="threshold_multiplier",
            shape=(),
            initializer=keras.initializers.Constant(1.0),
        )
        self.built = True

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "bidirectional": self.bidirectional,
                "initial_threshold": self.initial_threshold,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config

    def call(
        self,
        query,
        key=None,
        start_index=0,
        positions=None,
        key_positions=None,
        training=None,
    ):
        """The bias contract's `call`; in training, distinct distances when it can.

        While every query position is below `L`, `psi(max(i, L))` is
        `psi(L)` for every query and the bias depends on `j - i` alone: in
        training (`training=True`, default positions) the MLP then runs
        on the `T + S - 1` distinct distances and the row is expanded, the
        same values as the grid's (a training step of a 2-layer classifier
        at T=512: `benchmarks/results/speed_steps.md`). Past `L`, and
        outside training (exports keep one graph without a branch), the
        MLP runs on the `(T, S)` grid.
        """
        grid = super().call  # translation_invariant is False: the grid
        if not training or positions is not None or key_positions is not None:
            return grid(query, key, start_index, positions, key_positions)
        key = query if key is None else key
        query_length, key_length = dim(query, 1), dim(key, 1)
        last = xp.cast(start_index + query_length - 1, xp.float32)

        def distinct():
            bias = self._bias_on_distinct_distances(
                query_length, key_length, start_index
            )
            return self._returned(bias)

        return xp.cond(
            last < self.threshold, distinct, lambda: grid(query, key, start_index)
        )

    @property
    def threshold(self):
        """`L = |multiplier * initial_threshold|`, a float32 scalar."""
        return xp.abs(self.threshold_multiplier * self.initial_threshold)

    def bias_between(self, query_positions, key_positions):
        """Float32 bias `(..., N, T, S)` between positions `(..., T)`, `(..., S)`."""
        x = ops.kernels.fire_distances(
            query_positions, key_positions, self.c, self.threshold, self.bidirectional
        )[..., None]  # (..., T, S, 1)
        for layer in self.mlp:
            x = layer(x)
        return ops.heads_first(x)  # (..., N, T, S)
