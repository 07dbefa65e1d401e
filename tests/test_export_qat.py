import numpy as np
import pytest
import tensorflow as tf

import tflite_export
from keras_posenc import IS_KERAS_3, models
from tflite_export.qat import weight_owners

keras = tf.keras


def _digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype("float32") / 16.0
    patches = images.reshape(-1, 4, 2, 4, 2).transpose(0, 1, 3, 2, 4)
    order = np.random.default_rng(0).permutation(len(images))
    return patches.reshape(-1, 16, 4)[order], digits.target[order]


def _compile(model, learning_rate=2e-3):
    model.compile(
        keras.optimizers.Adam(learning_rate),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_keras_3_gets_a_clear_error_that_says_how_to_switch():
    model = models.build_classifier(2, vocab_size=5, hidden_dim=8, num_heads=2)
    if IS_KERAS_3:
        error = tflite_export.QuantizationError
        with pytest.raises(error, match="TF_USE_LEGACY_KERAS=1"):
            tflite_export.quantize_aware(model)
    else:
        assert isinstance(tflite_export.quantize_aware(model), keras.Model)


def test_weight_owners_cover_nested_kernels():
    model = models.build_classifier(
        2, vocab_size=5, hidden_dim=8, num_heads=2, num_layers=1, position="recursive"
    )
    block = model.get_layer("recursive_0")
    names = sorted(owner.name for owner, _ in weight_owners(block))
    assert names == sorted(
        ["query", "key", "value", "attention_output"] * 2
        + ["position_hidden", "position_output"]
    )


@pytest.mark.slow
def test_digits_int8_within_one_point_of_float():
    """QAT in the Keras 2 pass, post-training quantization in the Keras 3 one."""
    x, y = _digits()
    train, test = slice(0, 1400), slice(1400, None)
    keras.utils.set_random_seed(0)
    model = _compile(
        models.build_classifier(
            10,
            input_dim=4,
            sequence_length=16,
            hidden_dim=32,
            num_heads=4,
            position="hybrid",
        )
    )
    model.fit(x[train], y[train], epochs=25, batch_size=32, verbose=0)
    float_accuracy = model.evaluate(x[test], y[test], verbose=0)[1]
    if not IS_KERAS_3:
        # QAT fine-tuning at a tenth of the learning rate.
        model = _compile(tflite_export.quantize_aware(model), learning_rate=2e-4)
        model.fit(x[train], y[train], epochs=5, batch_size=32, verbose=0)
    model_bytes = tflite_export.convert(model, x[train], mode="int8")
    report = tflite_export.verify(model_bytes, None, x[test], y[test])
    assert report.tflm_ok, report.tflm_error
    assert report.accuracy_litert >= float_accuracy - 0.01, (
        report.accuracy_litert,
        float_accuracy,
    )
    assert report.accuracy_tflm >= float_accuracy - 0.01
