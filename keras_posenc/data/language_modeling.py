"""The byte-level language-model experiment on Python's own documentation.

Shared by `examples/char_lm_pydoc.py` and `benchmarks/lm.py`: the text of
`pydoc_data.topics` (it ships with Python) as UTF-8 bytes, a causal LM
trained on windows of length L, and bits per byte at longer lengths (the
experiment of Press et al., 2022, figure 1: how each position method
extrapolates past its training length).
"""

import math
import time

import numpy as np

from keras_posenc import _checks, models
from keras_posenc._compat import keras

#: Byte-level vocabulary: every UTF-8 byte value.
VOCAB_SIZE = 256


def pydoc_bytes(validation_fraction=0.1):
    """`(train, validation)` int32 byte ids of the pydoc topics, split by position.

    The topics are joined in sorted order; the last `validation_fraction`
    of the bytes is held out, so no validation text is seen in training.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
    split = int(len(ids) * (1.0 - validation_fraction))
    return ids[:split], ids[split:]


def windows(ids, length, count=None, seed=0):
    """`(inputs, targets)` of shape `(N, length)`: next-byte prediction windows.

    Without `count`, non-overlapping windows cover `ids` in order; with it,
    `count` windows start at random offsets (seeded).
    """
    length = _checks.positive_int("length", length)
    if len(ids) < length + 1:
        _checks.fail("length", f"below the text length {len(ids)}", length)
    if count is None:
        starts = np.arange(0, len(ids) - length - 1, length)
    else:
        starts = np.random.default_rng(seed).integers(0, len(ids) - length - 1, count)
    rows = np.stack([ids[s : s + length + 1] for s in starts])
    return rows[:, :-1], rows[:, 1:]


def train(position, train_ids, length, steps, batch_size=32, seed=0, **model_kwargs):
    """A causal LM trained for `steps` batches of random windows of `length`.

    Returns:
        `(model, seconds spent in fit)`.
    """
    keras.utils.set_random_seed(seed)
    options = dict(hidden_dim=64, num_layers=2, num_heads=4, max_length=8 * length)
    options.update(model_kwargs)
    model = models.build_causal_lm(VOCAB_SIZE, position=position, **options)
    model.compile(
        keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(3e-3, steps)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = windows(train_ids, length, steps * batch_size, seed)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    return model, time.perf_counter() - start


def bits_per_byte(model, ids, length, max_windows=64):
    """Mean next-byte cross-entropy in bits over non-overlapping windows of `length`."""
    x, y = windows(ids, length)
    x, y = x[:max_windows], y[:max_windows]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    total = 0.0
    for start in range(0, len(x), 8):
        logits = model(x[start : start + 8], training=False)
        total += float(loss(y[start : start + 8], logits)) * len(x[start : start + 8])
    return total / len(x) / math.log(2.0)


def tokens_per_second(model, prompt, new_tokens, use_cache, repeats=2):
    """Greedy `generate` speed: new tokens per second (best of `repeats`, warmed)."""
    model.generate(prompt, new_tokens, use_cache=use_cache)  # traces the steps
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(prompt, new_tokens, use_cache=use_cache)
        best = min(best, time.perf_counter() - start)
    return new_tokens * len(prompt) / best


def text_of(ids):
    """Text of byte ids (invalid UTF-8 sequences replaced)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
