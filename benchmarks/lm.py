"""Language models: bits per byte at 1x-8x the training length, and decoding speed.

Every position method is trained on the pydoc byte-level task at L and
evaluated on held-out text at 1x, 2x, 4x and 8x L (Press et al. 2022,
figure 1). Decoding: tokens per second of greedy generation with the KV cache
and with a full recompute per token, on the same model, in graph mode and
under XLA, and the time of one cached step early and late in a long cache
(flat in the position when the step reads the cache, not the history).
"""

import time

import numpy as np
import tensorflow as tf

from benchmarks._common import summary, write
from keras_posenc.data import language_modeling as lm
from keras_posenc.models import POSITION_METHODS, build_causal_lm

SCALES = (1, 2, 4, 8)
#: The positions computed from content (and learned kernels) of
#: `run_content`, beside the static ones they are measured against.
CONTENT_METHODS = (
    "alibi",
    "t5",
    "dynamic_bias",
    "rope",
    "kerple",
    "fire",
    "fox",
    "cope",
    "dape",
)
#: Seeds of `run_content` (one with --quick).
SEEDS = (0, 1, 2)
SMOKE = "; --quick: a smoke run, not a result"


def run(quick):
    length, steps, windows = (32, 150, 16) if quick else (64, 1000, 64)
    train_ids, validation_ids = lm.pydoc_bytes()
    rows, curves = [], {}
    for method in POSITION_METHODS:
        model, seconds = lm.train(method, train_ids, length, steps)
        bits = [
            lm.bits_per_byte(model, validation_ids, s * length, windows) for s in SCALES
        ]
        curves[method] = bits
        prompt = [list(validation_ids[:32])]
        speed = lm.tokens_per_second(model, prompt, 64, use_cache=True)
        rows.append(
            [method] + [f"{b:.3f}" for b in bits] + [f"{seconds:.0f}", f"{speed:.0f}"]
        )
    from keras_posenc import viz

    write(
        "lm_extrapolation",
        f"Byte-level LM of pydoc text: bits per byte at 1x-8x the training length "
        f"L={length} ({steps} batches of 32, one seed{SMOKE if quick else ''})",
        ["method"] + [f"{s}x L" for s in SCALES] + ["train s", "tokens/s (cache)"],
        rows,
        [
            "held-out text (the last 10% of the bytes), non-overlapping windows",
            "Press et al. 2022 (figure 1) anchor: sinusoidal explodes past L, "
            "ALiBi stays flat, rotary degrades",
            "tokens/s: greedy, batch 1, 64 new tokens after a 32-byte prompt, "
            "graph mode",
        ],
        figure=viz.extrapolation(curves, [s * length for s in SCALES], length),
    )
    decoding_speed(quick)


def run_content(quick):
    """`CONTENT_METHODS` at 1x-8x L, 3 seeds each, the same budget for all."""
    length, steps, windows = (32, 150, 16) if quick else (64, 1000, 64)
    seeds = (0,) if quick else SEEDS
    train_ids, validation_ids = lm.pydoc_bytes()
    rows = []
    for method in CONTENT_METHODS:
        bits = np.asarray(
            [
                [
                    lm.bits_per_byte(model, validation_ids, s * length, windows)
                    for s in SCALES
                ]
                for model, _ in (
                    lm.train(method, train_ids, length, steps, seed=seed)
                    for seed in seeds
                )
            ]
        )  # (seeds, scales)
        rows.append([method] + [summary(bits[:, i]) for i in range(len(SCALES))])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    write(
        "lm_content",
        "Positions computed from content beside static ones: bits per byte of "
        f"the pydoc byte-level LM at 1x-8x L={length} ({steps} batches of 32, "
        f"seeds {list(seeds)}{SMOKE if quick else ''})",
        ["method"] + [f"{s}x L" for s in SCALES],
        rows,
        [
            "mean ±half the range over the seeds; the same model, data and "
            "schedule for every method (`keras_posenc.data.language_modeling."
            "train`)",
            "held-out text (the last 10% of the bytes), non-overlapping windows",
        ],
    )


def decoding_speed(quick):
    """Cache vs recompute on the same models, graph mode and XLA."""
    new = 64 if quick else 256
    rows = []
    for width, layers in ((64, 2), (256, 4)):
        tf.keras.utils.set_random_seed(0)
        model = build_causal_lm(
            256, hidden_dim=width, num_layers=layers, position="alibi"
        )
        prompt = [list(range(1, 33))]
        for jit in (False, True):
            cached = _rate(model, prompt, new, True, jit)
            recomputed = _rate(model, prompt, new, False, jit)
            rows.append(
                [
                    f"D={width}, {layers} layers",
                    "XLA" if jit else "graph",
                    f"{cached:.0f}",
                    f"{recomputed:.0f}",
                    f"{cached / recomputed:.1f}x",
                ]
            )
    cache_length = 512 if quick else 2048
    early, late = _step_times(model, 16 if quick else 64, cache_length)
    write(
        "lm_decoding",
        f"Greedy decoding of {new} new tokens after a 32-token prompt, batch 1 (alibi)",
        ["model", "compiled", "tokens/s cache", "tokens/s recompute", "cache speed-up"],
        rows,
        [
            "recompute: the whole static-length sequence every step (compiled once)",
            f"one cached step (D=256, 4 layers, cache of {cache_length}): "
            f"{early * 1e3:.2f} ms at position 16, {late * 1e3:.2f} ms near the end "
            "(the step reads the whole fixed-size cache, so its time does not grow)",
        ],
    )


def _rate(model, prompt, new, use_cache, jit):
    model.generate(prompt, new, use_cache=use_cache, jit_compile=jit)
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        model.generate(prompt, new, use_cache=use_cache, jit_compile=jit)
        best = min(best, time.perf_counter() - start)
    return new / best


def _step_times(model, repeats, cache_length):
    """Median seconds of one cached step at position 16 and near the cache end."""
    _, step = model.compiled_steps(1, cache_length)
    cache = model.empty_cache(1, cache_length)
    token = tf.constant([[5]])
    times = []
    for position in (16, cache_length - 2):
        index = tf.constant(position)
        step(token, cache, index)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(token, cache, index)[0].numpy()
            samples.append(time.perf_counter() - start)
        times.append(float(np.median(samples)))
    return times
