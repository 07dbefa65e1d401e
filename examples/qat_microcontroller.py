"""Quantization-aware training to a microcontroller-ready file (Keras 2 / TF-MOT).

TF-MOT works only with Keras 2, so this script switches to it before
TensorFlow is imported. It trains the digits classifier in float, fine-tunes
it with fake quantization, converts it to full int8, checks it in LiteRT and
TFLM, and writes the `.tflite` and the C array for firmware.

    python examples/qat_microcontroller.py [--out qat_output] [--quick]
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow

import argparse  # noqa: E402
import pathlib  # noqa: E402

import tensorflow as tf  # noqa: E402

import tflite_export  # noqa: E402
from keras_posenc.data import recipes  # noqa: E402

keras = tf.keras


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("qat_output"))
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    epochs, qat_epochs = (1, 1) if args.quick else (25, 5)
    (train_x, train_y), (test_x, test_y) = recipes.digits_data(
        limit=256 if args.quick else None
    )
    keras.utils.set_random_seed(0)
    model = recipes.digits_classifier("hybrid", hidden_dim=32)
    model.fit(train_x, train_y, epochs=epochs, batch_size=32, verbose=0)
    float_accuracy = model.evaluate(test_x, test_y, verbose=0)[1]
    qat_model = tflite_export.quantize_aware(model, engine="tfmot")
    qat = recipes.compile_classifier(qat_model, 2e-4)
    qat.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
    model_bytes = tflite_export.convert(qat, train_x, mode="int8")
    report = tflite_export.verify(model_bytes, None, test_x, test_y)
    tflite_export.atomic_write(args.out / "digits_qat.tflite", model_bytes, force=True)
    tflite_export.write_c_array(model_bytes, args.out / "digits_qat.cc", force=True)
    print(f"float accuracy {float_accuracy:.4f}")
    print(report.table())
    return float_accuracy, report


if __name__ == "__main__":
    main()
