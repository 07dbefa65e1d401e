"""The cost of a streaming decode step against a stopping one (`stream_step`).

For each method that streams at int8 in TFLM, an untrained byte-level LM
(2 layers, seed 0; the time does not depend on the weights) is exported
twice for TFLM: a step that stops at its S cache slots and a step over a
rolling cache of the same S slots (4 attention sinks and a ring of S - 4).
Both run in the Python TFLM interpreter (TFLM's reference kernels) in one
process, their invokes interleaved, each attending to all S keys (the
stopping step at its last position: an int8 softmax costs more for every key
it does not mask): the table gives the median invoke time of each and the
ratio, streaming over stopping. The docs' model (D=16, 2
heads, S=64) is the one `docs/lm_on_device.md` exports; D=32 with 4 heads
at S=256 shows how the ratio grows with S (the attention's share).
"""

import time

import numpy as np
import tensorflow as tf

import tflite_export
from benchmarks._common import write
from keras_posenc.generation import Streaming
from keras_posenc.models import METHODS, build_causal_lm
from keras_posenc.models.capabilities import capabilities

SINKS = 4
#: (hidden_dim, num_heads, S): the docs' model, then a wider one at a longer S.
SHAPES = ((16, 2, 64), (32, 4, 256))


def streamed_methods():
    """The methods whose int8 TFLM step streams (the capability table's)."""
    return [m for m in METHODS if capabilities(m).streaming and capabilities(m).int8]


def steps(method, hidden_dim, num_heads, slots):
    """The stopping and the streaming int8 TFLM step of one untrained LM."""
    tf.keras.utils.set_random_seed(0)
    model = build_causal_lm(
        256,
        hidden_dim=hidden_dim,
        num_layers=2,
        num_heads=num_heads,
        position=method,
        position_options={"max_length": slots},
    )
    ids = np.random.default_rng(0).integers(1, 256, (8, 32))
    stopping = tflite_export.convert_causal_lm(
        model, ids, max_length=slots, target="tflm"
    )
    streaming = tflite_export.convert_causal_lm(
        model, ids, target="tflm", streaming=Streaming(slots - SINKS, SINKS)
    )
    return stopping, streaming


def invoke_seconds(models, slots, rounds):
    """Median seconds of one invoke of each model, measured interleaved.

    Both attend to all `slots` keys: the stopping step at t = slots - 1 (a
    step's softmax costs more for each key it does not mask), the streaming
    step at t = slots .. 2 slots - 1 (its ring wrapping). `slots` invokes of
    each a round.
    """
    from tflite_micro.python.tflite_micro import runtime

    runners = [runtime.Interpreter.from_bytes(m, arena_size=4 << 20) for m in models]
    times = [[] for _ in models]
    for _ in range(rounds):
        for k, runner in enumerate(runners):
            for step in range(slots):
                t = slots - 1 if k == 0 else slots + step
                runner.set_input(np.array([[1 + step % 200]], np.int32), 0)
                runner.set_input(np.array(t, np.int32), 1)
                begin = time.perf_counter()
                runner.invoke()
                times[k].append(time.perf_counter() - begin)
    return [float(np.median(t)) for t in times]


def run(quick):
    shapes = SHAPES[:1] if quick else SHAPES
    methods = ("alibi", "rope") if quick else streamed_methods()
    rounds = 3 if quick else 10
    rows = []
    for hidden_dim, num_heads, slots in shapes:
        for method in methods:
            models = steps(method, hidden_dim, num_heads, slots)
            stop, stream = invoke_seconds(models, slots, rounds)
            rows.append(
                [
                    method,
                    f"D={hidden_dim}, N={num_heads}, S={slots}",
                    f"{stop * 1e6:.0f}",
                    f"{stream * 1e6:.0f}",
                    f"{stream / stop:.2f}x",
                ]
            )
            print(rows[-1], flush=True)
    write(
        "stream_step" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "A streaming int8 TFLM decode step against the stopping step of the "
        "same LM: median invoke time in the Python TFLM interpreter",
        ["method", "model", "stopping step (us)", "streaming step (us)", "ratio"],
        rows,
        notes=[
            f"Streaming: {SINKS} attention sinks and a ring of S - {SINKS} "
            "slots; untrained byte-level LMs (V=256, 2 layers, seed 0), "
            f"{rounds} interleaved rounds of S steps each; the stopping step at "
            "t = S - 1, the streaming one at t = S .. 2S - 1 (both attend to "
            "S keys).",
            "A RoPE or xPos streaming step caches each key rotated at its slot "
            "and turns the query three ways (its place, its slot c, c + W), "
            "reading each slot's logit from the right row "
            "(ops.cache.pick_rolling_logits): three one-row products a head "
            "where the stopping step has one.",
        ],
    )
