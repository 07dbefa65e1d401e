"""Length extrapolation: train at length L, test at 2L..32L, per position method.

The task (`keras_posenc.data.synthetic`, "relative_offset") asks every token for
the token 3 places to its left: the same rule at every position, so a
relative method can apply it at any length, while absolute encodings meet
positions they never saw.

    python examples/length_extrapolation.py [--methods t5 alibi sinusoidal learned]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse

import tensorflow as tf

from keras_posenc import models
from keras_posenc.data import recipes, synthetic

keras = tf.keras


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["t5", "alibi", "dynamic_bias", "sinusoidal", "learned"],
        choices=models.POSITION_METHODS,
    )
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--window", type=int, default=None, help="attention_window")
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    quick, full = (256, 1, (1, 2)), (2048, 6, (1, 2, 8, 32))
    examples, epochs, scales = quick if args.quick else full
    x, y = synthetic.make_task("relative_offset", examples, args.length)
    results = {}
    for method in args.methods:
        keras.utils.set_random_seed(0)
        model = models.build_token_classifier(
            10,
            vocab_size=10,
            hidden_dim=32,
            num_heads=4,
            num_layers=1,
            position=method,
            attention_window=args.window,
            position_options={"max_length": max(scales) * args.length},
        )
        recipes.compile_classifier(model, 3e-3)
        model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
        results[method] = [
            model.evaluate(
                *synthetic.make_task("relative_offset", 32, s * args.length, seed=s),
                verbose=0,
            )[1]
            for s in scales
        ]
    print("| method | " + " | ".join(f"{s}x" for s in scales) + " |")
    print("| --- |" + " --- |" * len(scales))
    for method, accuracy in results.items():
        print(f"| {method} | " + " | ".join(f"{a:.3f}" for a in accuracy) + " |")
    return results


if __name__ == "__main__":
    main()
