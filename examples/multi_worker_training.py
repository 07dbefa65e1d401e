"""Multi-worker training with `tf.distribute.MultiWorkerMirroredStrategy`.

Each worker is one process (here two on 127.0.0.1; on real machines, one per
host with its own address in `--workers`). Every global batch is split
between the workers, gradients are all-reduced, and every worker ends with
the same weights as one process training on the same global batches.

    # one command per worker, the same --workers list everywhere:
    python examples/multi_worker_training.py --workers host0:2222,host1:2222 \
        --index 0 --out weights0.npz
    python examples/multi_worker_training.py --workers host0:2222,host1:2222 \
        --index 1 --out weights1.npz
    # the single-process reference:
    python examples/multi_worker_training.py --out reference.npz
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse
import json
import os

import numpy as np

GLOBAL_BATCH, STEPS, EPOCHS = 32, 4, 3


def data():
    """A fixed token task: `(x (128, 10), y (128,))`."""
    rng = np.random.default_rng(0)
    x = rng.integers(1, 12, size=(GLOBAL_BATCH * STEPS, 10)).astype("int32")
    return x, (x[:, 0] % 3).astype("int32")


def build():
    """The same initial weights in every process (seeded)."""
    import tensorflow as tf

    from keras_posenc import models

    tf.keras.utils.set_random_seed(11)
    return models.build_classifier(
        3, vocab_size=12, hidden_dim=16, num_heads=2, num_layers=1, position="t5"
    )


def train(strategy=None):
    """Trains on the global batches; with `strategy`, split across its workers.

    A custom loop (`strategy.run`): Keras 3's `model.fit` does not run under
    `MultiWorkerMirroredStrategy` (keras-team/keras#20585); this loop runs in
    both Keras modes. Each replica's loss is its summed per-example losses
    over the *global* batch size, so the all-reduced gradient is the
    gradient of the global batch mean, as in one process (SGD, so float
    summation order stays at the 1e-7 level; Adam's normalisation magnifies it).
    """
    import tensorflow as tf

    keras = tf.keras
    strategy = strategy or tf.distribute.get_strategy()
    x, y = data()
    with strategy.scope():
        model = build()
        optimizer = keras.optimizers.SGD(0.1)
        losses = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )

    def shard(context):  # this pipeline's slice of every global batch
        per = GLOBAL_BATCH // context.num_replicas_in_sync
        first = context.input_pipeline_id * per
        rows = np.concatenate(
            [
                np.arange(b + first, b + first + per)
                for b in range(0, len(x), GLOBAL_BATCH)
            ]
        )
        return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(per)

    def replica_step(tokens, labels):
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            loss = tf.reduce_sum(losses(labels, logits)) / GLOBAL_BATCH
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function
    def step(tokens, labels):
        return strategy.run(replica_step, args=(tokens, labels))

    dataset = strategy.distribute_datasets_from_function(shard)
    for _ in range(EPOCHS):
        for tokens, labels in dataset:
            step(tokens, labels)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default=None, help="host:port,host:port,...")
    parser.add_argument("--index", type=int, default=0, help="this worker's index")
    parser.add_argument("--out", required=True, help="where to save the weights")
    args = parser.parse_args(argv)
    strategy = None
    if args.workers:
        cluster = {"worker": args.workers.split(",")}
        task = {"type": "worker", "index": args.index}
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model = train(strategy)
    np.savez(args.out, *model.get_weights())
    print(
        f"worker {args.index}: saved {len(model.get_weights())} weights to {args.out}"
    )


if __name__ == "__main__":
    main()
