import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

import tflite_export
from keras_posenc import MeanPooling, models


def test_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 5, 4)).astype("float32")
    check_layer(
        MeanPooling,
        x,
        tmp_path,
        num_weights=0,
        expected_output_shape=(3, 4),
        passes_mask=False,
    )


def test_masked_mean_matches_a_numpy_oracle_and_ignores_padded_nan():
    x = np.random.normal(size=(3, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    want = np.stack(
        [x[b][mask[b]].mean(0) if mask[b].any() else np.zeros(4) for b in range(3)]
    )
    x[~mask] = np.nan
    got = MeanPooling()(x, mask=tf.constant(mask)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    clean = np.nan_to_num(x)
    np.testing.assert_allclose(MeanPooling()(clean), clean.mean(1), atol=1e-6)


@pytest.mark.slow
def test_all_padding_rows_give_finite_logits_and_export_to_tflm():
    tf.keras.utils.set_random_seed(0)
    model = models.build_classifier(
        3, vocab_size=10, hidden_dim=8, num_heads=2, num_layers=1, mask_zero=True
    )
    x = np.random.default_rng(0).integers(1, 10, size=(24, 8))
    x[::4] = 0  # all-padding rows, in calibration too
    logits = model.predict(x, verbose=0)
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(
        logits[0], model.get_layer("logits").bias.numpy(), atol=1e-6
    )
    model_bytes = tflite_export.convert(model, x, mode="int8")
    report = tflite_export.verify(
        model_bytes, tflite_export.static_model(model, (8,), "int32"), x[:8]
    )
    assert report.tflm_ok, report.tflm_error
    assert report.max_error <= 6 * report.output_scale, report.max_error
    assert report.tflm_vs_litert <= 8 * report.output_scale


@pytest.mark.slow
def test_quantized_layer_checks(tmp_path):
    x = np.random.normal(size=(3, 4, 6)).astype("float32")
    check_layer(
        lambda **kw: MeanPooling(quantize=True, **kw),
        x,
        tmp_path,
        num_weights=6,
        expected_output_shape=(3, 6),
        passes_mask=False,
    )
