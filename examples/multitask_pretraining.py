"""Multi-task pre-training with position-aware auxiliary tasks and warm-up.

An encoder with a hierarchical position network learns, on real English text
(Python's own `pydoc_data` topics), three position tasks at once: predict each
token's index, the clipped distance between sampled token pairs, and the
original order of shuffled tokens. `PositionWarmup` keeps the position
generators frozen for the first steps, then releases them gradually.

    python examples/multitask_pretraining.py [--epochs 3] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse

import numpy as np
import tensorflow as tf

from keras_posenc import models
from keras_posenc.training import auxiliary
from keras_posenc.training.callbacks import PositionWarmup

keras = tf.keras


def pydoc_token_ids(length, vocab_size, limit=None):
    """Word ids `(N, length)` from pydoc_data's topic texts (no tokenizer)."""
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).lower().split()[:limit]
    vocabulary = {
        w: i + 1
        for i, (w, _) in enumerate(
            sorted(_counts(words).items(), key=lambda item: -item[1])[: vocab_size - 1]
        )
    }
    ids = np.array([vocabulary.get(w, 0) for w in words], dtype="int32")
    usable = len(ids) // length * length
    return ids[:usable].reshape(-1, length)


def _counts(words):
    counts = {}
    for word in words:
        counts[word] = counts.get(word, 0) + 1
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    length, vocab = 32, 2000
    tokens = pydoc_token_ids(length, vocab, limit=4000 if args.quick else None)
    encoder = models.build_encoder(
        vocab_size=vocab,
        sequence_length=length,
        hidden_dim=32,
        num_heads=4,
        num_layers=2,
        position="hpn",
    )
    tasks = [
        auxiliary.PositionPrediction(length),
        auxiliary.RelativeDistancePrediction(max_distance=8),
        auxiliary.OrderRecovery(length),
    ]
    model = auxiliary.build_pretraining_model(encoder, tasks)
    model.compile(keras.optimizers.Adam(2e-3), loss=auxiliary.task_losses(tasks))
    rng = np.random.default_rng(0)
    x, y = auxiliary.pretraining_data(tasks, tokens, rng)
    warmup = PositionWarmup(warmup_steps=20, ramp_steps=40)
    history = model.fit(
        x,
        y,
        epochs=1 if args.quick else args.epochs,
        batch_size=32,
        callbacks=[warmup],
        verbose=0 if args.quick else 2,
    ).history
    print(
        f"{len(tokens)} sequences of {length} pydoc words; warm-up steps seen: "
        f"{warmup.step}"
    )
    for key, values in history.items():
        print(f"{key}: {values[0]:.3f} -> {values[-1]:.3f}")
    return history


if __name__ == "__main__":
    main()
