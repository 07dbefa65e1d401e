"""Faults in training: an interrupted fit resumes to the uninterrupted weights."""

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import models
from keras_posenc.data import recipes

keras = tf.keras


class Crash(RuntimeError):
    pass


class CrashAt(keras.callbacks.Callback):
    """Raises in the middle of epoch `epoch` (after `batch` batches)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch and batch == self.batch:
            raise Crash(f"killed in epoch {self.epoch}, batch {batch}")


def _model():
    keras.utils.set_random_seed(7)
    model = models.build_classifier(
        3, vocab_size=12, hidden_dim=8, num_heads=2, num_layers=1, position="hybrid"
    )
    return recipes.compile_classifier(model, 1e-2)


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(1, 12, size=(64, 10)), rng.integers(0, 3, size=64)


@pytest.mark.slow
def test_backup_and_restore_resumes_to_the_uninterrupted_weights(tmp_path):
    x, y = _data()
    fit = dict(epochs=4, batch_size=16, shuffle=False, verbose=0)
    reference = _model()
    reference.fit(x, y, **fit)

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    interrupted = _model()
    with pytest.raises(Crash, match="epoch 2"):
        interrupted.fit(x, y, callbacks=[backup, CrashAt(2, 1)], **fit)
    assert any((tmp_path / "backup").iterdir())  # epochs 0 and 1 were saved

    resumed = _model()  # a fresh process would rebuild the model the same way
    resumed.fit(
        x,
        y,
        callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))],
        **fit,
    )
    for want, got in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)
    moved = max(
        np.abs(a - b).max()
        for a, b in zip(reference.get_weights(), _model().get_weights())
    )
    assert moved > 1e-3  # training changed the weights: the comparison means something
