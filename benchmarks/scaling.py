"""Scaling: attention time and peak memory from T=256 to 8192, fitted exponents.

One attention layer (B=1, D=64, N=2), forward+backward in graph mode, dense
with each position producer, block-local (W=128) and LSH (C=64, R=2). Each
(variant, length) runs in a fresh process; memory is the growth of its
resident set during the first run of the traced step (sampled every
millisecond) over the resident set just before it, so the import and tracing
peaks do not hide it. The exponent `k` of `time ~ T^k` is a least-squares fit
in log-log over the lengths at or above 1024, where the T^2 terms dominate
dense attention.
"""

import json
import os
import sys
import threading
import time

import numpy as np

from benchmarks._common import fwd_bwd, peak_rss_mb, write

LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (256, 512, 1024)
#: `name: (bias, attention arguments)`; bias None, a RelativePositionBias
#: mode, "dynamic_bias" or "rope".
VARIANTS = {
    "dense, none": (None, {}),
    "dense, t5": ("t5", {}),
    "dense, clipped": ("clipped", {}),
    "dense, alibi": ("alibi", {}),
    "dense, dynamic_bias": ("dynamic_bias", {}),
    "dense, rope": ("rope", {}),
    "block-local W=128, none": (None, {"attention_window": 128}),
    "block-local W=128, t5": ("t5", {"attention_window": 128}),
    "block-local W=128, dynamic_bias": ("dynamic_bias", {"attention_window": 128}),
    "LSH C=64 R=2, none": (None, {"attention_type": "lsh"}),
    "LSH C=64 R=2, t5": ("t5", {"attention_type": "lsh"}),
}
FIT_FROM = 1024


def measure(name, length):
    """Seconds and memory growth (MB) of one length, printed as JSON."""
    import tensorflow as tf

    from benchmarks._common import median_seconds
    from keras_posenc import (
        DynamicPositionBias,
        RelativeMultiHeadAttention,
        RelativePositionBias,
        RotaryEmbedding,
    )

    bias, attention = VARIANTS[name]
    heads, width = 2, 64
    extra = dict(attention)
    if bias == "rope":
        extra["rotary"] = RotaryEmbedding()
    elif bias == "dynamic_bias":
        extra["position_bias"] = DynamicPositionBias(heads)
    elif bias is not None:
        extra["position_bias"] = RelativePositionBias(heads, bias)
    layer = RelativeMultiHeadAttention(heads, width // heads, **extra)
    step = fwd_bwd(layer, tf.random.normal((1, int(length), width)))
    step.get_concrete_function()  # builds and traces without running
    growth = _peak_growth_mb(step)  # the first run allocates everything afresh
    seconds = median_seconds(step, repeats=3, warmup=0)
    print(json.dumps({"seconds": seconds, "growth_mb": growth}))


def _peak_growth_mb(fn):
    """Peak growth of the resident set while `fn()` runs, in MB."""
    page = os.sysconf("SC_PAGE_SIZE")

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    base, peak, done = resident(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], resident())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], resident(), base) / 2**20 - base / 2**20


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
        results = [peak_rss_mb("benchmarks.scaling", name, t) for t in lengths]
        if any("error" in result for result in results):
            rows.append([name] + ["failed"] * (len(lengths) + 2))
            continue
        seconds = [result["seconds"] for result in results]
        memory = [result["growth_mb"] for result in results]
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
            "ms: median of 3 calls after the first; MB: peak growth of the "
            "resident set during the first call, in a fresh process per cell",
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
        style = "-" if name.startswith("dense") else "--"
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
