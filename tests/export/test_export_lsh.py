"""LSH attention cannot run on a microcontroller: `convert` says why first."""

import importlib

import numpy as np
import pytest

import tflite_export
from keras_posenc import models


def _lsh_classifier():
    return models.build_classifier(
        2,
        vocab_size=10,
        sequence_length=16,
        hidden_dim=8,
        num_heads=2,
        num_layers=1,
        attention_options={"bucket_size": 4, "attention_type": "lsh"},
    )


@pytest.mark.parametrize("mode", ["int8", "float32"])
def test_an_lsh_encoder_is_refused_before_converting(mode, monkeypatch):
    model = _lsh_classifier()

    def never(*args, **kwargs):
        raise AssertionError("converted before refusing")

    converting = importlib.import_module("tflite_export.convert")  # the module
    monkeypatch.setattr(converting, "_converter", never)
    data = np.random.default_rng(0).integers(0, 10, size=(4, 16))
    with pytest.raises(
        tflite_export.ExportError, match="attention_0: LSH attention sorts.*TOPK_V2"
    ):
        tflite_export.convert(model, data, mode=mode)
    blockers = dict(tflite_export.microcontroller_blockers(model))
    assert "attention_window=W" in blockers["attention_0"]


def test_quantization_aware_training_refuses_lsh_naming_it():
    with pytest.raises(ValueError, match="attention_0: attention_type='lsh'"):
        tflite_export.quantize_aware(_lsh_classifier())
