"""Speed: attention forward+backward against the peers' layers; step times.

Three tables: ours against the peer layer doing the same work
(`benchmarks/peers.py`: Keras' and keras-hub's layers, keras-hub from the
`bench` extra, Keras 3 only), every bias against Keras' `MultiHeadAttention`,
and a training step per method (plus the whole encoder against keras-hub's
`TransformerEncoder` stack of the same shape).

Every ratio is measured side by side in one process: within each round the
reference (Keras' layer, or the `"none"` model) runs right before the layer
it is compared with, and the table shows the median over rounds of those
paired ratios, so a drift of the machine's speed cancels.
"""

import numpy as np
import tensorflow as tf

from benchmarks import peers
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


def attention_layers(heads, key_dim, use_bias=True):
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
            heads,
            key_dim,
            position_bias=None if make is None else make(),
            use_bias=use_bias,
        )
        for name, make in biases.items()
    }
    layers["rope"] = RelativeMultiHeadAttention(
        heads, key_dim, rotary=RotaryEmbedding(), use_bias=use_bias
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


def peer_rows(batch, length, width, heads, rounds):
    """Ours against the peer doing the same work, graph and XLA, per method.

    Each pair computes one function (the outputs' largest difference after
    `peers.copy_weights` is printed beside the times). `clipped` and
    `dynamic_bias` are timed against keras-hub's T5 layer: the goal for them
    is that layer's cost, a bias included, plus 5%.
    """
    x = tf.random.normal((batch, length, width))
    size = f"B={batch} T={length} D={width} N={heads}"
    key_dim = width // heads
    cases = [
        (method, use_bias, False)
        for method, has_bias in peers.METHODS.items()
        for use_bias in ((False, True) if has_bias else (False,))
    ] + [("t5", False, True)]  # the peer's bias gradient left unsummed
    rows = []
    for method, use_bias, sparse in cases:
        ours, theirs = peers.pair(method, heads, key_dim, width, use_bias)
        ours(x, x), theirs(x, x)
        peers.copy_weights(ours, theirs)
        error = float(tf.reduce_max(tf.abs(ours(x, x) - theirs(x, x))))
        found = {
            xla: paired(
                fwd_bwd(theirs, x, xla, sparse), {0: fwd_bwd(ours, x, xla)}, rounds
            )
            for xla in (False, True)
        }
        name = method + (", peer's gradient sparse" if sparse else "")
        rows.append(
            _peer_row(size, name, use_bias, peers.PEER_NAMES[method], error, found)
        )
    _, t5_layer = peers.pair("t5", heads, key_dim, width, False)
    others = attention_layers(heads, key_dim, use_bias=False)
    found = {
        xla: paired(
            fwd_bwd(t5_layer, x, xla),
            {
                name: fwd_bwd(others[name], x, xla)
                for name in ("clipped", "dynamic_bias")
            },
            rounds,
        )
        for xla in (False, True)
    }
    for name in ("clipped", "dynamic_bias"):
        timing = {
            xla: {0: found[xla][name], REFERENCE: found[xla][REFERENCE]}
            for xla in found
        }
        rows.append(_peer_row(size, name, False, peers.PEER_NAMES["t5"], None, timing))
    return rows


def _peer_row(size, method, use_bias, peer, error, found):
    graph, xla = found[False], found[True]
    return (
        size,
        method,
        "yes" if use_bias else "no",
        peer,
        f"{graph[0][0] * 1e3:.1f} / {graph[REFERENCE][0] * 1e3:.1f}",
        _ratio(*graph[0][1:]),
        f"{xla[0][0] * 1e3:.1f} / {xla[REFERENCE][0] * 1e3:.1f}",
        _ratio(*xla[0][1:]),
        "-" if error is None else f"{error:.0e}",
    )


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
            position_options={
                "max_length": length,
                "share_position_bias": share_position_bias,
            },
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


def encoder_rows(batch, length, width, rounds):
    """A training step of our encoder against keras-hub's of the same shape.

    Both: learned token and position embeddings, a layer norm, two post-norm
    Transformer layers (N=4, ReLU feed-forward of 2D), mean pooling, two
    logits; ours with `position="learned"` (and `"alibi"`, `"rope"`).
    """
    import keras_hub

    x = np.random.default_rng(0).integers(0, 20, size=(batch, length))
    y = np.zeros(batch, "int32")

    def trainer(model):
        model.compile("adam", "sparse_categorical_crossentropy")
        return lambda: model.train_on_batch(x, y)

    inputs = keras.Input((length,), dtype="int32")
    h = keras_hub.layers.TokenAndPositionEmbedding(20, length, width)(inputs)
    h = keras.layers.LayerNormalization(epsilon=1e-5)(h)
    for _ in range(2):
        h = keras_hub.layers.TransformerEncoder(2 * width, 4)(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    hub = trainer(keras.Model(inputs, keras.layers.Dense(2)(h)))
    ours = {
        position: trainer(
            models.build_classifier(
                2,
                vocab_size=20,
                hidden_dim=width,
                num_heads=4,
                num_layers=2,
                position=position,
                position_options={"max_length": length},
            )
        )
        for position in ("learned", "alibi", "rope")
    }
    timing = paired(hub, ours, rounds, 1, True)
    return [
        (
            f"ours, {position}",
            f"{timing[position][0] * 1e3:.1f}",
            f"{timing[REFERENCE][0] * 1e3:.1f}",
            f"{timing[position][1]:.2f}",
        )
        for position in ours
    ]


def run_peers(quick):
    """The `speed_peers` table alone (`python -m benchmarks --only speed_peers`)."""
    if not peers.available():
        print(f"speed_peers: skipped, it needs {peers.NEEDS}\n")
        return
    sizes = QUICK_ATTENTION_SIZES if quick else ATTENTION_SIZES
    rounds = 3 if quick else 21
    smoke = " (--quick: a smoke run)" if quick else ""
    write(
        "speed_peers",
        "Attention forward+backward: ours against the peer layer doing the "
        "same work" + smoke,
        [
            "size",
            "ours",
            "projection biases",
            "peer",
            "graph ms, ours / peer",
            "x peer",
            "XLA ms, ours / peer",
            "x peer (XLA)",
            "max |ours - peer|",
        ],
        [row for size in sizes for row in peer_rows(*size, rounds)],
        [
            f"medians over {rounds} rounds of 3 calls; in each round the peer runs "
            "right before ours and the ratio is the median of those pairs (in "
            "brackets: their quartiles, the spread between rounds)",
            "max |ours - peer|: the outputs' largest difference with the peer's "
            "weights copied into ours (the same function; benchmarks/peers.py)",
            "goal: every one of ours at most 1.00x its peer; clipped and "
            "dynamic_bias at most 1.05x keras-hub's T5 layer (its bias included)",
            "every gradient is a dense tensor, as Keras' Adam reads it; in the "
            "row \"t5, peer's gradient sparse\" keras-hub's bias-table gradient "
            "is left as the gather's IndexedSlices (one row per element of the "
            "(T, S) grid, not yet summed per bucket: Adam sums it, "
            "benchmarks/_common.py fwd_bwd)",
        ],
    )


def run(quick):
    run_peers(quick)
    sizes = QUICK_ATTENTION_SIZES if quick else ATTENTION_SIZES
    rounds = 3 if quick else 21
    smoke = " (--quick: a smoke run)" if quick else ""
    rows = []
    for size in sizes:
        rows += attention_rows(*size, rounds)
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
            "goal: at most 1.05x Keras' layer without a trainable bias (none, "
            "alibi, rope), graph and XLA; t5, clipped and dynamic_bias against "
            "keras-hub's T5 layer, which pays the same bias (speed_peers.md)",
        ],
    )
    run_steps(quick)
    step = (8, 64) if quick else (16, 512)
    if peers.available():
        write(
            "speed_encoder",
            f"Training step of the whole encoder, B={step[0]} T={step[1]} D=64, "
            "2 layers: ours against keras-hub's TransformerEncoder stack" + smoke,
            [
                "encoder",
                "fastest ms / step",
                "keras-hub fastest, same rounds",
                "x keras-hub",
            ],
            encoder_rows(*step, 64, min(rounds, 7)),
            [
                "keras-hub: TokenAndPositionEmbedding, LayerNormalization, two "
                "TransformerEncoder layers (post-norm, ReLU, 2D), mean pooling, "
                "Dense; ours: build_classifier of the same shape",
                f"{min(rounds, 7)} rounds; in each keras-hub's model steps right "
                "before ours; fastest step over keras-hub's fastest of the same rounds",
            ],
        )


def run_steps(quick):
    """`speed_steps.md` alone (`--only speed_steps`; `--only speed` writes it too)."""
    rounds = 3 if quick else 7
    smoke = " (--quick: a smoke run)" if quick else ""
    step = (8, 64) if quick else (16, 512)
    write(
        "speed_steps",
        f"Training step per method, B={step[0]} T={step[1]} D=64, 2 layers" + smoke,
        ["position", "fastest ms / step", "'none' fastest, same rounds", "x none"],
        step_rows(*step, 64, rounds),
        [
            f"{rounds} rounds; in each the 'none' model steps right before the "
            "method; the ratio is the method's fastest step over the fastest "
            "'none' step of the same rounds",
            "goal: every method at most 1.25x 'none' (recursive, which runs a "
            "second attention per layer, at most 1.35x); cope misses it: its "
            "count and interpolation take ~20 passes a layer over the (B, N, T, S) "
            "pairs, and even fused kernels would need ~4 (docs/measurements.md)",
        ],
    )
