import pytest
import tensorflow as tf

import tflite_export
from keras_posenc import IS_KERAS_3, models
from keras_posenc.data import recipes
from tflite_export.qat import weight_owners

keras = tf.keras


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
    (train_x, train_y), (test_x, test_y) = recipes.digits_data()
    keras.utils.set_random_seed(0)
    model = recipes.digits_classifier("hybrid", hidden_dim=32)
    model.fit(train_x, train_y, epochs=25, batch_size=32, verbose=0)
    float_accuracy = model.evaluate(test_x, test_y, verbose=0)[1]
    if not IS_KERAS_3:
        # QAT fine-tuning at a tenth of the learning rate.
        model = recipes.compile_classifier(
            tflite_export.quantize_aware(model), learning_rate=2e-4
        )
        model.fit(train_x, train_y, epochs=5, batch_size=32, verbose=0)
    model_bytes = tflite_export.convert(model, train_x, mode="int8")
    report = tflite_export.verify(model_bytes, None, test_x, test_y)
    assert report.tflm_ok, report.tflm_error
    assert report.accuracy_litert >= float_accuracy - 0.01, (
        report.accuracy_litert,
        float_accuracy,
    )
    assert report.accuracy_tflm >= float_accuracy - 0.01
