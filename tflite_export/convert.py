"""Conversion of keras_posenc models to full-int8, 16x8 or float32 TFLite."""

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import (
    convert_variables_to_constants_v2,
)

import keras_posenc
from keras_posenc.training.quantization import check_float32
from keras_posenc.utils import keras, nested_layers, require_tensorflow
from tflite_export.int4 import int4_kernels
from tflite_export.tensor_names import name_tensors

#: Conversion modes: int8 kernels and activations, int16 activations with int8
#: weights, or the float32 reference.
MODES = ("int8", "int16x8", "float32", "int4")
#: How many representative examples calibrate the activation ranges.
CALIBRATION_EXAMPLES = 200


#: Why a float32 export needs a float32 model (`check_float32`).
FLOAT32_PURPOSE = (
    "TFLite (a float16 graph converts to float16 ops, which have no builtin kernels)"
)
INT16X8_OPS = tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8


class ExportError(ValueError):
    """A model or input that cannot be exported, with the reason."""


def convert(model, representative_data, mode="int8", sequence_length=None):
    """Converts a Keras model to TFLite bytes with builtin ops only.

    The batch is fixed to 1 and the sequence length to `sequence_length` (or
    the model's, or the representative data's), so the graph has static
    shapes: no SHAPE/REDUCE_PROD/PACK ops that break microcontrollers. In
    `"int8"` mode kernels and activations are int8, float inputs and outputs
    are int8 and integer token ids stay int32; only `TFLITE_BUILTINS_INT8` ops
    are allowed, never SELECT_TF_OPS. Models that cannot run on a
    microcontroller are refused before converting (`microcontroller_blockers`).

    Args:
        model: a `keras.Model` with one input (float or QAT).
        representative_data: array `(N, T)` of token ids or `(N, T, F)` of
            features to calibrate ranges, or None for a model of
            `quantize_aware` (`mode="int8"`, trained ranges).
        mode: one of `MODES`; `"int4"` is int8 with 4-bit kernels, one scale
            per kernel (TFLM runs no per-channel INT4: `docs/edge.md`).
        sequence_length: int or None, the fixed T.

    Returns:
        The `.tflite` model as bytes.
    """
    require_tensorflow("convert")
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model. Received: model={model!r}")
    if mode == "int4":  # int8, then its kernels on one 4-bit scale each
        model_bytes = convert(model, representative_data, "int8", sequence_length)
        return int4_kernels(model_bytes, per_channel=False)
    trained_ranges = representative_data is None
    if trained_ranges:
        shape, dtype = _trained_ranges_input(model, mode, sequence_length)
    else:
        data = check_representative_data(model, representative_data, sequence_length)
        shape, dtype = data.shape[1:], data.dtype
    blockers = microcontroller_blockers(model)
    check_float32(model, None if mode != "float32" else FLOAT32_PURPOSE)
    if mode != "float32":
        refuse_float_only_layers(model, mode)
    if blockers:
        raise ExportError(
            "The model is not microcontroller-ready: "
            + "; ".join(f"{name}: {reason}" for name, reason in blockers)
        )
    calibration = None if trained_ranges else data
    # Traced with bounded masking: a -1e9 constant would wreck int8 ranges.
    with tempfile.TemporaryDirectory() as folder, keras_posenc.ops.bounded_masking():
        static = static_model(model, shape, dtype)
        converter = _converter(static, shape, dtype, folder)
        return _convert(converter, mode, dtype, trained_ranges, calibration)


def _convert(converter, mode, dtype, trained_ranges, data):
    """Sets `converter` up for `mode`, converts and checks the result."""
    if mode != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if mode == "int8":
            ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            io_type = tf.int8
        else:
            ops = [INT16X8_OPS]
            io_type = tf.int16
        if trained_ranges:  # the fake quantizers' ranges: QAT mode, no data
            ops = None  # the converter refuses INT8-only ops without data
        else:
            converter.representative_dataset = _calibration(data)
        if ops is not None:
            converter.target_spec.supported_ops = ops
        if np.dtype(dtype).kind == "f":  # integer token ids stay int32
            converter.inference_input_type = io_type
        converter.inference_output_type = io_type
    model_bytes = run_converter(converter, mode)
    # The converter lists a multi-output model's outputs as it likes: Keras'
    # order (output_0, output_1, ..), so a firmware's output 0 is the first.
    model_bytes = name_tensors(model_bytes)
    check_io_types(model_bytes, mode, dtype)
    if trained_ranges:
        check_integer_ops(model_bytes)
    return model_bytes


def is_quantization_aware(model):
    """Whether `model` rounds as int8 TFLite does (`quantize_aware`'s models)."""
    return any(
        isinstance(layer, keras_posenc.layers.ActivationRange)
        for layer in nested_layers(model)
    )


def _trained_ranges_input(model, mode, sequence_length):
    """`(input shape, dtype)` for converting a QAT model without data."""
    if not is_quantization_aware(model):
        raise ExportError(
            "`representative_data` may be None only for a model of "
            "tflite_export.quantize_aware (its int8 ranges come from training). "
            f"Received: None for {model.name}, which has no fake quantizers"
        )
    if mode != "int8":
        raise ExportError(
            "A quantization-aware model converts without data in mode='int8' "
            f"only. Received: mode={mode!r}"
        )
    _check_one_input(model)
    spec = model.inputs[0]
    shape = list(spec.shape[1:])
    if shape and shape[0] is None:
        shape[0] = sequence_length
    if None in shape:
        raise ExportError(
            "`sequence_length` must be given for a model of unknown length "
            f"converted without data. Received: input shape {tuple(spec.shape)}"
        )
    return tuple(shape), np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype)


def check_trained_ranges(model, functions):
    """An `ExportError` naming the fake quantizers that the traced `functions`
    read whose range never saw a training batch.

    An unseen range is [0, 1e-6] (`ActivationRange`): the int8 model would
    round every tensor behind it to zero, and its outputs would be constants.
    """
    read = {id(variable) for function in functions for variable in function.variables}
    unseen = [
        _path(layer.minimum)
        for layer in nested_layers(model)
        if isinstance(layer, keras_posenc.layers.ActivationRange)
        and layer.built
        and id(_tf_variable(layer.minimum)) in read
        and float(layer.batches.numpy()) == 0.0
    ]
    if unseen:
        listed = ", ".join(unseen[:4]) + (", ..." if len(unseen) > 4 else "")
        raise ExportError(
            f"`model` must have seen data before converting: {len(unseen)} of "
            "the int8 ranges the export reads never saw a training batch "
            f"({listed}), so every output of the int8 model would be a "
            "constant. Fit it on at least one batch (model.fit), or seed the "
            "ranges without changing a weight: model(x, training=True) on a "
            "batch of real inputs"
        )


def _tf_variable(weight):
    """The `tf.Variable` behind a Keras 3 variable (a Keras 2 weight is one)."""
    return weight if isinstance(weight, tf.Variable) else weight.value


def _path(weight):
    """`block/attention/logits` of a range's `.../minimum` weight."""
    name = getattr(weight, "path", None) or weight.name
    return name.split(":")[0].rsplit("/", 1)[0]


def check_integer_ops(model_bytes):
    """Raises unless every op of every subgraph (each signature of a decoding
    export: prefill and decode) computes in integers.

    Read from the flatbuffer, so no interpreter is built: an op whose output
    tensor is float is a tensor the training left without a fake quantizer.
    """
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    float_types = {
        schema.TensorType.FLOAT32,
        schema.TensorType.FLOAT16,
        schema.TensorType.FLOAT64,
    }
    floats = set()
    for graph in model.subgraphs:
        for op in graph.operators:
            if any(graph.tensors[i].type in float_types for i in op.outputs if i >= 0):
                floats.add(flatbuffer_utils.opcode_to_name(model, op.opcodeIndex))
    if floats:
        raise ExportError(
            "The quantization-aware model left float ops after conversion "
            f"({', '.join(sorted(floats))}): a tensor it computes has no fake "
            "quantizer"
        )


def check_io_types(model_bytes, mode, input_dtype):
    """Raises unless the file's inputs and outputs are what `mode` promised."""
    if mode == "float32":
        return
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    want = "int8" if mode == "int8" else "int16"
    got_in = np.dtype(interpreter.get_input_details()[0]["dtype"]).name
    outs = {np.dtype(d["dtype"]).name for d in interpreter.get_output_details()}
    got_out = ", ".join(sorted(outs))
    want_in = want if np.dtype(input_dtype).kind == "f" else "int32"
    if (got_in, got_out) != (want_in, want):
        raise ExportError(
            f"The converter did not produce a full {mode} model: inputs {got_in}, "
            f"outputs {got_out} (expected {want_in} and {want})"
        )


def _check_one_input(model):
    """An `ExportError` unless `model` has one input (a packed model has two)."""
    if len(model.inputs) == 1:
        return
    names = [getattr(spec, "name", "?") for spec in model.inputs]
    fix = ""
    if any("segment_ids" in str(name) for name in names):
        fix = (
            ". A packed model (packed=True) is a training form: build the same "
            "model with packed=False, copy its weights (set_weights), and "
            "convert that (one document per row)"
        )
    raise ExportError(
        f"`model` must have exactly one input. Received: {len(model.inputs)} "
        f"inputs {names}{fix}"
    )


def check_representative_data(model, data, sequence_length=None):
    """The calibration array, checked against the model's one input."""
    _check_one_input(model)
    spec = model.inputs[0]
    expected = tuple(spec.shape[1:])
    data = np.asarray(data)
    if data.ndim != len(expected) + 1 or len(data) == 0:
        raise ExportError(
            f"`representative_data` must have shape (N, *{expected}) with N >= 1. "
            f"Received: shape={data.shape}"
        )
    if sequence_length is not None:
        data = _fit_length(data, sequence_length)
    for axis, (want, got) in enumerate(zip(expected, data.shape[1:]), start=1):
        if want is not None and want != got:
            raise ExportError(
                f"`representative_data` axis {axis} must be {want}. "
                f"Received: shape={data.shape}"
            )
    if tf.as_dtype(spec.dtype).is_integer:
        if data.dtype.kind not in "iu":
            raise ExportError(
                "`representative_data` must hold integer token ids for this model. "
                f"Received: dtype={data.dtype}"
            )
        vocab = _vocabulary(model)
        if vocab is not None and (data.min() < 0 or data.max() >= vocab):
            raise ExportError(
                f"`representative_data` must hold token ids in [0, {vocab}) (the "
                f"model's embedding). Received: ids in [{data.min()}, {data.max()}]"
            )
        return data.astype(np.int32)
    if data.dtype.kind not in "fiu":
        raise ExportError(
            f"`representative_data` must be numeric. Received: dtype={data.dtype}"
        )
    data = data.astype(np.float32)
    bad = int(np.size(data) - np.count_nonzero(np.isfinite(data)))
    if bad:
        raise ExportError(
            "`representative_data` must be finite (NaN or inf calibrates nothing "
            f"and crashes the converter). Received: {bad} non-finite values"
        )
    return data


def _vocabulary(model):
    """The input size of the model's first token embedding, or None."""
    for layer in nested_layers(model):
        if isinstance(layer, keras_posenc.TokenEmbedding):
            return int(layer.vocab_size)
        if isinstance(layer, keras.layers.Embedding):
            return int(layer.input_dim)
    return None


def static_model(model, input_shape, dtype):
    """`model` behind an input with batch 1 and a fixed length."""
    inputs = keras.Input(tuple(input_shape), batch_size=1, dtype=np.dtype(dtype).name)
    return keras.Model(inputs, model(inputs), name=f"{model.name}_static")


def frozen(function):
    """Concrete `function` with its variables as constants, its inputs and
    output names kept (a converter then reads no variable, and folds the
    fake quantizers' ranges)."""
    with _captured_stderr(io.StringIO()):  # grappler's notes, not errors
        constant = convert_variables_to_constants_v2(function)
    args, kwargs = function.structured_input_signature
    names = sorted(function.structured_outputs)  # the flattening order of a dict

    def named(*positional, **keyword):
        flat = list(positional) + [keyword[key] for key in sorted(keyword)]
        return dict(zip(names, constant(*flat)))

    return tf.function(named).get_concrete_function(*args, **kwargs)


#: The converter's absl warnings that are not errors: the loader's note that
#: `save_for_converter` left the gradients out (on purpose: the converter asks
#: for none), and int32 token ids staying int32 in an int8 model.
HARMLESS = (
    "with ops with unsaved custom gradients",
    "the `inference_input_type` attribute will default to the original type",
)


class _WithoutGradients(logging.Filter):
    """Drops the `HARMLESS` warnings."""

    def filter(self, record):
        return not any(note in record.getMessage() for note in HARMLESS)


@contextlib.contextmanager
def reading_saved_signatures():
    """Inside: the converter reads `save_for_converter`'s folder, quietly."""
    absl = logging.getLogger("absl")
    quiet = _WithoutGradients()
    absl.addFilter(quiet)
    try:
        yield
    finally:
        absl.removeFilter(quiet)


def save_for_converter(folder, signatures):
    """Save `signatures` to `folder` for `TFLiteConverter.from_saved_model`.

    Without their custom gradients: loading a SavedModel registers each one
    in TensorFlow's global gradient registry, which never lets go of it, so
    every conversion kept its loaded graphs alive for the rest of the
    process (~16,000 objects a small causal LM's float32 export here; each
    later garbage collection, the converter's own included, walked them
    all). The converter needs no gradient.
    """
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    tf.saved_model.save(tf.Module(), folder, signatures=signatures, options=options)


def _converter(static, shape, dtype, folder):
    """A converter of `static`'s call, frozen and saved to `folder`.

    Keras' own path (`TFLiteConverter.from_keras_model`) saves the whole
    model, tracing every layer's call for the SavedModel: 2 to 4 times the
    time of the conversion itself. The converter needs one function.
    """
    spec = tf.TensorSpec((1, *shape), np.dtype(dtype).name, name="inputs")

    def serve(inputs):
        outputs = static(inputs, training=False)
        if isinstance(outputs, (list, tuple)):
            return {f"output_{i}": output for i, output in enumerate(outputs)}
        return {"output_0": outputs}

    traced = tf.function(serve).get_concrete_function(spec)
    check_trained_ranges(static, [traced])
    function = frozen(traced)
    save_for_converter(folder, function)
    with reading_saved_signatures():
        return tf.lite.TFLiteConverter.from_saved_model(folder)


#: Layers whose ops have no integer kernels, and why (`integer_blockers`).
FLOAT_ONLY = (
    (
        keras_posenc.layers.ForgettingGate,
        "the forgetting gate's log-sigmoid needs LOG and its running sum "
        "CUMSUM, which TFLM runs in float only (desktop TFLite has no int8 "
        "CUMSUM at all); convert it with mode='float32' (it runs in LiteRT "
        "and TFLM), or use position='alibi' for a fixed decay at int8",
    ),
    (
        keras_posenc.layers.ContextualPosition,
        "CoPE's fractional positions need FLOOR and CEIL (float-only in TFLM), "
        "a CUMSUM over the keys (no int8 kernel in desktop TFLite) and a GATHER "
        "at computed indices; convert it with mode='float32' (it runs in LiteRT "
        "and TFLM), or use a fixed relative bias (t5, kerple) at int8",
    ),
)


def integer_blockers(model):
    """`[(layer name, reason)]` for layers whose ops have no integer kernels:
    the `FLOAT_ONLY` classes, and layers whose options say so themselves
    (their `integer_blocker`: an exact GELU)."""
    found = [
        (layer.name, reason)
        for layer in nested_layers(model)
        for kind, reason in FLOAT_ONLY
        if isinstance(layer, kind)
    ]
    for layer in nested_layers(model):
        reason = getattr(layer, "integer_blocker", None)
        if reason is not None:
            found.append((layer.name, reason))
    return found


def refuse_float_only_layers(model, mode):
    """`ExportError` naming every `integer_blockers` layer (int8 or 16x8 modes)."""
    blockers = integer_blockers(model)
    if blockers:
        raise ExportError(
            f"mode={mode!r} needs integer kernels that these layers lack: "
            + "; ".join(f"{name}: {reason}" for name, reason in blockers)
        )


def microcontroller_blockers(model):
    """`[(layer name, reason)]` for layers that cannot run in TFLM at int8."""
    blockers = []
    for layer in nested_layers(model):
        config = layer.get_config() if hasattr(layer, "get_config") else {}
        if keras_posenc.IS_KERAS_3 and isinstance(layer, keras.layers.Embedding):
            blockers.append(
                (
                    layer.name,
                    "Keras 3 Embedding remaps negative ids with LESS/SELECT, which "
                    "TFLM lacks; use keras_posenc.TokenEmbedding",
                )
            )
        written_out = isinstance(layer, keras_posenc.layers.FeedForward)
        if "gelu" in str(config.get("activation", "")) and not written_out:
            blockers.append(
                (
                    layer.name,
                    "GELU becomes the builtin GELU op, which TFLM lacks; use relu "
                    "or x * sigmoid(1.702 x)",
                )
            )
        if getattr(layer, "attention_type", None) == "lsh":
            blockers.append(
                (
                    layer.name,
                    "LSH attention sorts tokens by bucket (TOPK_V2, which TFLM "
                    "lacks) and attends in rank-6 chunks (batched matmuls the "
                    "TFLite converter refuses); for the device, train with "
                    "attention_window=W (block-local attention runs in int8 TFLM)",
                )
            )
        if isinstance(layer, keras.layers.LayerNormalization):
            blockers.append(
                (
                    layer.name,
                    "Keras LayerNormalization is not pure int8 (a float NEG island, "
                    "and it aborts in 16x8); use keras_posenc.LayerNorm",
                )
            )
    return blockers


def run_converter(converter, mode):
    """`converter.convert()`, quietly; its failure an `ExportError` naming `mode`.

    The converter's C++ log (~15 lines a conversion, printed whatever the
    order of the user's imports) is captured, and shown only in the error of
    a failed conversion (or always, with `KERAS_POSENC_VERBOSE=1`).
    """
    log = io.StringIO()
    try:  # the converter's prints kept off stdout and standard error
        with (
            keras_posenc.ops.bounded_masking(),
            _quiet(),
            _captured_stderr(log),
            reading_saved_signatures(),
            warnings.catch_warnings(),
        ):
            # A float input's range is its first fake quantizer's: the
            # converter's call for `quantized_input_stats` does not apply.
            warnings.filterwarnings(
                "ignore", "Statistics for quantized inputs were expected"
            )
            # The converter calibrates in TensorFlow's own interpreter, whose
            # deprecation warning is TensorFlow's (the package runs LiteRT's).
            warnings.filterwarnings(
                "ignore", r"\s*Warning: tf.lite.Interpreter is deprecated"
            )
            return converter.convert()
    except Exception as error:  # the converter raises many private types
        message = f"TFLite conversion failed in mode={mode!r}: {error}"
        if log.getvalue():
            message += f"\nThe converter's log:\n{log.getvalue()}"
        raise ExportError(message) from error


def _quiet():
    return contextlib.redirect_stdout(io.StringIO())


@contextlib.contextmanager
def _captured_stderr(log):
    """The process' descriptor 2 into a temporary file inside the block, its
    text written to `log` after (as it is with `KERAS_POSENC_VERBOSE=1`, or
    where there is no descriptor 2)."""
    try:
        saved = None if keras_posenc.utils.verbose() else os.dup(2)
    except OSError:
        saved = None
    if saved is None:
        yield
        return
    _flush_stderr()
    with tempfile.TemporaryFile("w+") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            log.write(capture.read())


def _flush_stderr():
    if sys.stderr is not None:
        sys.stderr.flush()


def _calibration(data):
    def generator():
        for example in data[:CALIBRATION_EXAMPLES]:
            yield [example[None]]

    return generator


def _fit_length(data, length):
    """Crops or zero-pads axis 1 of `data` to `length`."""
    if data.shape[1] >= length:
        return data[:, :length]
    pad = [(0, 0), (0, length - data.shape[1])] + [(0, 0)] * (data.ndim - 2)
    return np.pad(data, pad)
