"""Speed: relative-bias attention vs keras MultiHeadAttention, step time per method."""

import numpy as np
import tensorflow as tf

from benchmarks._common import median_seconds, write
from keras_posenc import (
    DynamicPositionBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    models,
)

keras = tf.keras


def _fwd_bwd(layer, x, xla=False):
    @tf.function(jit_compile=xla)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, x))
        return tape.gradient(loss, layer.trainable_variables)

    return step


def attention_table(batch, length, width, heads):
    x = tf.random.normal((batch, length, width))
    key_dim = width // heads
    forward = 2 * batch * length * width * width * 4 + 4 * batch * length**2 * width
    flops = 3 * forward  # forward + backward
    n = 1024
    a = tf.random.normal((n, n))
    matmul = median_seconds(tf.function(lambda: tf.matmul(a, a)))
    peak = 2 * n**3 / matmul
    biases = {
        "none": None,
        "t5": lambda: RelativePositionBias(heads, "t5"),
        "clipped": lambda: RelativePositionBias(heads, "clipped"),
        "alibi": lambda: RelativePositionBias(heads, "alibi"),
        "dynamic_bias": lambda: DynamicPositionBias(heads),
    }
    keras_attention = keras.layers.MultiHeadAttention(heads, key_dim)
    layers = [("keras MultiHeadAttention", keras_attention)]
    for name, make in biases.items():
        bias = None if make is None else make()
        layers.append(
            (
                f"RelativeMultiHeadAttention ({name})",
                RelativeMultiHeadAttention(heads, key_dim, position_bias=bias),
            )
        )
    layers.append(
        (
            "RelativeMultiHeadAttention (rope)",
            RelativeMultiHeadAttention(heads, key_dim, rotary=RotaryEmbedding()),
        )
    )
    rows, reference, times = [], {}, {}
    for name, layer in layers:
        graph = median_seconds(_fwd_bwd(layer, x))
        xla = median_seconds(_fwd_bwd(layer, x, xla=True))
        reference = reference or {"graph": graph, "xla": xla}
        times[name] = (graph, xla)
        rows.append(
            (
                name,
                f"{graph * 1e3:.1f}",
                f"{graph / reference['graph']:.2f}",
                f"{xla * 1e3:.1f}",
                f"{xla / reference['xla']:.2f}",
                f"{flops / xla / 1e9:.1f}",
                f"{flops / xla / peak:.2f}",
            )
        )
    plain = times["RelativeMultiHeadAttention (none)"]
    rope = times["RelativeMultiHeadAttention (rope)"]
    return rows, peak, (rope[0] / plain[0], rope[1] / plain[1])


def step_table(batch, length, width):
    x = np.random.default_rng(0).integers(0, 20, size=(batch, length))
    y = np.zeros(batch, "int32")
    rows, baseline = [], None
    for position in models.POSITION_METHODS:
        model = models.build_classifier(
            2,
            vocab_size=20,
            hidden_dim=width,
            num_heads=4,
            position=position,
            max_length=length,
        )
        model.compile("adam", "sparse_categorical_crossentropy")
        seconds = median_seconds(lambda m=model: m.train_on_batch(x, y), 5, 3)
        baseline = seconds if position == "none" else baseline
        rows.append((position, f"{seconds * 1e3:.1f}", f"{seconds / baseline:.2f}"))
    return rows


def run(quick):
    batch, length, width, heads = (4, 256, 128, 8) if quick else (8, 512, 256, 8)
    rows, peak, rope = attention_table(batch, length, width, heads)
    write(
        "speed_attention",
        f"Attention forward+backward, B={batch} T={length} D={width} N={heads}",
        [
            "layer",
            "graph ms",
            "x keras",
            "XLA ms",
            "x keras (XLA)",
            "XLA GFLOP/s",
            "x tf.matmul",
        ],
        rows,
        [
            f"tf.matmul 1024x1024 reaches {peak / 1e9:.1f} GFLOP/s on this machine",
            "goal: relative-bias attention at most 1.05x Keras' attention time",
            f"rope / no positions, same layer: {rope[0]:.2f}x graph, {rope[1]:.2f}x "
            "XLA (goal: at most 1.10x)",
        ],
    )
    step_batch, step_length = (8, 64) if quick else (16, 256)
    write(
        "speed_steps",
        f"Training step time per method, B={step_batch} T={step_length} D=64",
        ["position", "ms / step", "x none"],
        step_table(step_batch, step_length, 64),
        ["goal: dynamic methods at most 1.25x the step time of 'none'"],
    )
