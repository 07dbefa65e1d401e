"""Edge: per method, int8 vs float32 size, LiteRT latency, TFLM arena, int8 accuracy."""

import time

import numpy as np
import tensorflow as tf

import tflite_export
from benchmarks._common import write
from keras_posenc import datasets, models

keras = tf.keras


def _latency_ms(model_bytes, example, repeats=100):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    scale, zero = detail["quantization"]
    value = example if scale == 0 else np.round(example / scale + zero)
    interpreter.set_tensor(detail["index"], value.astype(detail["dtype"])[None])
    interpreter.invoke()
    start = time.perf_counter()
    for _ in range(repeats):
        interpreter.invoke()
    return (time.perf_counter() - start) / repeats * 1e3


def run(quick):
    x, y = datasets.digits_patches()
    split = int(0.8 * len(x))
    epochs = 5 if quick else 30
    rows = []
    for position in models.POSITION_METHODS:
        keras.utils.set_random_seed(0)
        model = models.build_classifier(
            10,
            input_dim=4,
            sequence_length=16,
            hidden_dim=64,
            num_heads=4,
            position=position,
        )
        model.compile(
            keras.optimizers.Adam(2e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        model.fit(x[:split], y[:split], epochs=epochs, batch_size=32, verbose=0)
        float_accuracy = model.evaluate(x[split:], y[split:], verbose=0)[1]
        int8 = tflite_export.convert(model, x[:split], "int8")
        float32 = tflite_export.convert(model, x[:split], "float32")
        report = tflite_export.verify(int8, None, x[split:], y[split:])
        rows.append(
            [
                position,
                len(float32),
                len(int8),
                f"{len(int8) / len(float32):.2f}",
                f"{_latency_ms(int8, x[0]):.2f}",
                report.arena_bytes,
                f"{float_accuracy:.3f}",
                f"{report.accuracy_litert:.3f}",
                _maybe(report.accuracy_tflm),
            ]
        )
    write(
        "edge",
        f"Edge export per method: digits classifier (D=64, 2 layers, {epochs} epochs)",
        [
            "position",
            "float32 B",
            "int8 B",
            "int8/float32",
            "LiteRT int8 ms",
            "TFLM arena B",
            "float acc",
            "int8 LiteRT acc",
            "int8 TFLM acc",
        ],
        rows,
        [
            "sizes include ~30 KB of per-channel scales and tensor names; the "
            "ratio nears 0.25 as models grow (0.285 at 270k weights)"
        ],
    )


def _maybe(value):
    return "n/a" if value is None else f"{value:.3f}"
