"""Quantization-aware training to a microcontroller-ready file (Keras 3 or 2).

Trains the digits classifier in float, fine-tunes it with fake quantization,
converts it to full int8, checks it in LiteRT and TFLM, and writes the
`.tflite` and the C array for firmware (with its ops and arena). The
package's own QAT (`--engine posenc`, the default) runs in Keras 3 and
Keras 2 and converts without data; `--engine tfmot` uses TF-MOT, which works
only with Keras 2: the script then switches to it before TensorFlow is
imported, and calibrates the tensors TF-MOT leaves unranged with data.

    python examples/qat_microcontroller.py [--engine posenc|tfmot]
        [--out qat_output] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse
import os
import pathlib


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("qat_output"))
    parser.add_argument(
        "--engine",
        choices=("posenc", "tfmot"),
        default="posenc",
        help="the package's QAT (Keras 3 or 2) or TF-MOT's (Keras 2 only)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    if args.engine == "tfmot":
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow
    import tflite_export
    from keras_posenc.data import recipes

    args.out.mkdir(parents=True, exist_ok=True)
    # --quick still learns (a model near chance has near-tied logits, which
    # LiteRT's and TFLM's roundings would answer apart).
    epochs, qat_epochs = (10, 2) if args.quick else (25, 5)
    (train_x, train_y), (test_x, test_y) = recipes.digits_data(
        limit=640 if args.quick else None
    )
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = recipes.digits_classifier("hybrid", hidden_dim=32)
    model.fit(train_x, train_y, epochs=epochs, batch_size=32, verbose=0)
    float_accuracy = model.evaluate(test_x, test_y, verbose=0)[1]
    qat_model = tflite_export.quantize_aware(model, engine=args.engine)
    qat = recipes.compile_classifier(qat_model, 2e-4)
    qat.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
    # TF-MOT leaves tensors inside layers unranged: they calibrate on data.
    data = train_x if args.engine == "tfmot" else None
    model_bytes = tflite_export.convert(qat, data, mode="int8")
    report = tflite_export.verify(model_bytes, None, test_x, test_y)
    tflite_export.atomic_write(args.out / "digits_qat.tflite", model_bytes, force=True)
    tflite_export.write_c_array(
        model_bytes,
        args.out / "digits_qat.cc",
        force=True,
        arena_bytes=report.arena,
    )
    print(f"float accuracy {float_accuracy:.4f}")
    print(report.table())
    return float_accuracy, report


if __name__ == "__main__":
    main()
