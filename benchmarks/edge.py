"""Edge: per method, int8 vs float32 size, LiteRT latency, TFLM arena, int8 accuracy."""

import time

import tensorflow as tf

import tflite_export
from benchmarks._common import write
from keras_posenc import models
from keras_posenc.data import recipes

keras = tf.keras


def _latency_ms(model_bytes, example, repeats=100):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(
        detail["index"], tflite_export.quantize(example, detail)[None]
    )
    interpreter.invoke()
    start = time.perf_counter()
    for _ in range(repeats):
        interpreter.invoke()
    return (time.perf_counter() - start) / repeats * 1e3


def run(quick):
    (train_x, train_y), (test_x, test_y) = recipes.digits_data()
    epochs = 5 if quick else 30
    rows = []
    for position in models.POSITION_METHODS:
        keras.utils.set_random_seed(0)
        model = recipes.digits_classifier(position, hidden_dim=64)
        model.fit(train_x, train_y, epochs=epochs, batch_size=32, verbose=0)
        float_accuracy = model.evaluate(test_x, test_y, verbose=0)[1]
        float32 = tflite_export.convert(model, train_x, "float32")
        if tflite_export.integer_blockers(model):  # no integer kernels
            refused = ["n/a"] * 4  # int8 bytes, ratio, latency, arena
            accuracy = [f"{float_accuracy:.3f}", "n/a", "n/a"]
            rows.append([position, len(float32), *refused, *accuracy])
            continue
        int8 = tflite_export.convert(model, train_x, "int8")
        report = tflite_export.verify(int8, None, test_x, test_y)
        rows.append(
            [
                position,
                len(float32),
                len(int8),
                f"{len(int8) / len(float32):.2f}",
                f"{_latency_ms(int8, test_x[0]):.2f}",
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
            "ratio nears 0.25 as models grow (0.285 at 270k weights)",
            "n/a: no integer kernels for the method's ops "
            "(`tflite_export.integer_blockers`): it exports in float32 only",
        ],
    )


def _maybe(value):
    return "n/a" if value is None else f"{value:.3f}"
