"""QAT: digits accuracy of float, post-training int8 and quantization-aware int8.

Per method (the ones `tflite_export.quantize_aware` covers), 3 seeds: the
float model; post-training int8 of it (calibrated on the training set); the
package's QAT (`quantize_aware(model)`, 5 epochs at a tenth of the learning
rate, converted with no data) in Keras and as int8 in LiteRT and TFLM; under
Keras 2 also TF-MOT's QAT (`engine="tfmot"`, converted with data). Means with
half the range over the seeds; int8 size and TFLM arena of the package's QAT.
"""

import numpy as np
import tensorflow as tf

import keras_posenc
import tflite_export
from benchmarks._common import write
from keras_posenc.data import recipes

keras = tf.keras

METHODS = ("none", "sinusoidal", "learned", "t5", "alibi", "dynamic_bias")
SEEDS = (0, 1, 2)


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return f"{np.mean(values):.3f} ± {(high - low) / 2:.3f}"


def _one(position, seed, data, epochs, qat_epochs):
    (train_x, train_y), (test_x, test_y) = data
    keras.utils.set_random_seed(seed)
    model = recipes.digits_classifier(position, hidden_dim=32)
    model.fit(train_x, train_y, epochs=epochs, batch_size=32, verbose=0)
    found = {"float": model.evaluate(test_x, test_y, verbose=0)[1]}
    ptq = tflite_export.convert(model, train_x, "int8")
    found["ptq"] = tflite_export.verify(ptq, None, test_x, test_y).accuracy_litert
    qat = recipes.compile_classifier(tflite_export.quantize_aware(model), 2e-4)
    qat.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
    found["qat_keras"] = qat.evaluate(test_x, test_y, verbose=0)[1]
    qat_bytes = tflite_export.convert(qat, None, "int8")
    report = tflite_export.verify(qat_bytes, None, test_x, test_y)
    found.update(
        qat_litert=report.accuracy_litert,
        qat_tflm=report.accuracy_tflm,
        size=len(qat_bytes),
        arena=report.arena_bytes,
        tfmot=None,
    )
    if not keras_posenc.IS_KERAS_3:
        tfmot = tflite_export.quantize_aware(model, engine="tfmot")
        tfmot = recipes.compile_classifier(tfmot, 2e-4)
        tfmot.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
        tfmot_bytes = tflite_export.convert(tfmot, train_x, "int8")
        found["tfmot"] = tflite_export.verify(
            tfmot_bytes, None, test_x, test_y
        ).accuracy_litert
    return found


def run(quick):
    data = recipes.digits_data()
    epochs, qat_epochs = (3, 1) if quick else (25, 5)
    seeds = SEEDS[:1] if quick else SEEDS
    rows = []
    for position in METHODS:
        runs = [_one(position, seed, data, epochs, qat_epochs) for seed in seeds]
        column = {key: [run[key] for run in runs] for key in runs[0]}
        rows.append(
            [
                position,
                _spread(column["float"]),
                _spread(column["ptq"]),
                _spread(column["qat_keras"]),
                _spread(column["qat_litert"]),
                _spread(column["qat_tflm"]),
                _spread(column["tfmot"])
                if not keras_posenc.IS_KERAS_3
                else "Keras 2 only",
                int(np.mean(column["size"])),
                column["arena"][0],
            ]
        )
    keras_name = "keras3" if keras_posenc.IS_KERAS_3 else "keras2"
    write(
        f"qat_{keras_name}" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "Quantization-aware training on digits (D=32, 2 layers, "
        f"{epochs} float epochs, {qat_epochs} QAT epochs, seeds {list(seeds)})",
        [
            "position",
            "float",
            "post-training int8 (LiteRT)",
            "QAT, Keras",
            "QAT int8, LiteRT",
            "QAT int8, TFLM",
            "TF-MOT QAT int8, LiteRT",
            "QAT int8 bytes",
            "TFLM arena",
        ],
        rows,
        [
            "mean ± half the range over the seeds; accuracy on the 360 held-out "
            "images (one image is 0.0028)",
            "run it in both modes: `python -m benchmarks --only qat` and "
            "`TF_USE_LEGACY_KERAS=1 python -m benchmarks --only qat`",
        ],
    )
