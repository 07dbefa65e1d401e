"""Training on packed rows against one padded row per document (`packed`).

The documents are the paragraphs of the pydoc topics (`lm.pydoc_documents`:
2,608 of 20 to 860 bytes, median 114), cut at L. Packed: `lm.pack` lays them
into rows of L for `build_causal_lm(packed=True)` (each document from
position 0, attention inside it); padded: `lm.pad` puts each in a row of
its own for the same model unpacked. Both predict the same tokens (the
sample weights count each document's next tokens once). One epoch of
`model.fit` over all of them, after a traced warm-up, in interleaved rounds
in one process; tokens/s counts the predicted tokens.
"""

import time

import numpy as np
import tensorflow as tf

from benchmarks._common import write
from keras_posenc import models
from keras_posenc.data import language_modeling as lm

METHODS = ("rope", "t5", "learned")


def run(quick):
    length, rounds = (64, 1) if quick else (256, 3)
    batch = 16
    documents = lm.pydoc_documents()
    if quick:
        documents = documents[:300]
    packed_inputs, packed_labels, packed_weights = lm.pack(documents, length)
    pad_ids, pad_labels, pad_weights = lm.pad(documents, length)
    predicted = int(packed_weights.sum())
    assert predicted == int(pad_weights.sum())
    feeds = {
        "packed": (packed_inputs, packed_labels, packed_weights),
        "padded": (pad_ids, pad_labels, pad_weights),
    }
    rows = []
    for method in METHODS:
        fits = {}
        for kind, (x, y, w) in feeds.items():
            tf.keras.utils.set_random_seed(0)
            model = models.build_causal_lm(
                lm.VOCAB_SIZE,
                hidden_dim=64,
                num_layers=2,
                num_heads=4,
                position=method,
                packed=kind == "packed",
                position_options={"max_length": length},
            )
            model.compile(
                tf.keras.optimizers.Adam(1e-3),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            warm = _take(x, 2 * batch)
            model.fit(warm, y[: 2 * batch], sample_weight=w[: 2 * batch], verbose=0)
            fits[kind] = (model, x, y, w)
        seconds = {kind: [] for kind in feeds}
        losses = {}
        for _ in range(rounds):  # interleaved: packed, padded, packed, ...
            for kind, (model, x, y, w) in fits.items():
                start = time.perf_counter()
                history = model.fit(
                    x, y, sample_weight=w, batch_size=batch, epochs=1, verbose=0
                )
                seconds[kind].append(time.perf_counter() - start)
                losses[kind] = history.history["loss"][-1]
        speed = {kind: predicted / np.median(s) for kind, s in seconds.items()}
        spread = {
            kind: (max(s) - min(s)) / 2 / np.median(s) * 100
            for kind, s in seconds.items()
        }
        print(method, {k: f"{v:.0f}" for k, v in speed.items()}, flush=True)
        rows.append(
            [
                method,
                f"{speed['packed']:.0f} (±{spread['packed']:.0f}%)",
                f"{speed['padded']:.0f} (±{spread['padded']:.0f}%)",
                f"{speed['packed'] / speed['padded']:.2f}x",
            ]
        )
    fill = (packed_inputs["segment_ids"] > 0).mean()
    write(
        "packed",
        f"Training tokens/s on packed rows vs one padded row per document "
        f"(pydoc paragraphs, L={length}, batch {batch}, D=64, 2 layers"
        f"{'; --quick: a smoke run' if quick else ''})",
        ["method", "packed rows", "padded rows", "packed / padded"],
        rows,
        [
            f"{len(documents)} documents, {predicted} predicted tokens: "
            f"{len(packed_labels)} packed rows ({fill:.1%} of their slots hold a "
            f"token) against {len(pad_ids)} padded rows "
            f"({(pad_ids > 0).mean():.1%})",
            f"median of {rounds} interleaved epochs of `model.fit` in one "
            "process, after a traced warm-up; ± half the range over the epochs",
            "packed: `lm.pack` rows for `build_causal_lm(packed=True)` (each "
            "document from position 0, attention inside it); padded: `lm.pad` "
            "for the same model unpacked; the same sample weights (each "
            "document's next tokens once)",
            "`python -m benchmarks --only packed`",
        ],
    )


def _take(x, count):
    if isinstance(x, dict):
        return {key: value[:count] for key, value in x.items()}
    return x[:count]
