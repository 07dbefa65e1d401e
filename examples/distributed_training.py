"""Training under `tf.distribute.MirroredStrategy` (two logical CPU replicas).

The CPU is split into two logical devices so the strategy really mirrors the
model and splits each batch, as it would across two GPUs.

    python examples/distributed_training.py [--epochs 10] [--quick]
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
import argparse

import tensorflow as tf

from keras_posenc.data import recipes

keras = tf.keras


def split_cpu(replicas=2):
    """Two logical CPUs (only possible before TensorFlow initialises devices)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
        )
    except RuntimeError:  # already initialised (e.g. inside a test session)
        pass
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    devices = split_cpu()
    strategy = tf.distribute.MirroredStrategy(devices)
    (train_x, train_y), (test_x, test_y) = recipes.digits_data(
        limit=256 if args.quick else None
    )
    if args.quick:
        args.epochs = 1
    with strategy.scope():
        model = recipes.digits_classifier("hybrid", hidden_dim=32)
    model.fit(
        train_x,
        train_y,
        epochs=args.epochs,
        batch_size=64,
        verbose=0 if args.quick else 2,
    )
    accuracy = model.evaluate(test_x, test_y, verbose=0)[1]
    print(f"replicas: {strategy.num_replicas_in_sync}, test accuracy: {accuracy:.4f}")
    return strategy.num_replicas_in_sync, accuracy


if __name__ == "__main__":
    main()
