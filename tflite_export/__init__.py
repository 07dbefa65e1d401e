"""tflite_export: QAT, full-int8 TFLite conversion, LiteRT/TFLM verification.

Imports `keras_posenc`, never the reverse. TF-MOT is imported lazily by
`quantize_aware` only (importing it switches a process to Keras 2).
"""

import keras_posenc  # noqa: F401, I001 (first: TensorFlow's start-up lines off)
from tflite_export.c_array import atomic_write, c_source, write_c_array
from tflite_export.causal_lm import convert_causal_lm
from tflite_export.contract import DeviceContract, device_contract
from tflite_export.convert import (
    MODES,
    ExportError,
    convert,
    integer_blockers,
    microcontroller_blockers,
    static_model,
)
from tflite_export.firmware import Arena, measure_arena, smallest_arena
from tflite_export.generate import generate_tflite
from tflite_export.litert_lm import LITERT_LM_MODES, convert_litert_lm
from tflite_export.qat import QuantizationError, quantize_aware, quantize_scope
from tflite_export.verify import Report, dequantize, quantize, verify
from tflite_export.verify_causal_lm import LMReport, verify_causal_lm

__all__ = [
    "DeviceContract",
    "MODES",
    "ExportError",
    "Arena",
    "LITERT_LM_MODES",
    "LMReport",
    "QuantizationError",
    "Report",
    "atomic_write",
    "c_source",
    "convert",
    "convert_causal_lm",
    "convert_litert_lm",
    "dequantize",
    "device_contract",
    "generate_tflite",
    "integer_blockers",
    "measure_arena",
    "microcontroller_blockers",
    "quantize",
    "quantize_aware",
    "quantize_scope",
    "smallest_arena",
    "static_model",
    "verify",
    "verify_causal_lm",
    "write_c_array",
]
