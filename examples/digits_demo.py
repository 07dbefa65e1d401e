"""The main job (`make demo`): digits as a sequence, trained, exported, verified.

sklearn's 8x8 digits (real data shipped with scikit-learn) are read as a
sequence of 16 tokens, each a 2x2 patch of pixels: without position encoding
the model would see a bag of patches. The recommended method for small data,
"hybrid" (fixed sinusoids at the input, convolutional position generators in
later layers, and a 2-D dynamic relative bias over the 4x4 patch grid), is
trained with `model.fit`, exported to full int8, run in LiteRT and in the TFLM
interpreter, and written as a C array. Plots go to the output folder.

    python examples/digits_demo.py [--epochs 30] [--out demo_output] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse
import pathlib
import sys
import time

import numpy as np
import tensorflow as tf

import tflite_export
from keras_posenc import viz
from keras_posenc.data import recipes

keras = tf.keras
GRID = (4, 4)


def train(x, y, epochs, verbose, hidden_dim=64):
    """The hybrid classifier with 2-D grid positions, trained with cosine decay.

    Early stopping watches the validation loss (patience 10) and keeps the
    best weights, so the run stops once the validation curve is flat.
    """
    steps = epochs * int(np.ceil(len(x) * 0.9 / 32))
    schedule = keras.optimizers.schedules.CosineDecay(2e-3, steps, alpha=0.05)
    model = recipes.digits_classifier(
        "hybrid",
        hidden_dim=hidden_dim,
        learning_rate=schedule,
        num_layers=2,
        dropout=0.1,
        position_options={"grid_shape": GRID},
    )
    stop = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=10, restore_best_weights=True
    )
    history = model.fit(
        x,
        y,
        epochs=epochs,
        batch_size=32,
        validation_split=0.1,
        verbose=verbose,
        callbacks=[stop],
    )
    return model, history.history


def save_plots(model, history, x, out):
    viz.learning_curves(history).savefig(out / "learning_curves.png")
    hpn = model.get_layer("position_network")
    norm = model.get_layer("embedding_norm")
    embedded = keras.Model(model.input, norm.output)
    h = embedded(x[:64])
    generated = [
        np.mean(hpn(h, i).numpy() - h.numpy(), axis=0) for i in range(hpn.depth)
    ]
    viz.generated_positions(generated).savefig(out / "generated_positions.png")
    sinusoid = model.get_layer("sinusoidal_positions")(h).numpy()[0]
    viz.position_similarity(sinusoid + generated[0]).savefig(
        out / "position_similarity.png"
    )
    bias = model.get_layer("attention_0").position_bias(h)
    viz.relative_bias(bias.numpy(), "2-D dynamic bias per head").savefig(
        out / "relative_bias.png"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo_output"))
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()  # the README's table, exactly
    (train_x, train_y), (test_x, test_y) = recipes.digits_data(
        limit=300 if args.quick else None
    )
    if args.quick:
        args.epochs = 1
    # Progress bars in a terminal, one line per epoch in a log file.
    verbose = 0 if args.quick else (1 if sys.stdout.isatty() else 2)
    model, history = train(
        train_x, train_y, args.epochs, verbose, 16 if args.quick else 64
    )
    float_accuracy = model.evaluate(test_x, test_y, verbose=0)[1]

    int8 = tflite_export.convert(model, train_x, mode="int8")
    float32 = tflite_export.convert(model, train_x, mode="float32")
    static = tflite_export.static_model(model, test_x.shape[1:], "float32")
    report = tflite_export.verify(int8, static, test_x, test_y)
    tflite_export.atomic_write(args.out / "digits_int8.tflite", int8, force=True)
    tflite_export.write_c_array(
        int8, args.out / "digits_int8.cc", force=True, arena_bytes=report.arena
    )
    save_plots(model, history, test_x, args.out)

    rows = [
        ("float test accuracy (Keras)", f"{float_accuracy:.4f}"),
        ("int8 accuracy, LiteRT", f"{report.accuracy_litert:.4f}"),
        ("int8 accuracy, TFLM", _maybe(report.accuracy_tflm)),
        ("float32 .tflite size", f"{len(float32)} bytes"),
        ("int8 .tflite size", f"{len(int8)} bytes ({len(int8) / len(float32):.2f}x)"),
        ("TFLM arena", f"{report.arena_bytes} bytes"),
        ("TFLM arena, 32-bit part", f"{report.arena_bytes_32bit} bytes"),
        ("TFLM runs", "yes" if report.tflm_ok else f"no: {report.tflm_error}"),
        ("ops", ", ".join(report.ops)),
        ("outputs", f"{args.out}/ (.tflite, .cc and .h, 4 PNG plots)"),
        ("epochs (early stopping)", f"{len(history['loss'])} of {args.epochs}"),
        ("wall time", f"{time.time() - start:.0f} s"),
    ]
    print("\n| digits, position='hybrid' | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return {"float": float_accuracy, "report": report, "rows": rows}


def _maybe(value):
    return "n/a" if value is None else f"{value:.4f}"


if __name__ == "__main__":
    main()
