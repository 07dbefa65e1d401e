"""Scaling: attention time and peak memory from T=256 to 8192, fitted exponents.

One attention layer (B=1, D=64, N=2), forward+backward in graph mode, dense
with each position producer and block-local (W=128). Each variant runs in
its own process over increasing lengths, so its peak resident memory at a
length is that length's own (memory only grows with T); the table reports
the growth over the process's memory before the first call. The exponent
`k` of `time ~ T^k` is a least-squares fit in log-log over the lengths at
or above 1024, where the T^2 terms dominate dense attention.
"""

import json
import sys

import numpy as np

from benchmarks._common import peak_rss_mb, write

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (256, 512, 1024)
#: `name: (bias, attention_window)`; bias None, a RelativePositionBias mode,
#: "dynamic_bias" or "rope".
VARIANTS = {
    "dense, none": (None, None),
    "dense, t5": ("t5", None),
    "dense, clipped": ("clipped", None),
    "dense, alibi": ("alibi", None),
    "dense, dynamic_bias": ("dynamic_bias", None),
    "dense, rope": ("rope", None),
    "block-local W=128, none": (None, 128),
    "block-local W=128, t5": ("t5", 128),
    "block-local W=128, dynamic_bias": ("dynamic_bias", 128),
}
FIT_FROM = 1024


def measure(name, *lengths):
    """Seconds and memory growth per length, printed as JSON (own process)."""
    import tensorflow as tf

    from benchmarks._common import median_seconds, own_peak_rss_mb
    from keras_posenc import (
        DynamicPositionBias,
        RelativeMultiHeadAttention,
        RelativePositionBias,
        RotaryEmbedding,
    )

    bias, window = VARIANTS[name]
    heads, width = 2, 64
    extra = {}
    if bias == "rope":
        extra["rotary"] = RotaryEmbedding()
    elif bias == "dynamic_bias":
        extra["position_bias"] = DynamicPositionBias(heads)
    elif bias is not None:
        extra["position_bias"] = RelativePositionBias(heads, bias)
    layer = RelativeMultiHeadAttention(
        heads, width // heads, attention_window=window, **extra
    )
    layer(tf.zeros((1, 8, width)))  # builds
    before = own_peak_rss_mb()
    results = {}
    for length in map(int, lengths):
        step = _fwd_bwd(layer, tf.random.normal((1, length, width)))
        seconds = median_seconds(step, repeats=3, warmup=1)
        results[length] = [seconds, own_peak_rss_mb() - before]
    print(json.dumps(results))


def _fwd_bwd(layer, x):
    import tensorflow as tf

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, x))
        return tape.gradient(loss, layer.trainable_variables)

    return step


def exponent(lengths, values):
    """The fitted `k` of `values ~ lengths^k` over lengths >= FIT_FROM."""
    points = [(t, v) for t, v in zip(lengths, values) if t >= FIT_FROM and v > 0]
    if len(points) < 2:
        return float("nan")
    t, v = np.log(np.array(points)).T
    return float(np.polyfit(t, v, 1)[0])


def run(quick):
    lengths = QUICK_LENGTHS if quick else LENGTHS
    curves, rows = {}, []
    for name in VARIANTS:
        result = peak_rss_mb("benchmarks.scaling", name, *lengths, timeout=3600)
        if "error" in result:
            rows.append([name] + ["failed"] * (len(lengths) + 2))
            continue
        seconds = [result[str(t)][0] for t in lengths]
        memory = [result[str(t)][1] for t in lengths]
        curves[name] = (seconds, memory)
        rows.append(
            [name]
            + [f"{s * 1e3:.0f} / {m:.0f}" for s, m in zip(seconds, memory)]
            + [
                f"{exponent(lengths, seconds):.2f}",
                f"{exponent(lengths, memory):.2f}",
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    smoke = " (--quick: a smoke run)" if quick else ""
    write(
        "scaling_attention",
        "Attention forward+backward vs length, B=1 D=64 N=2, graph mode" + smoke,
        ["variant"]
        + [f"T={t} ms / MB" for t in lengths]
        + ["time exponent", "memory exponent"],
        rows,
        [
            "ms: median of 3 calls; MB: peak resident memory growth of the "
            "variant's own process over its memory before the first call",
            f"exponents: least-squares slope in log-log over T >= {FIT_FROM}",
        ],
        figure=_plot(lengths, curves),
    )


def _plot(lengths, curves):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, (seconds, memory) in curves.items():
        style = "--" if name.startswith("block") else "-"
        axes[0].loglog(lengths, np.array(seconds) * 1e3, style, marker="o", label=name)
        axes[1].loglog(lengths, np.maximum(memory, 1), style, marker="o", label=name)
    axes[0].set(xlabel="sequence length T", ylabel="forward+backward ms")
    axes[1].set(xlabel="sequence length T", ylabel="peak memory growth (MB)")
    axes[0].set_title("time")
    axes[1].set_title("memory")
    axes[1].legend(fontsize=7)
    figure.tight_layout()
    return figure


if __name__ == "__main__":
    measure(*sys.argv[1:])
