"""Packed models on the device: one document per row, as an unpacked model."""

import numpy as np
import pytest

import tflite_export
from keras_posenc import IS_KERAS_3, models

SMALL = dict(
    hidden_dim=8, num_heads=2, num_layers=2, position_options={"max_length": 32}
)


if IS_KERAS_3:  # one pass: the decode step's graph is the same ops in both

    @pytest.mark.slow
    def test_a_packed_lm_exports_one_document_per_row():
        """The decode step reads no segments: the export generates as the model."""
        model = models.build_causal_lm(
            30, position="t5", packed=True, **dict(SMALL, num_layers=1)
        )
        model_bytes = tflite_export.convert_causal_lm(
            model, np.ones((2, 8), "int32"), mode="float32", max_length=16
        )
        np.testing.assert_array_equal(
            tflite_export.generate_tflite(model_bytes, [[3, 4, 5]], 5),
            model.generate([[3, 4, 5]], max_new_tokens=5),
        )


def test_a_packed_encoder_converts_through_its_unpacked_twin():
    """`convert` refuses the two inputs and says what to do, which works."""
    arguments = dict(vocab_size=30, position="learned", **SMALL)
    packed = models.build_token_classifier(3, packed=True, **arguments)
    with pytest.raises(tflite_export.ExportError, match="build the same model"):
        tflite_export.convert(packed, np.ones((2, 8), "int32"))
    twin = models.build_token_classifier(3, **arguments)
    twin.set_weights(packed.get_weights())
    ids = np.array([[4, 5, 6, 7, 8]])
    one = {"token_ids": ids, "segment_ids": np.ones_like(ids)}
    np.testing.assert_allclose(twin(ids), packed(one), atol=1e-6)
