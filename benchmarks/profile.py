"""Where attention time goes: each stage timed alone, ours and Keras', fwd+bwd.

The stages of one attention call, each compiled alone (graph mode and XLA)
with its gradient: the four projections, the logits `Q K^T`, the position
bias (ours only: T5, dynamic), the softmax and the value product. Stage sums
do not equal the whole call (fusion, dispatch), but they show which stage a
speed-up has to come from.
"""

import tensorflow as tf

from benchmarks._common import median_seconds, write
from keras_posenc import DynamicPositionBias, RelativePositionBias, ops

keras = tf.keras


def _timed(fn, variables, xla):
    # A random upstream gradient, as in a real backward pass: with the ones
    # of a plain sum, a gradient that does not read the forward folds away.
    upstream = tf.random.stateless_normal(tf.shape(fn()), seed=(0, 1))

    @tf.function(jit_compile=xla)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn() * upstream)
        return tape.gradient(loss, variables)

    return median_seconds(step, repeats=7)


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
    return {
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
    batch, length, width, heads = (2, 128, 64, 4) if quick else (4, 256, 128, 8)
    rows = []
    for name, (fn, variables) in stages(batch, length, width, heads).items():
        graph, xla = _timed(fn, variables, False), _timed(fn, variables, True)
        rows.append((name, f"{graph * 1e3:.2f}", f"{xla * 1e3:.2f}"))
    write(
        "profile_attention",
        f"Attention stages alone, forward+backward, B={batch} T={length} D={width} "
        f"N={heads}" + ("; --quick: a smoke run" if quick else ""),
        ["stage", "graph ms", "XLA ms"],
        rows,
        [
            "each stage compiled alone with its gradient; medians of 7 runs",
            "compare with the whole-layer times in speed_attention.md",
            "share_position_bias=True (the builders) saves (L - 1) times the "
            "'bias' row, not the 'bias add' row (every layer adds the bias and "
            "sums its gradient over the batch)",
            "the 'query scale' row rides on the query's cos and sin under rope; "
            "elsewhere folding it into the query kernel would bypass Dense.call, "
            "which TF-MOT's QAT wrappers and Keras' quantize rely on",
        ],
    )
