"""The TFLite model inside a `.litertlm`: LiteRT-LM's signatures, converted.

`engine_model` traces a `CausalLM` into the engine's `prefill_<N>` and
`decode` signatures (`tflite_export.litert_lm` describes them), converts it
in one of `LITERT_LM_MODES` (calibrating every signature on engine-shaped
calls for `"int8_float_io"`) and keeps one copy of each int8 kernel.
`prefill_plan` is how the engine splits a prompt over the signatures.
"""

import hashlib
import os
import tempfile

import numpy as np
import tensorflow as tf

import keras_posenc
from keras_posenc.ops.cache import static_decoding
from tflite_export.convert import (
    ExportError,
    reading_saved_signatures,
    run_converter,
    save_for_converter,
)
from tflite_export.convert import frozen as freeze

#: Calibration sequences read to calibrate `"int8_float_io"`.
CALIBRATION_SEQUENCES = 8


def cache_names(model):
    """The engine's cache names, in the model's cache order."""
    kinds = model.cache_kinds()
    return [f"kv_cache_{kind[0]}_{i // 2}" for i, kind in enumerate(kinds)]


def engine_model(model, cache_length, prefill_lengths, mode="float32", ids=None):
    """TFLite bytes with the engine's `prefill_<N>` and `decode` signatures."""
    names = cache_names(model)
    shapes = model.cache_shapes(1, cache_length)
    specs = {
        name: tf.TensorSpec(shape, tf.float32, name=name)
        for name, shape in zip(names, shapes)
    }

    def run(tokens, input_pos, caches):
        ordered = [caches[name] for name in names]
        logits, ordered = model.call_with_cache(tokens, ordered, input_pos[0])
        return logits, dict(zip(names, ordered))

    def decode(tokens, input_pos, **caches):
        logits, caches = run(tokens, input_pos, caches)
        return {"logits": tf.cast(logits, tf.float32), **caches}

    def prefill(tokens, input_pos, **caches):
        return run(tokens, input_pos, caches)[1]

    keys = [f"prefill_{n}" for n in prefill_lengths] + ["decode"]
    with tempfile.TemporaryDirectory() as folder:
        saved = os.path.join(folder, "saved_model")
        with keras_posenc.ops.bounded_masking(), static_decoding():
            signatures = {}
            for key in keys:
                length = 1 if key == "decode" else int(key.split("_")[1])
                function = decode if key == "decode" else prefill
                signatures[key] = tf.function(
                    function, autograph=False
                ).get_concrete_function(
                    tf.TensorSpec((1, length), tf.int32, name="tokens"),
                    tf.TensorSpec((length,), tf.int32, name="input_pos"),
                    **specs,
                )
            frozen = {key: freeze(function) for key, function in signatures.items()}
            save_for_converter(saved, frozen)
        with reading_saved_signatures():
            converter = tf.lite.TFLiteConverter.from_saved_model(
                saved, signature_keys=keys
            )
        if mode != "float32":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "int8_float_io" and ids is not None:
            converter.representative_dataset = _calibration(
                model, ids, cache_length, prefill_lengths, names
            )
        model_bytes = share_identical_buffers(run_converter(converter, mode))
    if mode != "float32":
        _check_int8_kernels(model_bytes)
    return model_bytes


def _check_int8_kernels(model_bytes):
    """Raises unless every signature's matmul kernels are int8."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    for signature in model.signatureDefs:
        key = signature.signatureKey.decode()
        graph = model.subgraphs[signature.subgraphIndex]
        for op in graph.operators:
            name = flatbuffer_utils.opcode_to_name(model, op.opcodeIndex)
            if name == "FULLY_CONNECTED" and graph.tensors[op.inputs[1]].type == 0:
                raise ExportError(
                    f"The converter left signature {key!r} float32 (a float "
                    "FULLY_CONNECTED kernel): in mode='int8_float_io' it saw no "
                    "calibration sample; in mode='dynamic_int8' the kernel has "
                    "fewer than 1024 values"
                )


def share_identical_buffers(model_bytes):
    """`model_bytes` with tensors of identical constant data on one buffer.

    The converter shares a float weight among the signatures that read it,
    but gives each signature its own copy of a quantized one: three copies
    of every int8 kernel in a `prefill_16`, `prefill_128`, `decode` model.
    Tensors keep their own types and ranges; only equal bytes are shared.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    kept = {entry.buffer for entry in model.metadata or ()}
    first, moved = {}, {}
    for index, buffer in enumerate(model.buffers):
        if index in kept or buffer.data is None or len(buffer.data) == 0:
            continue
        key = hashlib.sha256(np.asarray(buffer.data, np.uint8).tobytes()).digest()
        moved[index] = first.setdefault(key, index)
    moved = {old: new for old, new in moved.items() if old != new}
    if not moved:
        return model_bytes
    for graph in model.subgraphs:
        for tensor in graph.tensors:
            tensor.buffer = moved.get(tensor.buffer, tensor.buffer)
    for index in moved:
        model.buffers[index].data = None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def prefill_plan(prefill_lengths, length):
    """`[(signature length, tokens)]`: how the engine splits `length` tokens.

    The longest signature while the rest fills it, then the shortest one
    that holds what is left (padded).
    """
    lengths = sorted(prefill_lengths)
    plan = []
    while length >= lengths[-1]:
        plan.append((lengths[-1], lengths[-1]))
        length -= lengths[-1]
    if length > 0:
        plan.append((next(n for n in lengths if n >= length), length))
    return plan


def _calibration(model, ids, cache_length, prefill_lengths, names):
    """Representative `(signature, inputs)` pairs: engine calls on real text.

    Sequence k opens with one chunk of the k-th prefill length (cycling, so
    every signature is calibrated: one without samples stays float), holding
    up to half of it (padded as the engine pads), then decodes the rest.
    """
    rows = ids[:CALIBRATION_SEQUENCES]
    samples = []
    for k in range(max(len(rows), len(prefill_lengths))):
        row = rows[k % len(rows)][: cache_length - max(prefill_lengths)]
        size = prefill_lengths[k % len(prefill_lengths)]
        count = min(size, max(1, len(row) // 2))
        tokens = np.zeros((1, size), np.int32)
        tokens[0, :count] = row[:count]
        where = np.zeros(size, np.int32)
        where[:count] = np.arange(count)
        cache = model.empty_cache(1, cache_length)
        inputs = {"tokens": tokens, "input_pos": where}
        inputs.update({n: c.numpy() for n, c in zip(names, cache)})
        samples.append((f"prefill_{size}", inputs))
        _, cache = model.call_with_cache(tf.constant(tokens), cache, 0)
        for position in range(count, len(row)):
            inputs = {
                "tokens": np.array([[row[position]]], np.int32),
                "input_pos": np.array([position], np.int32),
            }
            inputs.update({n: c.numpy() for n, c in zip(names, cache)})
            samples.append(("decode", inputs))
            _, cache = model.call_with_cache(
                tf.constant(inputs["tokens"]), cache, position
            )

    def generator():
        yield from samples

    return generator
