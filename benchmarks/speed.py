"""Speed: attention forward+backward vs Keras' MultiHeadAttention; step times.

Every ratio is measured side by side in one process: within each round the
reference (Keras' layer, or the `"none"` model) runs right before the layer
it is compared with, and the table shows the median over rounds of those
paired ratios, so a drift of the machine's speed cancels.
"""

import numpy as np
import tensorflow as tf

from benchmarks._common import fwd_bwd, mean_seconds, write
from keras_posenc import (
    DynamicPositionBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    models,
)

keras = tf.keras
#: Attention sizes `(B, T, D, N)` of full runs; `--quick` runs a small one.
ATTENTION_SIZES = ((4, 256, 128, 8), (8, 512, 256, 8))
QUICK_ATTENTION_SIZES = ((2, 128, 64, 4),)
#: The key of the reference's own time in `paired`'s result.
REFERENCE = "reference"


def paired(reference, candidates, rounds, calls=3, fastest=False):
    """`{name: (seconds, ratio to reference)}`, the reference timed before each.

    Seconds are the median over rounds and ratios the median of the
    per-round ratios, with their quartiles; with `fastest`, seconds are the
    fastest call and the ratio is fastest over the reference's fastest in the
    same rounds.
    """
    for fn in [reference, *candidates.values()]:
        fn(), fn()  # compile and warm up
    own = {name: [] for name in candidates}
    ratios = {name: [] for name in candidates}
    bases = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            base = mean_seconds(reference, calls)
            seconds = mean_seconds(fn, calls)
            own[name].append(seconds)
            bases[name].append(base)
            ratios[name].append(seconds / base)
    if fastest:
        timings = {
            name: (min(own[name]), min(own[name]) / min(bases[name]))
            for name in candidates
        }
        timings[REFERENCE] = (min(min(times) for times in bases.values()), 1.0)
        return timings
    timings = {
        name: (
            float(np.median(own[name])),
            float(np.median(ratios[name])),
            tuple(np.percentile(ratios[name], [25, 75])),
        )
        for name in candidates
    }
    timings[REFERENCE] = (float(np.median(sum(bases.values(), []))), 1.0, (1, 1))
    return timings


def attention_layers(heads, key_dim):
    """`{name: layer}`: our attention with each bias and with rotary."""
    biases = {
        "none": None,
        "t5": lambda: RelativePositionBias(heads, "t5"),
        "clipped": lambda: RelativePositionBias(heads, "clipped"),
        "alibi": lambda: RelativePositionBias(heads, "alibi"),
        "dynamic_bias": lambda: DynamicPositionBias(heads),
    }
    layers = {
        name: RelativeMultiHeadAttention(
            heads, key_dim, position_bias=None if make is None else make()
        )
        for name, make in biases.items()
    }
    layers["rope"] = RelativeMultiHeadAttention(
        heads, key_dim, rotary=RotaryEmbedding()
    )
    return layers


def attention_rows(batch, length, width, heads, rounds):
    x = tf.random.normal((batch, length, width))
    keras_attention = keras.layers.MultiHeadAttention(heads, width // heads)
    layers = attention_layers(heads, width // heads)
    results = {}
    for xla in (False, True):
        results[xla] = paired(
            fwd_bwd(keras_attention, x, xla),
            {name: fwd_bwd(layer, x, xla) for name, layer in layers.items()},
            rounds,
        )
    size = f"B={batch} T={length} D={width} N={heads}"
    layers = {"keras MultiHeadAttention": None, **layers}
    for xla in results:
        results[xla]["keras MultiHeadAttention"] = results[xla].pop(REFERENCE)
    return [
        (
            size,
            name,
            f"{results[False][name][0] * 1e3:.1f}",
            _ratio(*results[False][name][1:]),
            f"{results[True][name][0] * 1e3:.1f}",
            _ratio(*results[True][name][1:]),
        )
        for name in layers
    ]


def _ratio(median, quartiles):
    low, high = quartiles
    return f"{median:.2f} ({low:.2f}-{high:.2f})"


def step_rows(batch, length, width, rounds):
    x = np.random.default_rng(0).integers(0, 20, size=(batch, length))
    y = np.zeros(batch, "int32")

    def trainer(position, share_position_bias=False):
        model = models.build_classifier(
            2,
            vocab_size=20,
            hidden_dim=width,
            num_heads=4,
            position=position,
            max_length=length,
            share_position_bias=share_position_bias,
        )
        model.compile("adam", "sparse_categorical_crossentropy")
        return lambda: model.train_on_batch(x, y)

    reference = trainer("none")
    rows = []
    shared = [(name, True) for name in ("t5", "dynamic_bias")]
    for position, share in [(n, False) for n in models.POSITION_METHODS] + shared:
        if position == "none":
            continue
        timing = paired(reference, {0: trainer(position, share)}, rounds, 1, True)
        seconds, ratio = timing[0]
        rows.append(
            (
                position + (", share_position_bias=True" if share else ""),
                f"{seconds * 1e3:.1f}",
                f"{timing[REFERENCE][0] * 1e3:.1f}",
                f"{ratio:.2f}",
            )
        )
    return rows


def run(quick):
    sizes = QUICK_ATTENTION_SIZES if quick else ATTENTION_SIZES
    rounds = 3 if quick else 21
    rows = []
    for size in sizes:
        rows += attention_rows(*size, rounds)
    smoke = " (--quick: a smoke run)" if quick else ""
    write(
        "speed_attention",
        "Attention forward+backward vs keras.layers.MultiHeadAttention" + smoke,
        [
            "size",
            "layer (ours: its bias)",
            "graph ms",
            "x keras",
            "XLA ms",
            "x keras (XLA)",
        ],
        rows,
        [
            f"medians over {rounds} rounds of 3 calls; in each round Keras' layer "
            "runs right before ours and the ratio is the median of those pairs "
            "(in brackets: their quartiles, the spread between rounds)",
            "goal: at most 1.05x Keras' layer with every bias, graph and XLA",
        ],
    )
    step = (8, 64) if quick else (16, 512)
    write(
        "speed_steps",
        f"Training step per method, B={step[0]} T={step[1]} D=64, 2 layers" + smoke,
        ["position", "fastest ms / step", "'none' fastest, same rounds", "x none"],
        step_rows(*step, 64, min(rounds, 7)),
        [
            f"{min(rounds, 7)} rounds; in each the 'none' model steps right before the "
            "method; the ratio is the method's fastest step over the fastest "
            "'none' step of the same rounds",
            "goal: every method at most 1.25x 'none' (recursive, which runs a "
            "second attention per layer, at most 1.35x)",
        ],
    )
