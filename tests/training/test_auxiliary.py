import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import models
from keras_posenc.training import auxiliary

keras = tf.keras


def test_position_prediction_targets_are_the_indices():
    _, target = auxiliary.PositionPrediction(5).transform(np.ones((2, 5)), None)
    np.testing.assert_array_equal(target, [[0, 1, 2, 3, 4]] * 2)


def test_relative_distance_targets_are_clipped_offsets():
    task = auxiliary.RelativeDistancePrediction(max_distance=2, num_pairs=6)
    inputs, target = task.transform(np.ones((3, 9)), np.random.default_rng(0))
    pairs = inputs["distance_pairs"]
    want = np.clip(pairs[..., 1] - pairs[..., 0], -2, 2) + 2
    np.testing.assert_array_equal(target, want)


def test_order_recovery_targets_undo_the_shuffle():
    task = auxiliary.OrderRecovery(10, shuffle_fraction=0.3)
    tokens = np.arange(40).reshape(4, 10)
    inputs, order = task.transform(tokens, np.random.default_rng(1))
    shuffled = inputs["order_tokens"]
    np.testing.assert_array_equal(np.take_along_axis(tokens, order, 1), shuffled)
    for row in order:
        assert sorted(row) == list(range(10))
        assert (row != np.arange(10)).sum() <= 3


def test_pair_gather_concatenates_the_pair_outputs():
    encoded = np.random.normal(size=(2, 5, 3)).astype("float32")
    pairs = np.array([[[0, 4], [2, 2]], [[1, 3], [4, 0]]])
    out = auxiliary.PairGather()(encoded, pairs).numpy()
    want = np.stack(
        [
            np.concatenate([encoded[b, i], encoded[b, j]], -1)
            for b in range(2)
            for i, j in pairs[b]
        ]
    ).reshape(2, 2, 6)
    np.testing.assert_allclose(out, want)


@pytest.mark.slow
def test_multitask_pretraining_fits_and_shares_the_encoder():
    encoder = models.build_encoder(
        vocab_size=12,
        sequence_length=8,
        hidden_dim=8,
        num_heads=2,
        num_layers=1,
        position="t5",
    )
    tasks = [
        auxiliary.PositionPrediction(8),
        auxiliary.RelativeDistancePrediction(3, num_pairs=4),
        auxiliary.OrderRecovery(8),
    ]
    model = auxiliary.build_pretraining_model(encoder, tasks)
    model.compile("adam", loss=auxiliary.task_losses(tasks))
    rng = np.random.default_rng(0)
    x, y = auxiliary.pretraining_data(tasks, rng.integers(1, 12, (32, 8)), rng)
    before = encoder.get_weights()
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert any(not np.allclose(a, b) for a, b in zip(before, encoder.get_weights()))


def test_rejects_tasks_that_are_not_tasks():
    encoder = models.build_encoder(vocab_size=5, hidden_dim=4, num_heads=2)
    with pytest.raises(TypeError, match="`tasks` must be a non-empty list"):
        auxiliary.build_pretraining_model(encoder, ["position"])


@pytest.mark.parametrize(
    "factory,match",
    [
        (lambda: auxiliary.PositionPrediction(0), "`sequence_length` must be"),
        (lambda: auxiliary.RelativeDistancePrediction(0), "`max_distance` must be"),
        (lambda: auxiliary.RelativeDistancePrediction(2, 0), "`num_pairs` must be"),
        (lambda: auxiliary.OrderRecovery(4, 1.0), "`shuffle_fraction` must be"),
    ],
)
def test_rejects_bad_arguments(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()
