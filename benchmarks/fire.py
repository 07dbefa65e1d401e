"""Why FIRE's bits per byte rise past the training length (#25's diagnosis).

FIRE (`FireBias`) trained on the `lm_content` task (the pydoc byte LM at
L=64, seed 0, the same budget) from the paper's threshold (`L = 512`) and
from one below the training length (16): bits per byte at 1x-8x L, the
thresholds training reaches, and the first layer's bias (head 0) at the
distances 1, 8 and L - 1 for a query at the training length (i = L - 1) and
at 8x (i = 8L - 1). Progressive interpolation divides `psi(i - j)` by `psi(max(i,
L))`, so past the threshold a fixed distance maps to a smaller input: the
bias of a near key grows with the query position and the attention that was
sharp in training spreads out at 8x.
"""

import tensorflow as tf

from benchmarks._common import write
from keras_posenc import FireBias
from keras_posenc.data import language_modeling as lm

SCALES = (1, 2, 4, 8)
THRESHOLDS = (512.0, 16.0)


def run(quick):
    length, steps, windows = (32, 150, 16) if quick else (64, 1000, 64)
    train_ids, validation_ids = lm.pydoc_bytes()
    queries = (length - 1, 8 * length - 1)
    distances = (1, 8, length - 1)
    rows = []
    for threshold in THRESHOLDS:
        options = {"initial_threshold": threshold}
        model, _ = lm.train(
            "fire", train_ids, length, steps, seed=0, position_options=options
        )
        bits = [
            lm.bits_per_byte(model, validation_ids, s * length, windows) for s in SCALES
        ]
        fires = [
            layer.position_bias
            for layer in model.layers
            if isinstance(getattr(layer, "position_bias", None), FireBias)
        ]
        learned = " / ".join(f"{float(layer.threshold):.0f}" for layer in fires)
        biases = [_bias(fires[0], i, distances) for i in queries]
        cells = [" -> ".join(f"{bias[d]:.2f}" for bias in biases) for d in distances]
        rows.append([f"{threshold:.0f}", learned] + [f"{b:.3f}" for b in bits] + cells)
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    write(
        "lm_fire",
        f"FIRE past the training length: the pydoc byte LM at L={length} "
        f"({steps} batches of 32, seed 0{'; --quick: a smoke run' if quick else ''})",
        ["initial L", "learned L (layers)"]
        + [f"{s}x L" for s in SCALES]
        + [
            f"bias at j - i = -{d}, i = {queries[0]} -> {queries[1]}" for d in distances
        ],
        rows,
        [
            "bias: the first FIRE layer's head 0; more negative = less weight",
            "learned L: the threshold each FIRE layer reached in training",
            "past the threshold the normalizer psi(max(i, L)) grows with the "
            "query: a key at a fixed distance maps to a smaller input (FIRE's "
            "progressive interpolation)",
        ],
    )


def _bias(fire, query, distances):
    """`{distance: bias}` of head 0 for a query at `query`."""
    keys = tf.range(query + 1)
    bias = fire.bias_between(tf.constant([query]), keys).numpy()[0, 0]  # (S,)
    return {d: float(bias[query - d]) for d in distances}
