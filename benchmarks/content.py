"""A position defined by content: every method on "one sentence back".

`keras_posenc.data.synthetic.sentence_task`: at every token, the first word
of the previous sentence. Trained at T=24 on sentences of 1-4 words (to
convergence, early stopping, 3 seeds); tested on fresh text of the same kind
and on sentences of 3-8 words at T=48, where every answer lies further away
by the same rule (a split in spacing and length). Accuracy over the tokens
that have a previous sentence.
"""

import numpy as np

from benchmarks._common import summary, write
from benchmarks.accuracy import fit, settings, stopping, token_classifier
from keras_posenc import models
from keras_posenc.data import synthetic

LENGTH = 24
#: `(column, length, min_words, max_words)` of the test sets.
TESTS = (("same spacing", LENGTH, 1, 4), ("3-8 words, T=48", 2 * LENGTH, 3, 8))


def accuracy(model, length, min_words, max_words):
    x, y = synthetic.sentence_task(512, length, min_words, max_words, seed=7)
    predicted = np.argmax(model.predict(x, batch_size=128, verbose=0), -1)
    answered = y > 0  # tokens after the first sentence
    return float(np.mean(predicted[answered] == y[answered]))


def run(quick):
    setting = settings(quick)
    x, y = synthetic.sentence_task(setting["examples"], LENGTH)
    validation = synthetic.sentence_task(512, LENGTH, seed=100)
    rows = []
    for position in models.POSITION_METHODS:
        scores, epochs = [], []
        for seed in setting["seeds"]:
            model = token_classifier(position, 2 * LENGTH, seed)
            epochs.append(fit(model, x, y, validation, setting))
            scores.append([accuracy(model, *test[1:]) for test in TESTS])
        scores = np.asarray(scores)  # (seeds, tests)
        rows.append(
            [position]
            + [summary(column) for column in scores.T]
            + [f"{np.mean(epochs):.0f}"]
        )
        print(" | ".join(rows[-1]), flush=True)
    seeds = len(setting["seeds"])
    kind = (
        "SMOKE RUN (--quick; no advice)"
        if quick
        else f"to convergence, mean ±half-range over {seeds} seeds"
    )
    write(
        "content_positions",
        f'"One sentence back": the first word of the previous sentence, trained '
        f"at T={LENGTH} on 1-4-word sentences, {kind}",
        ["position"] + [test[0] for test in TESTS] + ["epochs"],
        rows,
        [
            f"{setting['examples']} training examples, batches of 128; "
            f"{stopping(setting)}; validation: 512 fresh examples",
            "accuracy over the tokens after the first sentence (512 fresh "
            "examples per test); 8 words: chance is 0.125",
            "the answer's distance varies with the sentence lengths: counting "
            "markers, not tokens, finds it",
        ],
    )
