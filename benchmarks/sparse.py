"""Where each sparse attention wins: dense, block-local and LSH on two tasks.

Two synthetic tasks, each model trained at T=256 and read at T=4096 and
8192 (the rules hold at any length, so the long reads test the attention,
not the fit):
- retrieval (`keras_posenc.data.synthetic.retrieval_task`): four pairs of
  (key, value) in the first eighth of the sequence, a question for one key
  at the end; the answer is ~7T/8 tokens back, far outside a band of 3W.
- relative lookup (`make_task("relative_offset")`): each token outputs the
  token 3 places back, a local rule.
Every variant is the same 2-layer encoder (D=32, N=2, T5 bias) with the same
steps and data; only the attention differs. Accuracy is the mean over 3
seeds with the half-range; time and memory are one forward+backward step of
the model at batch 1, each length in a fresh process (as `scaling`).
"""

import json
import sys

import numpy as np

from benchmarks._common import own_peak_rss_mb, peak_rss_mb, summary, write

#: `name: encoder arguments`, the attention of every layer.
VARIANTS = {
    "dense": {},
    "block-local W=32": {"attention_window": 32},
    "LSH C=32 R=2": {
        "attention_options": {
            "attention_type": "lsh",
            "bucket_size": 32,
            "num_hashes": 2,
        },
    },
}
TASKS = ("retrieval", "relative lookup")
TRAIN_LENGTH, READ_LENGTHS = 256, (4096, 8192)
QUICK = dict(train_length=128, read_lengths=(512,), examples=128, epochs=1, seeds=1)
FULL = dict(
    train_length=TRAIN_LENGTH,
    read_lengths=READ_LENGTHS,
    examples=1024,
    epochs=10,
    seeds=3,
)
READ_EXAMPLES = 32


def _model(variant, task, vocab_size, classes):
    import tensorflow as tf

    from keras_posenc import models

    keras = tf.keras
    encoder = models.build_encoder(
        vocab_size=vocab_size,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        position="t5",
        **VARIANTS[variant],
    )
    tokens = keras.Input((None,), dtype="int32")
    hidden = encoder(tokens)
    if task == "retrieval":  # the answer is read at the question
        hidden = keras.layers.Lambda(lambda h: h[:, -1])(hidden)
    return keras.Model(tokens, keras.layers.Dense(classes)(hidden))


def _data(task, examples, length, seed):
    from keras_posenc.data import synthetic

    if task == "retrieval":
        x, y = synthetic.retrieval_task(examples, length, seed=seed)
        return x, y, synthetic.retrieval_vocab_size(), 8
    x, y = synthetic.make_task("relative_offset", examples, length, seed=seed)
    return x, y, 10, 10


def train_and_read(variant, task, seed, quick):
    """Accuracies at the read lengths of one trained model, printed as JSON."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(int(seed))
    plan = QUICK if quick == "1" else FULL
    x, y, vocab, classes = _data(task, plan["examples"], plan["train_length"], seed)
    model = _model(variant, task, vocab, classes)
    model.compile(
        tf.keras.optimizers.Adam(3e-3),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x, y, batch_size=16, epochs=plan["epochs"], verbose=0)
    accuracies = {}
    for length in plan["read_lengths"]:
        rx, ry, _, _ = _data(task, READ_EXAMPLES, length, seed + 1000)
        predicted = np.concatenate(
            [np.argmax(model(rx[i : i + 1]).numpy(), -1) for i in range(READ_EXAMPLES)]
        )
        accuracies[str(length)] = float(np.mean(predicted == ry))
    print(json.dumps(accuracies))


def measure(variant, length):
    """One forward+backward step of the model at batch 1: ms and peak MB."""
    import tensorflow as tf

    from benchmarks._common import median_seconds

    x, y, vocab, classes = _data("retrieval", 1, int(length), 0)
    model = _model(variant, "retrieval", vocab, classes)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return value, tape.gradient(value, model.trainable_variables)

    seconds = median_seconds(step, repeats=3, warmup=1)
    print(json.dumps({"seconds": seconds, "peak_mb": own_peak_rss_mb()}))


def run(quick):
    plan = QUICK if quick else FULL
    lengths = plan["read_lengths"]
    rows = []
    for variant in VARIANTS:
        row = [variant]
        for task in TASKS:
            runs = [
                peak_rss_mb(
                    "benchmarks.sparse",
                    "train",
                    variant,
                    task,
                    seed,
                    int(quick),
                    timeout=3600,
                )
                for seed in range(plan["seeds"])
            ]
            for length in lengths:
                if any("error" in result for result in runs):
                    row.append("failed")
                    continue
                row.append(summary([result[str(length)] for result in runs]))
        for length in lengths:
            result = peak_rss_mb("benchmarks.sparse", "measure", variant, length)
            cell = "failed"
            if "error" not in result:
                cell = f"{result['seconds'] * 1e3:.0f} / {result['peak_mb']:.0f}"
            row.append(cell)
        rows.append(row)
        print(" | ".join(row), flush=True)
    smoke = " (--quick: a smoke run)" if quick else ""
    header = ["attention"]
    for task in TASKS:
        header += [f"{task} accuracy, T={t}" for t in lengths]
    header += [f"T={t} step ms / peak MB" for t in lengths]
    write(
        "sparse",
        f"Dense, block-local and LSH attention, trained at T={plan['train_length']}"
        + smoke,
        header,
        rows,
        [
            f"accuracy: {READ_EXAMPLES} held-out sequences per length, mean "
            f"±half-range over {plan['seeds']} seeds (retrieval: the answer at "
            "the question, chance 1/8; relative lookup: every token, chance "
            "~1/10)",
            "every model: 2-layer encoder, D=32, N=2, T5 bias, Adam 3e-3, "
            f"batch 16, {plan['epochs']} epochs of {plan['examples']} sequences",
            "step: one forward+backward at batch 1 in graph mode, median of 3 "
            "after one; peak MB: the process's peak resident set",
        ],
    )


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train_and_read(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        measure(sys.argv[2], sys.argv[3])
