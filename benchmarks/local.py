"""Dense vs block-local attention: time and peak memory as T grows."""

import json
import sys

from benchmarks._common import peak_rss_mb, write

LENGTHS_FULL = (1024, 2048, 4096, 8192)
LENGTHS_QUICK = (1024, 2048, 4096)


def measure(kind, length, width=256, heads=8, window=256):
    """One measurement, printed as JSON (run in its own process)."""
    import tensorflow as tf

    from benchmarks._common import median_seconds, own_peak_rss_mb
    from keras_posenc import RelativeMultiHeadAttention, RelativePositionBias

    x = tf.random.normal((1, length, width))
    layer = RelativeMultiHeadAttention(
        heads,
        width // heads,
        position_bias=RelativePositionBias(heads, "t5"),
        attention_window=window if kind == "local" else None,
    )

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x))
        return tape.gradient(loss, layer.trainable_variables)

    seconds = median_seconds(step, repeats=3, warmup=1)
    print(json.dumps({"seconds": seconds, "peak_mb": own_peak_rss_mb()}))


def run(quick):
    lengths = LENGTHS_QUICK if quick else LENGTHS_FULL
    results = {}
    for length in lengths:
        for kind in ("dense", "local"):
            results[kind, length] = peak_rss_mb("benchmarks.local", kind, length)
    rows = []
    for length in lengths:
        dense, local = results["dense", length], results["local", length]
        cells = [length]
        for r in (dense, local):
            cells += (
                [f"{r['seconds'] * 1e3:.0f}", f"{r['peak_mb']:.0f}"]
                if "error" not in r
                else ["fails", r["error"][:40]]
            )
        speedup = (
            f"{dense['seconds'] / local['seconds']:.1f}"
            if "error" not in dense and "error" not in local
            else "n/a"
        )
        cells.append(speedup)
        rows.append(cells)
    growth = [
        results["local", b]["seconds"] / results["local", a]["seconds"]
        for a, b in zip(lengths, lengths[1:])
        if "error" not in results["local", a]
    ]
    write(
        "local_attention",
        "Dense vs block-local attention (forward+backward, B=1, D=256, N=8, W=256, t5)",
        [
            "T",
            "dense ms",
            "dense peak MB",
            "local ms",
            "local peak MB",
            "dense / local time",
        ],
        rows,
        [
            "local time ratio per doubling of T: "
            + ", ".join(f"{g:.2f}" for g in growth),
            "goals: local >= 8x faster than dense at T=8192; T=8192 / T=4096 <= 2.3x",
            "peak MB is the whole process (TensorFlow itself is ~600 MB)",
        ],
    )


if __name__ == "__main__":
    measure(sys.argv[1], int(sys.argv[2]))
