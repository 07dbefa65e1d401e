"""`tflite_export.int4`: 4-bit kernels against a NumPy oracle of the Keras kernels."""

import numpy as np
import pytest
import tensorflow as tf
from kernels import fully_connected_kernels

import tflite_export
from tflite_export.int4 import INT4_MAX, int4_kernels

keras = tf.keras


def two_dense(first, second, bias):
    """`x -> Dense(first) -> ReLU -> Dense(second)`, kernels and biases given."""
    inputs = keras.Input((first.shape[0],), batch_size=1)
    h = keras.layers.Dense(first.shape[1], activation="relu", name="first")(inputs)
    outputs = keras.layers.Dense(second.shape[1], name="second")(h)
    model = keras.Model(inputs, outputs)
    model.get_layer("first").set_weights([first, np.zeros(first.shape[1])])
    model.get_layer("second").set_weights([second, bias])
    return model


def run_litert(model_bytes, x):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    interpreter.allocate_tensors()
    (source,), (target,) = (
        interpreter.get_input_details(),
        interpreter.get_output_details(),
    )
    rows = []
    for row in x:
        scale, zero = source["quantization"]
        raw = np.clip(np.round(row[None] / scale) + zero, -128, 127).astype(np.int8)
        interpreter.set_tensor(source["index"], raw)
        interpreter.invoke()
        scale, zero = target["quantization"]
        out = interpreter.get_tensor(target["index"]).astype(np.float64)
        rows.append((out - zero) * scale)
    return np.concatenate(rows)


def int4_oracle(kernel, per_channel):
    """Levels `(C, K)` and scales `(C,)` of a Keras kernel `(K, C)` on 4 bits."""
    channels = kernel.T.astype(np.float64)
    peaks = np.abs(channels).max(axis=1) if per_channel else np.abs(channels).max()
    scales = np.broadcast_to(peaks / INT4_MAX, (channels.shape[0],))
    safe = np.where(scales > 0, scales, 1.0)[:, None]
    return np.clip(np.round(channels / safe), -7, 7), scales, channels / safe


def int4_values(kernel_tensor, data):
    """The signed 4-bit levels `(C, K)` of an INT4 kernel's bytes."""
    rows = kernel_tensor.shape[0]
    size = int(np.prod(kernel_tensor.shape))
    nibbles = np.stack([data & 0x0F, data >> 4], 1).reshape(-1)[:size]
    return np.where(nibbles > 7, nibbles.astype(int) - 16, nibbles).reshape(rows, -1)


@pytest.mark.slow
@pytest.mark.parametrize("per_channel", [True, False])
def test_every_kernel_is_the_4_bit_oracle_of_its_keras_kernel(per_channel):
    """Levels and scales per channel (LiteRT) or per tensor (TFLM), from the
    Keras kernel itself; a level may differ only where the int8 rounding
    moved a value across a 4-bit half step."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(6, 8)), rng.normal(size=(8, 5))
    model = two_dense(first, second, rng.normal(size=5))
    x = rng.normal(size=(32, 6)).astype(np.float32)
    int8 = tflite_export.convert(model, x, mode="int8")
    int4 = int4_kernels(int8, per_channel=per_channel)
    found = fully_connected_kernels(int4)
    assert len(found) == 2
    for (tensor, data, *_), kernel in zip(found, (first, second)):
        assert tensor.type == 17  # INT4
        levels, scales, exact = int4_oracle(kernel, per_channel)
        got = np.asarray(tensor.quantization.scale, np.float64)
        np.testing.assert_allclose(np.broadcast_to(got, scales.shape), scales, 1e-6)
        values = int4_values(tensor, data)
        near_half = np.abs(np.abs(exact - np.floor(exact)) - 0.5) < 0.04
        assert ((values == levels) | near_half).all()


@pytest.mark.slow
@pytest.mark.parametrize("per_channel", [True, False])
def test_a_column_of_zeros_keeps_its_bias(per_channel):
    """Unused vocabulary rows are masked by a zero column and a large bias:
    int4 gave that column a scale of 1e-12 / 7 and the bias overflowed to 0."""
    rng = np.random.default_rng(1)
    first, second = rng.normal(size=(6, 8)), rng.normal(size=(8, 5))
    second[:, 3] = 0.0
    bias = np.array([0.1, -0.2, 0.3, 3.0, 0.0])
    model = two_dense(first, second, bias)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    int8 = tflite_export.convert(model, x, mode="int8")
    outputs = run_litert(int4_kernels(int8, per_channel=per_channel), x)
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(outputs[:, 3], 3.0, atol=0.05)
    np.testing.assert_allclose(expected[:, 3], 3.0, atol=1e-6)
    whole = tflite_export.convert(two_dense(first, np.zeros((8, 5)), bias), x, "int4")
    np.testing.assert_allclose(run_litert(whole, x), np.tile(bias, (16, 1)), atol=0.05)


@pytest.mark.slow
def test_kernels_sharing_int8_bytes_keep_their_own_scales():
    """`k` and `3 k` quantize to the same int8 bytes on different scales: the
    converter stores them once, and int4 gave both the first one's scale."""
    rng = np.random.default_rng(2)
    k = rng.normal(size=(8, 8))
    inputs = keras.Input((8,), batch_size=1)
    h = keras.layers.Dense(8, activation="relu", name="first")(inputs)
    outputs = keras.layers.Dense(8, name="second")(h)
    model = keras.Model(inputs, outputs)
    model.get_layer("first").set_weights([k, np.zeros(8)])
    model.get_layer("second").set_weights([3 * k, np.zeros(8)])
    x = rng.normal(size=(32, 8)).astype(np.float32)
    int8 = tflite_export.convert(model, x, mode="int8")
    found = fully_connected_kernels(int8)
    assert found[0][0].buffer == found[1][0].buffer  # the converter's sharing
    expected = model.predict(x, verbose=0)
    scale = np.abs(expected).max()
    int8_error = np.abs(run_litert(int8, x) - expected).max() / scale
    for per_channel in (True, False):
        int4 = int4_kernels(int8, per_channel=per_channel)
        kernels = fully_connected_kernels(int4)
        ratio = np.asarray(kernels[1][0].quantization.scale) / np.asarray(
            kernels[0][0].quantization.scale
        )
        np.testing.assert_allclose(ratio, 3.0, rtol=1e-5)
        error = np.abs(run_litert(int4, x) - expected).max() / scale
        assert error < 0.25 and int8_error < 0.05, (error, int8_error)


@pytest.mark.slow
def test_one_bias_tensor_read_by_kernels_of_different_scales_is_refused():
    """A bias tensor two FULLY_CONNECTED ops read is rescaled once; on kernels
    of different 4-bit scales it cannot serve both, and is refused by name."""
    from tensorflow.lite.tools import flatbuffer_utils

    rng = np.random.default_rng(3)
    k = rng.normal(size=(8, 8))
    inputs = keras.Input((8,), batch_size=1)
    h = keras.layers.Dense(8, activation="relu", name="first")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(8, name="second")(h))
    model.get_layer("first").set_weights([k, np.full(8, 0.5)])
    model.get_layer("second").set_weights([3 * k, np.full(8, 0.5)])
    x = rng.normal(size=(32, 8)).astype(np.float32)
    parsed = flatbuffer_utils.convert_bytearray_to_object(
        bytearray(tflite_export.convert(model, x, mode="int8"))
    )
    graph = parsed.subgraphs[0]
    first, second = [op for op in graph.operators if len(op.inputs) > 2][:2]
    second.inputs[2] = first.inputs[2]  # one bias tensor for both
    shared = bytes(flatbuffer_utils.convert_object_to_bytearray(parsed))
    with pytest.raises(ValueError, match="one bias tensor read by kernels of"):
        int4_kernels(shared, per_channel=True)
