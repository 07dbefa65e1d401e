import numpy as np
import pytest

from keras_posenc import viz


def test_position_similarity_is_a_cosine_map(tmp_path):
    figure = viz.position_similarity(np.eye(5, 3))
    image = figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.diag(image)[:3], 1.0)
    figure.savefig(tmp_path / "similarity.png")
    assert (tmp_path / "similarity.png").stat().st_size > 0


def test_relative_bias_has_a_panel_per_head():
    figure = viz.relative_bias(np.random.normal(size=(1, 6, 4, 4)))
    panels = [axis for axis in figure.axes if axis.images]
    assert len(panels) == 6


def test_gates_and_generated_positions_and_curves():
    assert viz.fusion_gates(np.random.uniform(size=(8, 4))).axes[0].images
    assert len(viz.generated_positions([np.ones((4, 3))] * 3).axes) == 3
    history = {"loss": [1.0, 0.5], "val_loss": [1.2, 0.7], "accuracy": [0.5, 0.8]}
    assert len(viz.learning_curves(history).axes) == 2


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: viz.position_similarity(np.ones(3)), "`encodings` must have shape"),
        (lambda: viz.relative_bias(np.ones((2, 2))), "`bias` must have shape"),
        (lambda: viz.fusion_gates(np.ones(3)), "`gates` must have shape"),
        (lambda: viz.generated_positions([]), "`per_layer` must hold"),
    ],
)
def test_rejects_wrong_shapes(call, match):
    with pytest.raises(ValueError, match=match):
        call()
