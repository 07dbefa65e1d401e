"""A quantization-aware causal LM converts without data, and the device runs it."""

import numpy as np
import pytest
import tensorflow as tf
from compiling import compile_built
from kernels import fully_connected_kernels
from marks import split_between_passes
from ops_oracle import assert_header_lists_the_model_ops

import tflite_export
from keras_posenc import IS_KERAS_3
from keras_posenc.models import build_causal_lm
from tflite_export import integer_islands
from tflite_export.convert import check_integer_ops

keras = tf.keras
VOCAB = 12
#: One method trained per Keras mode (each pass ~30 s): RoPE's rotated,
#: cached keys with dense attention in the default Keras, T5's cached bias
#: with block-local attention (W=4: the band's rounding, the cache's band
#: mask on the device) in Keras 2.
POSITION, WINDOW = ("rope", None) if IS_KERAS_3 else ("t5", 4)


def counting(rows, length=17):
    """Rows of 1 .. 10 repeating, each from its own start: easy to learn."""
    starts = np.arange(rows)[:, None] % 10
    return ((starts + np.arange(length)[None]) % 10 + 1).astype("int32")


def trained_qat(
    position, layers=2, window=None, qat_epochs=1, kernel_bits=8, **options
):
    """A trained float LM made quantization-aware, then fine-tuned for
    `qat_epochs` (0: one call in training mode sets its ranges, the weights
    stay the float model's)."""
    keras.utils.set_random_seed(0)
    model = build_causal_lm(
        VOCAB,
        hidden_dim=16,
        num_layers=layers,
        num_heads=2,
        position=position,
        attention_window=window,
        **options,
        position_options={"max_length": 32},
    )
    x = counting(320)
    compile_built(model, 3e-3)
    # Not fine-tuned, it trains longer: sure enough of its tokens that the
    # rounding moves none (3 epochs: `gated` lost 4 of 20 in TFLM).
    epochs = 3 if qat_epochs else 8
    model.fit(x[:, :-1], x[:, 1:], epochs=epochs, batch_size=32, verbose=0)
    qat = tflite_export.quantize_aware(model, kernel_bits=kernel_bits)
    if not qat_epochs:
        qat(x[:32, :-1], training=True)  # each range from its first batch
        return qat
    compile_built(qat, 3e-4)
    qat.fit(x[:, :-1], x[:, 1:], epochs=qat_epochs, batch_size=32, verbose=0)
    return qat


def with_a_float_output(model_bytes, subgraph):
    """The model with the last op of one subgraph made to output float32."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    assert len(model.subgraphs) == 2  # prefill and decode
    graph = model.subgraphs[subgraph]
    graph.tensors[graph.operators[-1].outputs[0]].type = schema.TensorType.FLOAT32
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


@pytest.fixture(scope="module")
def qat_lm():
    return trained_qat(POSITION, window=WINDOW)


@pytest.mark.slow
def test_the_tflm_step_without_data_generates_the_qat_models_tokens(qat_lm):
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model_bytes = tflite_export.convert_causal_lm(
        qat_lm, None, max_length=20, target="tflm"
    )
    check_integer_ops(model_bytes)  # convert_causal_lm checked it too
    contract = tflite_export.device_contract(model_bytes)
    assert all(port.dtype == "int8" for port in contract.outputs)
    assert all(feed.copy for feed in contract.feeds)  # one range in and out
    prompts = [[1, 2, 3, 4], [7, 8]]
    want = qat_lm.generate(prompts, max_new_tokens=10)
    got = tflite_export.generate_tflite(model_bytes, prompts, 10, runtime="tflm")
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize(
    "position", ["xpos", "hybrid"] if IS_KERAS_3 else ["gated", "recursive", "hpn"]
)
def test_newly_covered_methods_generate_the_qat_tokens_in_tflm(position):
    """xPos' key tables round on the bound the QAT model observed, gated
    fusion's encoding on its observed range (the device's step gathers rows
    of the same int8 tables), the recursive blocks' two attentions,
    feed-forward, sums and norm as the encoder's, the generators' halves,
    convolutions and sums (hpn: the position half's rows of one int8 table;
    hybrid: the convolution's state cached on its input's range). The QAT
    model is the trained float model with its ranges from one batch, not
    fine-tuned (the contract is the device's rounding; a QAT training step's
    trace costs ~10 s a method; `qat_lm` above is fine-tuned). Split between
    the Keras modes: the same rounding ops in either."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    qat = trained_qat(position, qat_epochs=0)
    model_bytes = tflite_export.convert_causal_lm(
        qat, None, max_length=20, target="tflm"
    )
    check_integer_ops(model_bytes)
    header = tflite_export.device_contract(model_bytes).c_header(arena_bytes=1)
    assert_header_lists_the_model_ops(model_bytes, header)
    prompts = [[1, 2, 3, 4], [7, 8]]
    np.testing.assert_array_equal(
        tflite_export.generate_tflite(model_bytes, prompts, 10, runtime="tflm"),
        qat.generate(prompts, max_new_tokens=10),
    )


@pytest.mark.slow
def test_the_litert_export_reads_text_as_the_qat_model_does(qat_lm):
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    model_bytes = tflite_export.convert_causal_lm(qat_lm, None, max_length=20)
    report = tflite_export.verify_causal_lm(model_bytes, qat_lm, counting(4, 14))
    assert report.bits_per_token_litert <= report.bits_per_token_keras * 1.02 + 0.01, (
        report.table()
    )
    for subgraph in range(2):  # prefill and decode: a float op in either fails
        with pytest.raises(tflite_export.ExportError, match="left float ops"):
            check_integer_ops(with_a_float_output(model_bytes, subgraph))


@pytest.mark.slow
def test_the_cache_write_is_rewired_to_int8_only_on_one_range(qat_lm, monkeypatch):
    """The converter leaves the cache write float; `integer_islands` makes it
    int8 (new rows requantized onto the cache's range) when the old and the
    updated cache share one range, and refuses otherwise."""
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from tensorflow.lite.tools import flatbuffer_utils

    from tflite_export import causal_lm

    raw = []
    monkeypatch.setattr(
        causal_lm,
        "integer_update_slices",
        lambda model, **options: raw.append(model) or model,
    )
    with pytest.raises(tflite_export.ExportError, match="DYNAMIC_UPDATE_SLICE"):
        tflite_export.convert_causal_lm(qat_lm, None, max_length=8, target="tflm")
    rewired = integer_islands.integer_update_slices(raw[0])
    check_integer_ops(rewired)
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(rewired))
    for graph in model.subgraphs:  # a requantized row: int8 in, int8 out
        for op in graph.operators:
            if flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) == "QUANTIZE":
                source, target = (graph.tensors[t] for t in (*op.inputs, *op.outputs))
                if source.type == target.type:
                    assert source.quantization.scale[0] != target.quantization.scale[0]
    # The same island with its written cache on another scale is refused.
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(raw[0]))
    graph = model.subgraphs[0]
    codes = [
        flatbuffer_utils.opcode_to_name(model, op.opcodeIndex) for op in graph.operators
    ]
    write = graph.operators[codes.index("DYNAMIC_UPDATE_SLICE")]
    (quantize,) = [op for op in graph.operators if write.outputs[0] in op.inputs]
    graph.tensors[quantize.outputs[0]].quantization.scale[0] *= 2
    bad = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    with pytest.raises(integer_islands.IslandError, match="different ranges"):
        integer_islands.integer_update_slices(bad)


def test_data_free_conversion_needs_a_quantization_aware_lm():
    model = build_causal_lm(VOCAB, hidden_dim=8, num_heads=2, position="alibi")
    with pytest.raises(tflite_export.ExportError, match="in mode='int8' only for"):
        tflite_export.convert_causal_lm(model, None, max_length=8)
    with pytest.raises(tflite_export.ExportError, match="in mode='int4' only for"):
        tflite_export.convert_causal_lm(model, None, "int4", max_length=8)
    qat = build_causal_lm(
        VOCAB, hidden_dim=8, num_heads=2, position="alibi", quantize=True
    )
    with pytest.raises(
        tflite_export.ExportError, match="in mode='int8' or 'int4' only"
    ):
        tflite_export.convert_causal_lm(qat, None, mode="float32", max_length=8)


def test_an_lm_whose_ranges_never_saw_data_is_refused_until_they_do():
    # Unseen ranges are [0, 1e-6]: the int8 step's logits would be constants.
    model = build_causal_lm(VOCAB, hidden_dim=8, num_heads=2, position="alibi")
    qat = tflite_export.quantize_aware(model)
    with pytest.raises(tflite_export.ExportError, match="never saw a training batch"):
        tflite_export.convert_causal_lm(qat, None, max_length=8, target="tflm")
    qat(counting(4, 8), training=True)  # ranges from a batch, weights unchanged
    check_integer_ops(
        tflite_export.convert_causal_lm(qat, None, max_length=8, target="tflm")
    )


def test_a_mixed_precision_lm_is_refused_for_int8_naming_the_policy():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = build_causal_lm(VOCAB, hidden_dim=8, num_heads=2, position="alibi")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(ValueError, match="float32 for int8.*'mixed_float16'"):
        tflite_export.quantize_aware(model)
    with pytest.raises(ValueError, match="float32 for int8.*set_global_policy"):
        tflite_export.convert_causal_lm(model, counting(2, 8), max_length=8)


@pytest.fixture(scope="module")
def grouped_int4_qat():
    """One key head for 2 query heads, every kernel trained on 4 bits: one
    QAT training (~15 s) for the grouped-query and the 4-bit tests."""
    return trained_qat("alibi", num_key_value_heads=1, kernel_bits=4)


@pytest.mark.slow
def test_a_grouped_query_qat_lm_runs_in_tflm_without_data(grouped_int4_qat):
    """`num_key_value_heads=1` (2 query heads): the key and value caches'
    ranges learned in QAT, the TFLM step the QAT model's tokens."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    qat = grouped_int4_qat
    model_bytes = tflite_export.convert_causal_lm(
        qat, None, max_length=20, target="tflm"
    )
    contract = tflite_export.device_contract(model_bytes)
    assert [contract.input_port(c).shape for c in contract.caches] == [
        (1, 1, 20, 8)
    ] * 4
    scales = [contract.input_port(c).scale for c in contract.caches]
    assert scales[0] != scales[1]  # keys and values: a range each
    prompts = [[1, 2, 3, 4], [7, 8]]
    want = qat.generate(prompts, max_new_tokens=10)
    got = tflite_export.generate_tflite(model_bytes, prompts, 10, runtime="tflm")
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_a_4_bit_qat_lm_exports_its_trained_grid_to_int4_without_data(
    grouped_int4_qat,
):
    """`quantize_aware(kernel_bits=4)` trains every projection on the grid
    an INT4 export stores (`max |W| / 7` steps): in LiteRT (per-channel
    INT4 elsewhere) and TFLM, each INT4 kernel is exactly a QAT kernel's
    levels and scale (no second rounding), and TFLM generates the QAT
    model's tokens without data."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    from keras_posenc.layers import QuantizedDense
    from keras_posenc.ops.quantization import fake_quant_weight
    from keras_posenc.utils import nested_layers

    qat = grouped_int4_qat
    assert qat.get_config()["quantize"] == "int4"
    grids = [  # each projection's 4-bit kernel, laid out as TFLite's (out, in)
        fake_quant_weight(layer.kernel, 4).numpy().T
        for layer in nested_layers(qat)
        if isinstance(layer, QuantizedDense)
    ]
    assert len(grids) == 2 * 6 + 1  # 6 a layer, and the logits
    for target in ("litert", "tflm"):
        model_bytes = tflite_export.convert_causal_lm(
            qat, None, mode="int4", max_length=20, target=target
        )
        kernels = fully_connected_kernels(model_bytes)
        assert len(kernels) == len(grids) * (2 if target == "litert" else 1)
        for kernel, packed, *_ in kernels:
            assert len(kernel.quantization.scale) == 1
            low, high = packed & 0x0F, packed >> 4
            levels = np.stack([low, high], 1).reshape(-1).astype(np.int8)
            levels = np.where(levels > 7, levels - 16, levels)
            values = levels[: np.prod(kernel.shape)].reshape(kernel.shape)
            real = values * np.float32(kernel.quantization.scale[0])
            assert any(
                grid.shape == real.shape and np.allclose(grid, real, rtol=1e-5)
                for grid in grids
            ), kernel.name
    prompts = [[1, 2, 3, 4], [7, 8]]
    np.testing.assert_array_equal(
        tflite_export.generate_tflite(model_bytes, prompts, 10, runtime="tflm"),
        qat.generate(prompts, max_new_tokens=10),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "position", split_between_passes(["hpn", "recursive"], ["recursive"])
)
def test_the_generators_kernels_train_on_4_bits_too(position):
    """The projections a position generator makes (hpn's first layer, whose
    content half is a fully connected kernel of its own; the recursive
    blocks' attention and feed-forward) are on the 4-bit grid as well: every
    INT4 kernel keeps one scale in LiteRT, where a kernel rounded afterwards
    would take one per channel."""
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    qat = trained_qat(position, qat_epochs=0, kernel_bits=4)
    model_bytes = tflite_export.convert_causal_lm(qat, None, mode="int4", max_length=20)
    scales = [
        len(k.quantization.scale) for k, *_ in fully_connected_kernels(model_bytes)
    ]
    assert scales and set(scales) == {1}


def test_4_bit_kernels_are_refused_where_they_cannot_be_kept():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="kernel_bits.*must be 8 for this model"):
        tflite_export.quantize_aware(model, kernel_bits=4)
    lm = build_causal_lm(VOCAB, hidden_dim=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="kernel_bits.*must be 8 or 4.*3"):
        tflite_export.quantize_aware(lm, kernel_bits=3)
    with pytest.raises(ValueError, match="kernel_bits.*must be 8 with engine='tfmot'"):
        tflite_export.quantize_aware(lm, engine="tfmot", kernel_bits=4)
    with pytest.raises(ValueError, match="quantize.*'int4'.*int5"):
        build_causal_lm(VOCAB, hidden_dim=8, num_layers=1, quantize="int5")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["litert", "tflm"])
def test_a_float32_export_needs_no_calibration_data(target):
    """float32 calibrates nothing: None converts, and decodes as Keras does."""
    tf.keras.utils.set_random_seed(0)
    model = build_causal_lm(VOCAB, hidden_dim=8, num_heads=2, position="alibi")
    model_bytes = tflite_export.convert_causal_lm(
        model, None, "float32", max_length=12, target=target
    )
    prompt = np.array([[1, 2, 3]], np.int32)
    expected = np.asarray(model.generate(prompt, max_new_tokens=6))
    got = tflite_export.generate_tflite(model_bytes, prompt, 6, runtime=target)
    np.testing.assert_array_equal(got, expected)
