import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import gc  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_posenc  # noqa: E402, F401
import tflite_export  # noqa: E402, F401

# What the imports made lives as long as the process: out of the collector's
# way, so that each full collection (the TFLite converter runs one per
# conversion) walks only what the tests made since.
gc.collect()
gc.freeze()


@pytest.fixture(autouse=True)
def _seed_and_policy():
    tf.keras.utils.set_random_seed(0)
    np.random.seed(0)
    yield
    tf.keras.mixed_precision.set_global_policy("float32")
