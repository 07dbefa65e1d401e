"""Text: which Python documentation topic does a passage come from?

Real English text that ships with Python (`pydoc_data.topics`), tokenised
with tensorflow-text, cut into passages of 48 words from the 6 longest
topics, and classified by an encoder with a T5 relative position bias and
padding masked (`mask_zero=True`).

    python examples/text_pydoc.py [--epochs 8] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse

import numpy as np
import tensorflow as tf

from keras_posenc import models
from keras_posenc.data import recipes

keras = tf.keras
LENGTH, VOCAB, TOPICS = 48, 4000, 6


def passages(limit_words=None):
    """`(ids (N, 48), labels (N,), topic names)` from pydoc_data, via tf_text."""
    from pydoc_data.topics import topics

    import tensorflow_text as tf_text

    names = sorted(topics, key=lambda name: -len(topics[name]))[:TOPICS]
    tokenizer = tf_text.WhitespaceTokenizer()
    words = [
        [w.decode() for w in tokenizer.tokenize(tf.strings.lower(topics[n])).numpy()]
        for n in names
    ]
    if limit_words:
        words = [w[:limit_words] for w in words]
    counts = {}
    for text in words:
        for word in text:
            counts[word] = counts.get(word, 0) + 1
    common = sorted(counts, key=lambda w: -counts[w])[: VOCAB - 2]
    index = {w: i + 2 for i, w in enumerate(common)}  # 0 padding, 1 unknown
    ids, labels = [], []
    for label, text in enumerate(words):
        tokens = [index.get(w, 1) for w in text]
        for start in range(0, len(tokens), LENGTH):
            chunk = tokens[start : start + LENGTH]
            if len(chunk) >= LENGTH // 2:
                ids.append(chunk + [0] * (LENGTH - len(chunk)))
                labels.append(label)
    order = np.random.default_rng(0).permutation(len(ids))
    return np.array(ids, "int32")[order], np.array(labels)[order], names


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    x, y, names = passages(limit_words=600 if args.quick else None)
    split = int(0.8 * len(x))
    keras.utils.set_random_seed(0)
    model = models.build_classifier(
        TOPICS,
        vocab_size=VOCAB,
        hidden_dim=64,
        num_heads=4,
        num_layers=2,
        position="t5",
        dropout=0.1,
        mask_zero=True,
    )
    recipes.compile_classifier(model, 1e-3)
    model.fit(
        x[:split],
        y[:split],
        epochs=1 if args.quick else args.epochs,
        batch_size=32,
        verbose=0 if args.quick else 2,
    )
    accuracy = model.evaluate(x[split:], y[split:], verbose=0)[1]
    print(f"{len(x)} passages from topics {names}")
    print(f"test accuracy: {accuracy:.4f} (chance {1 / TOPICS:.2f})")
    return accuracy


if __name__ == "__main__":
    main()
