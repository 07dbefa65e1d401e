"""Models saved by earlier versions load and give the same outputs.

The fixtures in `tests/fixtures/` were written by
`tests/fixtures/make_saved_models.py` before the public-seams refactor, one
folder per Keras mode (a `.keras` file does not cross modes).
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import IS_KERAS_3

FOLDER = (
    pathlib.Path(__file__).resolve().parent
    / "fixtures"
    / ("keras3" if IS_KERAS_3 else "keras2")
)
STEMS = sorted(path.stem for path in FOLDER.glob("*.keras"))


def test_every_method_saved_before_still_exists():
    from keras_posenc.models import POSITION_METHODS

    saved = set(STEMS) - {"t5_window", "hybrid_grid"}
    assert len(saved) == 12 and saved <= set(POSITION_METHODS)


@pytest.mark.parametrize("stem", STEMS)
def test_saved_model_loads_with_the_same_outputs(stem):
    saved = np.load(FOLDER / "outputs.npz")
    model = tf.keras.models.load_model(FOLDER / f"{stem}.keras")
    np.testing.assert_allclose(
        model(saved["tokens"]).numpy(), saved[stem], rtol=1e-5, atol=1e-6
    )
