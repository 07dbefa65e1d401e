import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from layer_checks import PRODUCER_KINDS
from marks import split_between_passes
from ops_oracle import assert_header_lists_the_model_ops

import tflite_export
from keras_posenc import IS_KERAS_3, models
from tflite_export import c_array
from tflite_export.convert import check_io_types
from tflite_export.firmware import model_ops

keras = tf.keras

#: Ops with int8 kernels in TFLM (docs/edge.md): a full-int8 export uses no other.
TFLM_INT8_OPS = {
    "FULLY_CONNECTED",
    "BATCH_MATMUL",
    "SOFTMAX",
    "ADD",
    "SUB",
    "MUL",
    "MEAN",
    "SUM",
    "RSQRT",
    "SQUARED_DIFFERENCE",
    "LOGISTIC",
    "TANH",
    "HARD_SWISH",
    "LEAKY_RELU",
    "RELU",
    "CONCATENATION",
    "TRANSPOSE",
    "RESHAPE",
    "SQUEEZE",
    "EXPAND_DIMS",
    "STRIDED_SLICE",
    "SLICE",
    "PACK",
    "UNPACK",
    "SPLIT",
    "GATHER",
    "SELECT_V2",
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
}
#: TFLM and LiteRT use different int8 kernels (softmax, rsqrt); their outputs
#: agree within this many output quantization steps.
TFLM_LITERT_STEPS = 8


def _classifier(position, **kwargs):
    keras.utils.set_random_seed(0)
    args = dict(vocab_size=10, hidden_dim=16, num_heads=2, num_layers=2)
    args.update(kwargs)
    return models.build_classifier(3, position=position, **builder_kwargs(**args))


#: Methods with integer kernels for every op (the forgetting gate's LOG and
#: CUMSUM and CoPE's FLOOR and CEIL have none: `tflite_export.integer_blockers`,
#: `test_float_only_methods_are_refused_at_int8_and_run_in_tflm_at_float32`).
INT8_METHODS = models.methods.INT8_METHODS


@pytest.mark.slow
@pytest.mark.parametrize("position", split_between_passes(INT8_METHODS, PRODUCER_KINDS))
def test_every_method_exports_to_full_int8_and_runs_in_tflm(position):
    _check_full_int8_in_tflm(_classifier(position))  # a None batch and length


#: The methods without integer kernels and the layer the refusal names.
FLOAT_ONLY_METHODS = [("fox", "forgetting_gate_0"), ("cope", "cope_0")]


@pytest.mark.parametrize("position, layer", FLOAT_ONLY_METHODS)
def test_float_only_methods_are_refused_at_int8_before_converting(position, layer):
    model = _classifier(position)
    x = np.random.default_rng(0).integers(0, 10, size=(40, 12))
    assert [name for name, _ in tflite_export.integer_blockers(model)] == [
        layer,
        layer.replace("_0", "_1"),
    ]
    for mode in ("int8", "int16x8"):
        with pytest.raises(tflite_export.ExportError, match=f"{layer}: "):
            tflite_export.convert(model, x, mode=mode)


if IS_KERAS_3:  # the TFLite graph is the same TensorFlow ops in either mode

    @pytest.mark.slow
    @pytest.mark.parametrize("position", [p for p, _ in FLOAT_ONLY_METHODS])
    @pytest.mark.parametrize("window", [None, 4])
    def test_float_only_methods_run_in_tflm_at_float32(position, window):
        model = _classifier(position, attention_window=window)
        x = np.random.default_rng(0).integers(0, 10, size=(40, 12))
        model_bytes = tflite_export.convert(model, x, mode="float32")
        static = tflite_export.static_model(model, (12,), "int32")
        report = tflite_export.verify(model_bytes, static, x[:16])
        assert report.tflm_ok, report.tflm_error
        assert "CUMSUM" in report.ops and report.max_error < 1e-4  # both count
        assert report.tflm_max_error < 1e-4


if IS_KERAS_3:  # the TFLite graph is the same TensorFlow ops in either mode

    @pytest.mark.slow
    def test_a_shared_bias_exports_to_full_int8_and_runs_in_tflm():
        model = _classifier("dynamic_bias", share_position_bias=True)
        _check_full_int8_in_tflm(model)


def _check_full_int8_in_tflm(model):
    x = np.random.default_rng(0).integers(0, 10, size=(40, 12))
    model_bytes = tflite_export.convert(model, x, mode="int8")
    report = tflite_export.verify(
        model_bytes, tflite_export.static_model(model, (12,), "int32"), x[:16]
    )
    assert report.tflm_ok, report.tflm_error
    assert report.tflm_missing_ops == []
    assert set(report.ops) <= TFLM_INT8_OPS, set(report.ops) - TFLM_INT8_OPS
    assert (report.input_dtype, report.output_dtype) == ("int32", "int8")
    assert report.tflm_vs_litert <= TFLM_LITERT_STEPS * report.output_scale
    assert report.arena_bytes > 0
    assert np.isfinite(report.max_error)
    header = c_array.c_header("g_model", model_ops(model_bytes), report.arena_bytes)
    assert_header_lists_the_model_ops(model_bytes, header)


def test_calibration_ids_outside_the_vocabulary_are_refused_before_converting():
    model = _classifier("t5")
    for bad in (10, -1):
        x = np.zeros((4, 12), np.int64)
        x[2, 3] = bad
        with pytest.raises(ValueError, match=r"token ids in \[0, 10\)"):
            tflite_export.convert(model, x, mode="int8")


@pytest.mark.slow
def test_float_features_get_int8_inputs_and_16x8_runs_in_tflm():
    model = _classifier("alibi", vocab_size=None, input_dim=3)
    x = np.random.default_rng(0).normal(size=(30, 8, 3)).astype("float32")
    for mode, dtype in (("int8", "int8"), ("int16x8", "int16")):
        model_bytes = tflite_export.convert(model, x, mode)
        report = tflite_export.verify(model_bytes, None, x[:4])
        assert (report.input_dtype, report.output_dtype) == (dtype, dtype)
        assert report.tflm_ok, report.tflm_error


def test_a_calibrated_conversion_passes_on_no_warning_of_tensorflows_interpreter():
    """The converter calibrates in `tf.lite.Interpreter`, which warns that it
    is deprecated: TensorFlow's matter, not the user's (the package runs
    LiteRT's interpreter), so the export keeps it to itself."""
    import warnings

    tf.keras.utils.set_random_seed(0)
    options = dict(
        hidden_dim=8, num_layers=1, num_heads=2, position_options={"max_length": 8}
    )
    model = models.build_causal_lm(11, position="alibi", **options)
    ids = np.random.default_rng(0).integers(1, 11, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tflite_export.convert_causal_lm(model, ids, max_length=8, target="tflm")
    assert not [w for w in caught if "Interpreter is deprecated" in str(w.message)]


if IS_KERAS_3:  # file sizes: the same TensorFlow ops in either mode

    @pytest.mark.slow
    def test_int8_is_at_most_030x_the_float32_file():
        # Per-channel scales and tensor names cost a fixed ~30 KB, so the ratio
        # is measured at a realistic width (about 270k weights): 0.285x.
        model = _classifier("t5", hidden_dim=128, num_heads=4)
        x = np.random.default_rng(0).integers(0, 10, size=(20, 16))
        int8 = tflite_export.convert(model, x, "int8")
        float32 = tflite_export.convert(model, x, "float32")
        assert len(int8) <= 0.30 * len(float32), (len(int8), len(float32))


def _model_with(layer):
    inputs = keras.Input((6, 4))
    return keras.Model(inputs, layer(inputs))


@pytest.mark.parametrize(
    "layer,match",
    [
        (keras.layers.Dense(4, activation="gelu"), "GELU"),
        (keras.layers.LayerNormalization(), "keras_posenc.LayerNorm"),
    ],
)
def test_refuses_what_tflm_cannot_run_before_converting(layer, match):
    with pytest.raises(tflite_export.ExportError, match=match):
        tflite_export.convert(_model_with(layer), np.zeros((2, 6, 4)))


def test_refuses_keras_3_embedding_and_names_the_fix():
    tokens = keras.Input((5,), dtype="int32")
    model = keras.Model(tokens, keras.layers.Embedding(9, 4)(tokens))
    blockers = tflite_export.microcontroller_blockers(model)
    if IS_KERAS_3:
        with pytest.raises(tflite_export.ExportError, match="TokenEmbedding"):
            tflite_export.convert(model, np.zeros((2, 5), "int32"))
    else:  # tf_keras' Embedding is a plain gather
        assert blockers == []


@pytest.mark.parametrize(
    "data,match",
    [
        (np.zeros((4, 12, 2)), r"must have shape \(N, \*\(None,\)\)"),
        (np.zeros((0, 12)), "with N >= 1"),
        (np.zeros((4, 12), "float32"), "must hold integer token ids"),
    ],
)
def test_rejects_bad_representative_data(data, match):
    with pytest.raises(tflite_export.ExportError, match=match):
        tflite_export.convert(_classifier("none"), data)


def test_rejects_features_of_the_wrong_width():
    model = _classifier("none", vocab_size=None, input_dim=3)
    with pytest.raises(tflite_export.ExportError, match="axis 2 must be 3"):
        tflite_export.convert(model, np.zeros((2, 8, 5), "float32"))


def test_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match=r"`mode` must be one of \('int8'"):
        tflite_export.convert(_classifier("none"), np.zeros((2, 4), "int32"), "int2")


def test_rejects_what_is_not_a_model():
    with pytest.raises(TypeError, match="`model` must be a keras.Model"):
        tflite_export.convert("model.keras", np.zeros((2, 4), "int32"))


@pytest.mark.slow
@pytest.mark.parametrize("position,grid", [("rope", None), ("rope", (3, 4))])
def test_rope_folds_cos_and_sin_into_constants_in_int8(position, grid):
    """1-D and axial RoPE: no SIN/COS kernel (float-only in TFLM) is left."""
    model = _classifier(position, grid_shape=grid)
    x = np.random.default_rng(1).integers(0, 10, size=(40, 12))
    model_bytes = tflite_export.convert(model, x, mode="int8")
    report = tflite_export.verify(
        model_bytes, tflite_export.static_model(model, (12,), "int32"), x[:16]
    )
    assert not {"SIN", "COS"} & set(report.ops), report.ops
    assert set(report.ops) <= TFLM_INT8_OPS
    assert report.tflm_ok and report.tflm_vs_litert <= (
        TFLM_LITERT_STEPS * report.output_scale
    )


def test_a_file_that_is_not_full_int8_is_refused():
    inputs = keras.Input((4, 3), batch_size=1)
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    x = np.random.default_rng(0).normal(size=(8, 4, 3)).astype("float32")
    float_bytes = tflite_export.convert(model, x, mode="float32")
    with pytest.raises(tflite_export.ExportError, match="did not produce a full int8"):
        check_io_types(float_bytes, "int8", "float32")


@pytest.mark.slow
def test_masked_models_export_with_the_bounded_penalty():
    """Float masks with -1e9; the int8 export traces -MASK_PENALTY instead.

    Measured here: 0.038 max error (2.4 output steps) with the bounded
    penalty, 0.49 (31 steps) when -1e9 reaches the int8 graph.
    """
    model = _classifier("t5", mask_zero=True)
    rng = np.random.default_rng(0)
    x = rng.integers(1, 10, size=(40, 12))
    for row, length in enumerate(rng.integers(4, 13, size=40)):
        x[row, length:] = 0
    model_bytes = tflite_export.convert(model, x, mode="int8")
    report = tflite_export.verify(
        model_bytes, tflite_export.static_model(model, (12,), "int32"), x[:16]
    )
    assert report.max_error <= 6 * report.output_scale, report.max_error
    assert report.tflm_ok, report.tflm_error  # padded values: no 5-D slice


def _two_heads():
    """Outputs `[(2,) "zz_first", (3,) "aa_second"]`: names sort the other way."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    first = keras.layers.Dense(2, name="zz_first")(inputs)
    second = keras.layers.Dense(3, name="aa_second")(inputs)
    return keras.Model(inputs, [first, second])


def test_several_outputs_keep_keras_order_in_the_file_and_in_verify():
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from ai_edge_litert.interpreter import Interpreter

    model = _two_heads()
    x = np.random.default_rng(0).normal(size=(20, 4)).astype("float32")
    model_bytes = tflite_export.convert(model, x, mode="int8")
    outputs = Interpreter(model_content=model_bytes).get_output_details()
    assert [tuple(o["shape"]) for o in outputs] == [(1, 2), (1, 3)]
    assert [o["name"] for o in outputs] == ["output_0", "output_1"]
    report = tflite_export.verify(model_bytes, model, x)
    assert report.tflm_ok, report.tflm_error
    # Each output against its own Keras head: a swap could not even compare.
    step = max(o["quantization"][0] for o in outputs)
    assert report.max_error <= 2 * step and report.tflm_max_error <= 2 * step
    with pytest.raises(ValueError, match="`y` must be None for a model of several"):
        tflite_export.verify(model_bytes, model, x, np.zeros(20, "int32"))
    with pytest.raises(ValueError, match="`keras_model` must have the TFLite model"):
        tflite_export.verify(model_bytes, keras.Model(model.input, model.outputs[0]), x)


@pytest.mark.slow
@pytest.mark.parametrize("position", ["t5", "rope"])
def test_int4_kernels_run_in_tflm_beside_int8(position):
    """`mode="int4"`: the int8 model with every FULLY_CONNECTED kernel INT4,
    one scale per kernel: smaller, runs in TFLM as in LiteRT, close to int8."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = _classifier(position)
    x = np.random.default_rng(0).integers(0, 10, size=(40, 12))
    int8 = tflite_export.convert(model, x, mode="int8")
    int4 = tflite_export.convert(model, x, mode="int4")
    parsed = flatbuffer_utils.convert_bytearray_to_object(bytearray(int4))
    graph = parsed.subgraphs[0]
    kernels = [
        graph.tensors[op.inputs[1]]
        for op in graph.operators
        if flatbuffer_utils.opcode_to_name(parsed, op.opcodeIndex) == "FULLY_CONNECTED"
    ]
    assert kernels and all(k.type == 17 for k in kernels)  # INT4
    assert all(len(k.quantization.scale) == 1 for k in kernels)
    assert len(int4) < len(int8)
    static = tflite_export.static_model(model, (12,), "int32")
    report = tflite_export.verify(int4, static, x[:16])
    assert report.tflm_ok, report.tflm_error
    assert report.tflm_vs_litert <= TFLM_LITERT_STEPS * report.output_scale
    int8_report = tflite_export.verify(int8, static, x[:16])
    assert report.max_error <= 4 * int8_report.max_error + 0.5
