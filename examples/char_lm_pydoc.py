"""Language modelling: bits per byte past the training length, per position method.

A byte-level causal LM of Python's own documentation (`pydoc_data`, shipped
with Python) is trained at context L for every position method and
evaluated on held-out text at 1x, 2x, 4x and 8x L: the experiment of Press
et al. 2022 (ALiBi, figure 1). Then it generates text from a prompt and
times decoding with and without the KV cache.

    python examples/char_lm_pydoc.py [--methods alibi rope sinusoidal] \
        [--length 64] [--steps 600] [--out lm_output] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse
import os

from keras_posenc.data import language_modeling as lm
from keras_posenc.generation import Sampling
from keras_posenc.models import POSITION_METHODS

SCALES = (1, 2, 4, 8)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(POSITION_METHODS))
    parser.add_argument("--length", type=int, default=64, help="training length L")
    parser.add_argument("--steps", type=int, default=600, help="training batches")
    parser.add_argument("--out", default=None, help="folder for the plot")
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods) - set(POSITION_METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {POSITION_METHODS}")
    length, steps, windows = args.length, args.steps, 64
    if args.quick:
        length, steps, windows = 16, 20, 4
    train_ids, validation_ids = lm.pydoc_bytes()
    results, models = {}, {}
    for method in args.methods:
        model, seconds = lm.train(method, train_ids, length, steps)
        results[method] = [
            lm.bits_per_byte(model, validation_ids, s * length, windows) for s in SCALES
        ]
        models[method] = model
        print(f"trained {method} in {seconds:.0f} s", flush=True)
    print(f"\nbits per byte on held-out pydoc text, trained at L={length}")
    print("| method | " + " | ".join(f"{s}x L" for s in SCALES) + " |")
    print("| --- |" + " --- |" * len(SCALES))
    for method, bits in results.items():
        print(f"| {method} | " + " | ".join(f"{b:.3f}" for b in bits) + " |")
    best = min(results, key=lambda name: results[name][-1])
    prompt = list(validation_ids[:length])
    new = 16 if args.quick else 256
    model = models[best]
    text = model.generate(
        [prompt], new, sampling=Sampling(sampler="top_p", top_p=0.8, seed=0)
    )
    print(f"\n{best} continues {lm.text_of(prompt)!r} with:")
    print(repr(lm.text_of(text[0, len(prompt) :])))
    cached = lm.tokens_per_second(model, [prompt], new, use_cache=True)
    recomputed = lm.tokens_per_second(model, [prompt], new, use_cache=False)
    print(
        f"\n{new} new tokens: {cached:.0f} tokens/s with the cache, "
        f"{recomputed:.0f} recomputing ({cached / recomputed:.1f}x)"
    )
    if args.out:
        plot(results, length, args.out)
    return results


def plot(results, length, folder):
    """Saves bits per byte against evaluation length, one line per method."""
    from keras_posenc import viz

    os.makedirs(folder, exist_ok=True)
    lengths = [s * length for s in SCALES]
    figure = viz.extrapolation(results, lengths, length, "bits per byte (held out)")
    path = os.path.join(folder, "lm_extrapolation.png")
    figure.savefig(path, dpi=120)
    return path


if __name__ == "__main__":
    main()
