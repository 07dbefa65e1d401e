"""Gated fusion: relative table (O(T*D)) vs the dense (B, T, S, D) tensor."""

import json
import sys

from benchmarks._common import peak_rss_mb, write


def measure(kind, length, batch=4, width=64, distance=16):
    """One measurement, printed as JSON (run in its own process)."""
    import tensorflow as tf

    from benchmarks._common import median_seconds, own_peak_rss_mb
    from keras_posenc import GatedPositionFusion, ops

    fusion = GatedPositionFusion()
    absolute = tf.random.normal((batch, length, width))
    table = tf.random.normal((2 * distance + 1, width))
    if kind == "dense":

        @tf.function
        def step():
            dense = ops.dense_relative_table(table, length, length)[None]
            dense = tf.broadcast_to(dense, (batch, length, length, width))
            return fusion(absolute, dense)
    else:

        @tf.function
        def step():
            return fusion(absolute, table)

    seconds = median_seconds(step, repeats=3, warmup=1)
    print(json.dumps({"seconds": seconds, "peak_mb": own_peak_rss_mb()}))


def run(quick):
    lengths = (128, 512, 1024, 2048) if quick else (128, 512, 1024, 2048, 4096)
    rows = []
    for length in lengths:
        row = [length, f"{4 * length * length * 64 * 4 / 2**20:.0f}"]
        for kind in ("dense", "table"):
            r = peak_rss_mb("benchmarks.memory", kind, length)
            row += (
                [f"{r['seconds'] * 1e3:.1f}", f"{r['peak_mb']:.0f}"]
                if "error" not in r
                else ["fails", r["error"][:40]]
            )
        rows.append(row)
    write(
        "memory_gated_fusion",
        "Gated fusion: dense (B, T, S, D) vs relative table, B=4 D=64 M=16",
        [
            "T",
            "dense tensor MB",
            "dense ms",
            "dense peak MB",
            "table ms",
            "table peak MB",
        ],
        rows,
        ["both paths agree to 1e-5 (tests/layers/test_gated_position_fusion.py)"],
    )


if __name__ == "__main__":
    measure(sys.argv[1], int(sys.argv[2]))
