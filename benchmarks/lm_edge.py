"""LM on a microcontroller: int8 TFLM decode-step size and arena per method and S.

Untrained byte-level LMs (D=32, 2 layers, 4 heads, V=256, seed 0): size and
arena do not depend on the weights. `tflite_export.verify_causal_lm` finds
the smallest arena with which TFLM runs the step.
"""

import numpy as np
import tensorflow as tf

import tflite_export
from benchmarks._common import write
from keras_posenc.models import POSITION_METHODS, build_causal_lm

#: The cache lengths S of the table.
LENGTHS = (128, 256, 512)


def measure(position, max_length):
    """`(flash bytes, arena bytes)` of the int8 TFLM decode step, or None for a
    method with no integer kernels (`tflite_export.integer_blockers`)."""
    tf.keras.utils.set_random_seed(0)
    model = build_causal_lm(
        256,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        position=position,
        position_options={"max_length": max_length},
    )
    if tflite_export.integer_blockers(model):
        return None
    calibration = np.random.default_rng(0).integers(1, 256, (8, 32))
    model_bytes = tflite_export.convert_causal_lm(
        model, calibration, max_length=max_length, target="tflm"
    )
    text = np.random.default_rng(1).integers(1, 256, (1, 16))
    report = tflite_export.verify_causal_lm(model_bytes, model, text)
    return len(model_bytes), report.arena_bytes


def run(quick):
    lengths = LENGTHS[:1] if quick else LENGTHS
    methods = ("alibi", "t5") if quick else POSITION_METHODS
    rows = []
    for position in methods:
        cells = [measure(position, length) for length in lengths]
        if cells[0] is None:
            refused = "refused at int8 (float32 only)"
            rows.append([position] + [refused] * len(lengths) + ["n/a"])
            continue
        rows.append(
            [position]
            + [f"{size:,} / {arena:,}" for size, arena in cells]
            + [f"{cells[-1][0] / cells[0][0]:.2f}x"]
        )
    header = ["method"] + [f"S={s}: flash / arena bytes" for s in lengths]
    write(
        "lm_edge" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "int8 TFLM decode step of a byte-level LM (D=32, L=2, N=4)",
        header + [f"flash S={lengths[-1]} / S={lengths[0]}"],
        rows,
        notes=[
            "A relative bias is stored as its 2S - 1 distinct distances and "
            "gathered per step (ops.cache.cached_bias), so flash grows with S, "
            "not S^2; the arena (the smallest that runs) grows linearly in S.",
        ],
    )
