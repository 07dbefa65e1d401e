"""Context extension: RoPE trained at length L, evaluated at 1x-8x L per scaling.

One model per seed is trained once with default RoPE on the relative lookup
task, then evaluated as trained and after `keras_posenc.utils.set_rope_scaling`
switches it to each scaling (no retraining); xPos is a separately trained row.
Full runs report the mean and half-range over 3 seeds; `--quick` is a
one-seed smoke run.
"""

import numpy as np
import tensorflow as tf

from benchmarks._common import summary, write
from keras_posenc import models, utils
from keras_posenc.data import recipes, synthetic

keras = tf.keras
SCALES = (1, 2, 4, 8)
LENGTH = 16
#: `(row name, set_rope_scaling arguments)`; L0 is the training length.
SCALINGS = (
    ("as trained (default)", {"rope_type": "default"}),
    ("linear (s=8)", {"rope_type": "linear", "scaling_factor": 8.0}),
    ("ntk (s=8)", {"rope_type": "ntk", "scaling_factor": 8.0}),
    ("dynamic (s=8)", {"rope_type": "dynamic", "scaling_factor": 8.0}),
    ("yarn (s=8)", {"rope_type": "yarn", "scaling_factor": 8.0}),
    ("llama3 (s=8)", {"rope_type": "llama3", "scaling_factor": 8.0}),
)


def _trained(position, examples, epochs, seed):
    x, y = synthetic.make_task("relative_offset", examples, LENGTH)
    keras.utils.set_random_seed(seed)
    model = models.build_token_classifier(
        10, vocab_size=10, hidden_dim=32, num_heads=4, num_layers=2, position=position
    )
    recipes.compile_classifier(model, 3e-3)
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return model


def _accuracy(model):
    scores = []
    for scale in SCALES:
        x, y = synthetic.make_task("relative_offset", 128, scale * LENGTH, seed=scale)
        scores.append(model.evaluate(x, y, verbose=0)[1])
    return scores


def run(quick):
    examples, epochs = (2000, 4) if quick else (4000, 10)
    seeds = (0,) if quick else (0, 1, 2)
    scores = {name: [] for name, _ in SCALINGS}
    scores["xpos (trained with it)"] = []
    for seed in seeds:
        model = _trained("rope", examples, epochs, seed)
        for name, scaling in SCALINGS:
            if scaling["rope_type"] != "default":
                scaling = dict(scaling, original_max_position_embeddings=LENGTH)
            utils.set_rope_scaling(model, **scaling)
            scores[name].append(_accuracy(model))
        xpos = _trained("xpos", examples, epochs, seed)
        scores["xpos (trained with it)"].append(_accuracy(xpos))
    rows = [
        [name] + [summary(column) for column in np.asarray(runs).T]
        for name, runs in scores.items()
    ]
    kind = "one-seed SMOKE RUN" if quick else "mean ±half-range over 3 seeds"
    write(
        "rope_extension",
        f"RoPE context extension: trained once at T={LENGTH} ({examples} examples, "
        f"{epochs} epochs), per-token accuracy at 1x-8x, {kind}",
        ["rope scaling after training", "1x", "2x", "4x", "8x"],
        rows,
        [
            "one trained model per seed, switched with "
            "keras_posenc.utils.set_rope_scaling "
            f"(original_max_position_embeddings={LENGTH}); weights never change",
            "labels are lookups over 9 tokens: chance is about 0.11",
        ],
    )
