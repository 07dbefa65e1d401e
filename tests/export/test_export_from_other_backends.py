"""A causal LM trained on JAX or PyTorch exports from its `.keras` file.

The path for JAX and PyTorch users (docs/backends.md): train there, save
`.keras`, export with `python -m tflite_export` in a TensorFlow process.
The file gives the int8 TFLM model, byte for byte and token for token, that
the same weights give when they were trained on TensorFlow's side.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import tflite_export
from keras_posenc import IS_KERAS_3, models
from keras_posenc.utils import keras

TRAIN = """
import sys
import keras
import numpy as np
import keras_posenc

keras.utils.set_random_seed(0)
starts = np.random.default_rng(1).integers(0, 7, size=(64, 1))
ids = ((starts + np.arange(12)) % 7 + 1).astype("int32")  # 1..7, counting
lm = keras_posenc.models.build_causal_lm(24, **{config})
lm.compile(keras.optimizers.Adam(1e-2),
           keras.losses.SparseCategoricalCrossentropy(from_logits=True))
lm.fit(ids[:, :-1], ids[:, 1:], epochs=3, verbose=0)
lm.save(sys.argv[1])
np.save(sys.argv[2], ids)
"""
CONFIGS = {
    "jax": dict(hidden_dim=16, num_heads=2, num_layers=2, position="t5"),
    "torch": dict(hidden_dim=16, num_heads=2, num_layers=2, position="rope"),
}


@pytest.mark.slow
@pytest.mark.skipif(not IS_KERAS_3, reason="Keras 2 reads no multi-backend files")
@pytest.mark.parametrize("backend", sorted(CONFIGS))
def test_an_lm_trained_on_another_backend_exports_to_tensorflows_int8_tflm(
    tmp_path, backend
):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs {backend} (pip install -e '.[backends]')")
    saved, ids_path = tmp_path / f"{backend}.keras", tmp_path / "ids.npy"
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.pop("TF_USE_LEGACY_KERAS", None)
    script = TRAIN.format(config=CONFIGS[backend])
    run = [sys.executable, "-c", script, str(saved), str(ids_path)]
    subprocess.run(run, env=env, check=True, capture_output=True)
    out = tmp_path / "lm.tflite"
    cli = [sys.executable, "-m", "tflite_export", str(saved), "--calibration"]
    cli += [str(ids_path), "--out", str(out), "--target", "tflm"]
    subprocess.run(cli + ["--max-length", "32"], check=True, capture_output=True)
    # The same weights on TensorFlow's side: a twin built here takes them.
    trained = keras.models.load_model(saved)
    twin = models.build_causal_lm(24, **CONFIGS[backend])
    twin.set_weights(trained.get_weights())
    ids = np.load(ids_path)
    mine = tflite_export.convert_causal_lm(
        twin, ids, mode="int8", max_length=32, target="tflm"
    )
    assert out.read_bytes() == mine
    prompts = [[1, 2, 3], [4, 5]]
    tokens = tflite_export.generate_tflite(mine, prompts, 6, runtime="tflm")
    np.testing.assert_array_equal(
        tokens, tflite_export.generate_tflite(out.read_bytes(), prompts, 6, "tflm")
    )
    # It learned to count on its backend: the device continues the count.
    np.testing.assert_array_equal(tokens[0], [1, 2, 3, 4, 5, 6, 7, 1, 2])
