"""The forgetting gate (FoX): a decay bias the network computes from content."""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    build_sublayer,
    clone_initializer,
    incoming_mask,
    keep_float32_inputs,
    keras,
    register,
)

#: The most negative bias returned (exp(-1e4) is 0 in every float dtype).
BIAS_FLOOR = -1e4


@register
class ForgettingGate(keras.layers.Layer):
    """Bias `B[h, i, j] = sum_{l=j+1..i} log f_l^h`, `f_t = sigmoid(W x_t + b)`.

    The Forgetting Transformer's gate (Lin et al. 2025), a data-dependent
    ALiBi: each token's hidden state `x_t` `(B, T, D)` sets, per head, how
    much of the past it lets through, `f_t = sigmoid(w_h . x_t + b_h)`, and
    the attention logit of query `i` on key `j <= i` gets the sum of the log
    gates of the tokens after the key up to the query: `c_i - c_j` with `c`
    the running sum of `log f`. Unlike ALiBi's fixed slope, the decay is
    computed from content: a token can close the window behind it. Causal
    (`bidirectional=False`) keys after the query get 0 (the causal mask
    removes them); with `bidirectional=True` a second gate `g` gives keys
    after the query `sum_{l=i..j-1} log g_l` (x-transformers'
    data-dependent ALiBi for encoders). Padded tokens (a Keras mask) get
    `log f = 0`: they change no real token's bias. The gate bias starts at
    `initial_bias` (5: `f = 0.993`, nearly no forgetting at the start). The
    bias `(B, N, T, T)` truly depends on content, so it is per example; it
    reaches the attention through `attention_bias` (the builders do this).
    Decoding (`step`) needs no sum over the history: the cache holds each
    position's running sum `c_j` `(B, S_max, N)`, and a new token adds its
    log gate to the previous one's. All gate math runs in float32; the bias
    is floored at -1e4 (its softmax weight is 0 either way; the floor passes
    its gradient straight through, which attention zeroes) and returned in
    the compute dtype. For block-local attention (`attention_window=W` on
    both layers) the gate returns the same bias on the attention's band,
    `(B, N*nb, W, 3W)` (`ops.forgetting.decay_band`): the `(T, T)` matrix
    is never built.

    Args:
        num_heads: int, the number of attention heads N.
        bidirectional: bool, a second (backward) gate for keys after the
            query. Defaults to `True`.
        initial_bias: float, the gates' initial bias `b`. Defaults to `5.0`.
        kernel_initializer: str or initializer, for `W`.
            Defaults to `"glorot_uniform"`.
        attention_window: int W or None: return the bias on the band of a
            `RelativeMultiHeadAttention(attention_window=W)` (its
            `attention_bias` layout). Defaults to `None` (dense).

    Call arguments:
        inputs: float tensor `(B, T, D)`, the hidden states the attention
            reads.
        mask: optional boolean `(B, T)`, real tokens (Keras' mask by default).
        training: bool or None, Keras' training flag. In training the dense
            bias runs as one XLA-compiled function
            (`ops.forgetting.decay_bias(fused=True)`, the same values in one
            pass over `(B, N, T, T)` where TensorFlow's kernels make four);
            outside training (inference, every export) plain ops.

    Returns:
        A bias `(B, N, T, T)` in the compute dtype (`(B, N*nb, W, 3W)` with
        `attention_window`, nb = ceil(T / W)).

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> gate = keras_posenc.ForgettingGate(num_heads=2, bidirectional=False)
    >>> x = tf.random.normal((1, 5, 8))
    >>> attention = keras_posenc.RelativeMultiHeadAttention(num_heads=2, key_dim=4)
    >>> attention(x, attention_bias=gate(x), use_causal_mask=True).shape
    TensorShape([1, 5, 8])

    Block-local, the gate gives the band's bias:

    >>> gate = keras_posenc.ForgettingGate(2, bidirectional=False, attention_window=2)
    >>> local = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4, attention_window=2
    ... )
    >>> gate(x).shape  # (B, N * ceil(5 / 2), W, 3W)
    TensorShape([1, 6, 2, 6])
    >>> local(x, attention_bias=gate(x), use_causal_mask=True).shape
    TensorShape([1, 5, 8])

    References:
        - [Lin et al., 2025 (Forgetting Transformer)](https://arxiv.org/abs/2503.02130)
    """

    def __init__(
        self,
        num_heads,
        bidirectional=True,
        initial_bias=5.0,
        kernel_initializer="glorot_uniform",
        attention_window=None,
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        bidirectional = _checks.boolean("bidirectional", bidirectional)
        attention_window = _checks.positive_int(
            "attention_window", attention_window, allow_none=True
        )
        if isinstance(initial_bias, bool) or not isinstance(initial_bias, (int, float)):
            _checks.fail("initial_bias", "a number", initial_bias, error=TypeError)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.bidirectional = bidirectional
        self.initial_bias = float(initial_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.attention_window = attention_window
        self.supports_masking = True
        keep_float32_inputs(self)  # the gates run in float32

    def build(self, input_shape):
        width = _checks.known_width(input_shape)
        gates = 2 if self.bidirectional else 1
        self.gate_dense = keras.layers.Dense(
            gates * self.num_heads,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=keras.initializers.Constant(self.initial_bias),
            dtype="float32",
            name="gate",
        )
        build_sublayer(self.gate_dense, (None, None, width))
        self.built = True

    def call(self, inputs, mask=None, training=None):
        log_forward, log_backward = self.log_gates(inputs, incoming_mask(inputs, mask))
        if self.attention_window is None:
            # A weight of exactly 0 either way; float16 would overflow to -inf.
            bias = ops.forgetting.decay_bias(
                log_forward, log_backward, BIAS_FLOOR, fused=training is True
            )
        else:
            window = self.attention_window
            bias = ops.forgetting.decay_band(log_forward, log_backward, window)
            bias = xp.maximum(bias, BIAS_FLOOR)
        return xp.cast(bias, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        length, window = input_shape[1], self.attention_window
        if window is None:
            return (input_shape[0], self.num_heads, length, length)
        folded = None if length is None else self.num_heads * -(-length // window)
        return (input_shape[0], folded, window, 3 * window)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "bidirectional": self.bidirectional,
                "initial_bias": self.initial_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "attention_window": self.attention_window,
            }
        )
        return config

    def log_gates(self, inputs, mask=None):
        """`(log f, log g or None)`, float32 `(B, T, N)` each; 0 where masked."""
        z = self.gate_dense(xp.cast(inputs, xp.float32))  # (B, T, gates * N)
        log_gates = xp.math.log_sigmoid(z)
        if mask is not None:
            log_gates = log_gates * xp.cast(mask, xp.float32)[:, :, None]
        if not self.bidirectional:
            return log_gates, None
        return log_gates[..., : self.num_heads], log_gates[..., self.num_heads :]

    def step(self, inputs, sums, index):
        """Bias of new tokens `(B, T, D)` at `index` against a cache of `S_max`.

        `sums` `(B, S_max, N)` holds the running sum `c_j` of every earlier
        position (the layer's decoding state). Returns the float32 bias
        `(B, N, T, S_max)` (slots after each query to be masked by the
        caller) and the updated `sums`.
        """
        if self.bidirectional:
            raise ValueError(
                "`bidirectional` must be False to decode step by step (a key "
                "after the query does not exist yet). Received: bidirectional=True"
            )
        log_forward, _ = self.log_gates(inputs)
        running, sums = ops.forgetting.step_sums(log_forward, sums, index)
        return ops.forgetting.step_bias(running, sums), sums

    def rolling_step(self, inputs, gates, index, sink_tokens):
        """`step` over a rolling cache of attention sinks (`sink_tokens`).

        `gates` `(B, S, N)` holds each cached slot's log-gate (the rolling
        state: `ops.forgetting.rolling_bias`), and the decay sums the gates
        of the tokens the cache holds between key and query. Returns the
        float32 bias `(B, N, T, S)` and the updated `gates`.
        """
        if self.bidirectional:
            raise ValueError(
                "`bidirectional` must be False to decode step by step (a key "
                "after the query does not exist yet). Received: bidirectional=True"
            )
        log_forward, _ = self.log_gates(inputs)
        return ops.forgetting.rolling_bias(log_forward, gates, index, sink_tokens)
