"""Streaming past the training length through a rolling cache (`streaming`).

Each method's byte-level LM is trained on the pydoc task at L = 64 (the
recipe of `lm`), then reads held-out rows of 16 L = 1024 bytes token by token
(`CausalLM.score`) through a rolling cache of L slots: 4 attention sinks and
the last 60 tokens (Xiao et al. 2023), against the window alone (the last 64
tokens, no sinks: the ablation) and against one pass over the whole row (no
cache limit: plain length extrapolation). Bits per byte over every
prediction of the rows, beside the same model's bits per byte at L.
"""

import math

import numpy as np

from benchmarks._common import summary, write
from keras_posenc.data import language_modeling as lm
from keras_posenc.generation import Streaming

METHODS = ("alibi", "t5", "rope", "fox")
SINKS = 4


def run(quick):
    length, steps, rows, scale = (32, 150, 2, 4) if quick else (64, 1000, 8, 16)
    seeds = (0,) if quick else (0, 1, 2)
    train_ids, validation_ids = lm.pydoc_bytes()
    long = length * scale
    count = len(validation_ids) // long
    picks = np.linspace(0, count - 1, rows).astype(int)
    text = np.stack([validation_ids[i * long : (i + 1) * long] for i in picks])
    table = []
    for method in METHODS:
        cells = []  # per seed: at L, sinks, window only, one pass
        for seed in seeds:
            model, _ = lm.train(method, train_ids, length, steps, seed=seed)
            at_length = lm.bits_per_byte(model, validation_ids, length, 64)
            sinks = _bits(model.score(text, streaming=Streaming(length - SINKS)))
            window = _bits(
                model.score(text, streaming=Streaming(length, sink_tokens=0))
            )
            whole = _bits(model.score(text))
            cells.append([at_length, sinks, window, whole])
            print(method, seed, [f"{c:.3f}" for c in cells[-1]], flush=True)
        cells = np.asarray(cells)
        ratio = cells[:, 1] / cells[:, 0]
        table.append(
            [method]
            + [summary(cells[:, i]) for i in range(4)]
            + [f"{(ratio.mean() - 1) * 100:+.1f}%"]
        )
    write(
        "streaming",
        f"Reading {scale}x the training length through a rolling cache: bits per "
        f"byte of the pydoc byte-level LM (L={length}, {steps} batches of 32, "
        f"seeds {list(seeds)}{'; --quick: a smoke run' if quick else ''})",
        [
            "method",
            "at L (windows of L)",
            f"{scale}L, rolling cache: {SINKS} sinks + last {length - SINKS}",
            f"{scale}L, window only: last {length}",
            f"{scale}L, one pass (no cache limit)",
            "rolling vs at L",
        ],
        table,
        [
            "mean ±half the range over the seeds; every prediction of "
            f"{rows} held-out rows of {long} bytes, read token by token "
            "(`CausalLM.score(token_ids, streaming=Streaming(cache_window, "
            "sink_tokens))`) at positions inside the cache",
            "at L: non-overlapping windows of L bytes, each read from its start "
            "(a window's first bytes have little context, so this is the "
            "harder baseline for a short L)",
            "`python -m benchmarks --only streaming`",
        ],
    )


def _bits(scores):
    return float(-np.mean(scores) / math.log(2.0))
