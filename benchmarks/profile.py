"""Where attention time goes: each stage timed alone, ours and Keras'.

The stages of one attention call, each compiled alone (graph mode and XLA),
forward and forward+backward: the four projections, the logits `Q K^T`, the
position bias (ours only: T5, dynamic), the bias add, the softmax and the
value product, next to whole layers (Keras', ours without a bias, with T5
and with the dynamic bias) timed in the same rounds. Stage sums do not
equal the whole call (fusion, dispatch), but they show which stage a
speed-up has to come from.
"""

import numpy as np
import tensorflow as tf

from benchmarks._common import mean_seconds, write
from benchmarks.speed import attention_layers
from keras_posenc import DynamicPositionBias, RelativePositionBias, ops

keras = tf.keras
#: Rounds (every stage timed once per round, against drift) and calls per
#: timing; the table shows the median over rounds.
ROUNDS, LARGE_ROUNDS, CALLS = 15, 7, 5


def _steps(fn, variables, xla):
    """`(forward, forward+backward)` compiled steps of `fn`.

    A random upstream gradient, as in a real backward pass (with the ones
    of a plain sum, a gradient that does not read the forward folds away);
    the step returns the loss with the gradients, so the forward is never
    pruned as unused by the backward (a matmul's or a gather's gradient does
    not read its own output).
    """
    upstream = tf.random.stateless_normal(tf.shape(fn()), seed=(0, 1))

    @tf.function(jit_compile=xla)
    def forward():
        return tf.reduce_sum(fn() * upstream)

    @tf.function(jit_compile=xla)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn() * upstream)
        return loss, tape.gradient(loss, variables)

    return forward, step


def _round_robin(steps, rounds, calls):
    """`{key: median seconds per call}`, every step timed once per round."""
    for step in steps.values():
        step(), step()  # compile and warm up
    times = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            times[key].append(mean_seconds(step, calls))
    return {key: float(np.median(seconds)) for key, seconds in times.items()}


def _core(query, key, bias):
    """`softmax(Q K^T [+ bias]) V` on `(B, T, N, H)`, the value being the key."""
    logits = tf.einsum("btnh,bsnh->bnts", query, key)
    if bias is not None:
        logits = logits + bias
    return tf.einsum("bnts,bsnh->btnh", tf.nn.softmax(logits), key)


def stages(batch, length, width, heads):
    """`{stage: fn, variables}` on tensors shaped as the attention's."""
    size = width // heads
    x = tf.random.normal((batch, length, width))
    dense = [keras.layers.Dense(width) for _ in range(4)]
    for layer in dense:
        layer.build((batch, length, width))
    einsum = [
        keras.layers.EinsumDense("abc,cde->abde", (None, heads, size)) for _ in range(3)
    ] + [keras.layers.EinsumDense("abcd,cde->abe", (None, width))]
    for layer in einsum[:3]:
        layer.build((batch, length, width))
    einsum[3].build((batch, length, heads, size))
    q = tf.Variable(tf.random.normal((batch, heads, length, size)))
    k = tf.Variable(tf.random.normal((batch, heads, length, size)))
    logits = tf.Variable(tf.random.normal((batch, heads, length, length)))
    t5, dynamic = RelativePositionBias(heads, "t5"), DynamicPositionBias(heads)
    t5(x), dynamic(x)  # builds
    heads_x = tf.random.normal((batch, length, heads, size))
    row = tf.Variable(tf.random.normal((heads, 2 * length - 1)))
    index = tf.range(length)[None, :] - tf.range(length)[:, None] + (length - 1)
    bias = tf.Variable(tf.random.normal((1, heads, length, length)))
    long_row = tf.Variable(tf.random.normal((2, 2 * 2048 - 1)))
    long_index = tf.range(2048)[None, :] - tf.range(2048)[:, None] + 2047
    heads_q = tf.Variable(tf.random.normal((batch, length, heads, size)))
    heads_k = tf.Variable(tf.random.normal((batch, length, heads, size)))
    wholes = {"Keras MultiHeadAttention": keras.layers.MultiHeadAttention(heads, size)}
    for name, layer in attention_layers(heads, size).items():
        if name in ("none", "t5", "dynamic_bias"):
            wholes[f"RelativeMultiHeadAttention, {name}"] = layer
    for layer in wholes.values():
        layer(x, x)  # builds
    return {
        **{
            f"whole layer: {name}": (
                lambda layer=layer: layer(x, x),
                layer.trainable_variables,
            )
            for name, layer in wholes.items()
        },
        "projections (Dense, ours)": (
            lambda: sum(tf.reduce_sum(layer(x)) for layer in dense),
            [w for layer in dense for w in layer.trainable_variables],
        ),
        "projections (EinsumDense, Keras)": (
            lambda: (
                sum(tf.reduce_sum(layer(x)) for layer in einsum[:3])
                + tf.reduce_sum(einsum[3](heads_x))
            ),
            [w for layer in einsum for w in layer.trainable_variables],
        ),
        "logits Q K^T: einsum on (B, T, N, H) (ours)": (
            lambda: tf.einsum("btnh,bsnh->bnts", heads_q, heads_k),
            [heads_q, heads_k],
        ),
        "logits Q K^T: Keras' einsum aecd,abcd->acbe": (
            lambda: tf.einsum("aecd,abcd->acbe", heads_k, heads_q),
            [heads_q, heads_k],
        ),
        "logits Q K^T: matmul on (B, N, T, H) (ours before)": (
            lambda: tf.matmul(q, k, transpose_b=True),
            [q, k],
        ),
        "bias t5 (1, N, T, S)": (lambda: t5(x), t5.trainable_variables),
        "bias dynamic (1, N, T, S)": (lambda: dynamic(x), dynamic.trainable_variables),
        "Toeplitz row -> (N, T, S): gather scalars on axis 1 (before)": (
            lambda: tf.gather(row, index, axis=1),
            [row],
        ),
        "Toeplitz row -> (N, T, S): gather rows on axis 0 + transpose": (
            lambda: tf.transpose(tf.gather(tf.transpose(row), index), [2, 0, 1]),
            [row],
        ),
        "Toeplitz row -> (N, T, S): ops.toeplitz, skew gradient (now)": (
            lambda: ops.toeplitz(row, length, length),
            [row],
        ),
        "Toeplitz at N=2 T=2048: gather scalars on axis 1 (before)": (
            lambda: tf.gather(long_row, long_index, axis=1),
            [long_row],
        ),
        "Toeplitz at N=2 T=2048: ops.toeplitz, skew gradient (now)": (
            lambda: ops.toeplitz(long_row, 2048, 2048),
            [long_row],
        ),
        "bias add (B, N, T, S) + (1, N, T, S)": (lambda: logits + bias, [logits, bias]),
        "core softmax(Q K^T) V, no bias": (
            lambda: _core(heads_q, heads_k, None),
            [heads_q, heads_k],
        ),
        "core softmax(Q K^T + B) V, B a (1, N, T, S) variable": (
            lambda: _core(heads_q, heads_k, bias),
            [heads_q, heads_k, bias],
        ),
        "query scale 1/sqrt(H) on (B, T, N, H)": (lambda: heads_q * 0.25, [heads_q]),
        "softmax (float32)": (lambda: tf.nn.softmax(logits), [logits]),
        "value product: einsum on (B, S, N, H) (ours)": (
            lambda: tf.einsum("bnts,bsnh->btnh", tf.nn.softmax(logits), heads_k),
            [logits, heads_k],
        ),
        "value product: matmul on (B, N, S, H) (ours before)": (
            lambda: tf.matmul(tf.nn.softmax(logits), q),
            [logits, q],
        ),
    }


def run(quick):
    sizes = ((2, 128, 64, 4),) if quick else ((4, 256, 128, 8), (8, 512, 256, 8))
    rows = []
    for index, (batch, length, width, heads) in enumerate(sizes):
        size = f"B={batch} T={length} D={width} N={heads}"
        steps = {}
        for name, (fn, variables) in stages(batch, length, width, heads).items():
            if index and name.startswith("Toeplitz at"):
                continue  # the same long row at every size
            for xla in (False, True):
                forward, step = _steps(fn, variables, xla)
                steps[name, xla, "fwd"], steps[name, xla, "fwd+bwd"] = forward, step
        rounds = 3 if quick else (LARGE_ROUNDS if index else ROUNDS)
        seconds = _round_robin(steps, rounds, CALLS)
        rows += [
            (
                size,
                name,
                *(
                    f"{seconds[name, xla, part] * 1e3:.2f}"
                    for xla in (False, True)
                    for part in ("fwd", "fwd+bwd")
                ),
            )
            for name in dict.fromkeys(key[0] for key in steps)
        ]
    write(
        "profile_attention",
        "Attention stages alone, forward and forward+backward"
        + ("; --quick: a smoke run" if quick else ""),
        ["size", "stage", "graph fwd ms", "graph fwd+bwd ms"]
        + ["XLA fwd ms", "XLA fwd+bwd ms"],
        rows,
        [
            "each stage compiled alone, with its gradient in the fwd+bwd "
            f"columns; each cell the median over {ROUNDS} rounds ({LARGE_ROUNDS} "
            f"at the larger size) of the mean of {CALLS} calls, every stage timed "
            "once per round; the step returns its loss, so no forward work is "
            "pruned",
            "the 'whole layer' rows run in the same rounds; a stage alone also "
            "pays for multiplying its output by the upstream gradient and "
            "summing, so it overstates its share of a layer (ratios to Keras' "
            "layer, paired per round: speed_attention.md)",
            "share_position_bias=True (the builders) saves (L - 1) times the "
            "'bias' row, not the 'bias add' row (every layer adds the bias and "
            "sums its gradient over the batch)",
            "the 'query scale' row rides on the query's cos and sin under rope; "
            "elsewhere folding it into the query kernel would bypass Dense.call, "
            "which TF-MOT's QAT wrappers and Keras' quantize rely on",
            "the two 'core' rows differ by what any trainable bias costs even "
            "when producing it is free: its add and the batch sum of its "
            "gradient, passes over (B, N, T, S)",
        ],
    )
