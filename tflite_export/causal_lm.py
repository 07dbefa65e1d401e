"""Causal language models on the device: prefill/decode TFLite and generation.

`convert_causal_lm` turns a `keras_posenc.models.CausalLM` into TFLite
with the key/value cache passed in and out as tensors: for LiteRT one model
with a `prefill` signature (a whole padded prompt at positions
`0 .. max_length - 1`) and a `decode` signature (one token at `index`); for
TFLM one single-subgraph decode step (static shapes, one token in, the cache
in and out). `generate_tflite` decodes with either interpreter.
"""

import os
import tempfile

import numpy as np
import tensorflow as tf

import keras_posenc
from keras_posenc import RotaryEmbedding, generation
from keras_posenc.models import CausalLM
from keras_posenc.ops.cache import static_decoding
from keras_posenc.ops.rotary import ROPE_TYPES
from keras_posenc.training.quantization import check_float32
from keras_posenc.utils import nested_layers, require_tensorflow
from tflite_export.contract import device_contract
from tflite_export.convert import (
    FLOAT32_PURPOSE,
    ExportError,
    check_integer_ops,
    check_trained_ranges,
    reading_saved_signatures,
    refuse_float_only_layers,
    run_converter,
    save_for_converter,
)
from tflite_export.convert import frozen as freeze
from tflite_export.int4 import int4_kernels
from tflite_export.integer_islands import integer_update_slices
from tflite_export.metadata import ROLLING, add_metadata
from tflite_export.tensor_names import name_tensors

#: Where a causal LM runs: LiteRT (phones) or TFLM (microcontrollers).
TARGETS = ("litert", "tflm")
#: The conversion modes of a causal LM (`"int4"`: int8 with 4-bit kernels).
LM_MODES = ("int8", "int4", "float32")
#: The cache length of an export without `streaming`.
DEFAULT_MAX_LENGTH = 64
#: Calibration sequences decoded to record realistic caches.
CALIBRATION_SEQUENCES = 8


def convert_causal_lm(
    model,
    calibration_ids,
    mode="int8",
    max_length=None,
    target="litert",
    streaming=None,
):
    """TFLite bytes of a causal LM with its KV cache as inputs and outputs.

    Signature `decode` (the only one for `target="tflm"`, a streaming step
    and rotary types whose frequencies read the current length): inputs
    `token` `(1, 1)` int32, `index` `()` int32 and `cache_0 ..`
    (`model.cache_shapes(1, max_length)`); outputs `logits` `(1, 1, V)` and
    the updated caches, in that order, each tensor named as its key
    (`tflite_export.device_contract` reads them as a firmware does).
    Signature `prefill` (LiteRT): `tokens` `(1, max_length)`, a padded
    prompt. In int8, caches and logits are int8 and every position table is
    a constant the step gathers rows of (no SIN, COS or EXP on the device);
    what is refused for TFLM, the streaming step's ring and the signatures
    in full: `docs/language_models.md`, `docs/lm_on_device.md`.

    Args:
        model: a `CausalLM` (`keras_posenc.models.build_causal_lm`).
        calibration_ids: int array `(N, L)` of real token sequences (the
            first `CALIBRATION_SEQUENCES` decoded to calibrate), or None for
            `mode="float32"` or a quantization-aware model (trained ranges).
        mode: `"int8"`, `"int4"` (int8 with 4-bit kernels: per channel in LiteRT,
            per tensor in TFLM; a `quantize="int4"` model's trained grid kept
            exactly) or `"float32"`.
        max_length: int, the cache length S (the longest prompt plus
            generated text). Defaults to `64`; must be None with `streaming`
            (the cache then has `streaming.slots` slots).
        target: `"litert"` or `"tflm"`.
        streaming: None, or a `keras_posenc.generation.Streaming`: a step
            that streams through its rolling cache past its length (models a
            rolling cache cannot hold are refused). Defaults to None.

    Returns:
        The `.tflite` model as bytes.
    """
    require_tensorflow("convert_causal_lm")
    max_length, rolling = _check_export(model, mode, target, max_length, streaming)
    ids, trained_ranges = _check_calibration(model, calibration_ids, mode)
    keys = ["prefill", "decode"]
    # A padded prefill would read max_length as a length-dependent type's
    # length; a rolling cache is filled token by token.
    if target == "tflm" or model.reads_current_length or rolling is not None:
        keys = ["decode"]
    sink = None if rolling is None else rolling[0]
    calibration = None
    if not trained_ranges and mode != "float32":
        calibration = _calibration(model, ids, max_length, keys, sink)
    model_bytes = _convert_steps(model, (max_length, sink), keys, mode, calibration)
    if mode != "float32":  # the cache writes the converter left float
        model_bytes = integer_update_slices(
            model_bytes, requantize_cache=not trained_ranges
        )
    if mode == "int4":  # TFLM runs INT4 kernels with one scale each
        model_bytes = int4_kernels(model_bytes, per_channel=target == "litert")
    model_bytes = name_tensors(model_bytes)
    if rolling is not None:
        record = {"sink_tokens": sink, "cache_window": max_length - sink}
        model_bytes = add_metadata(model_bytes, ROLLING, record)
    _check_types(model_bytes, mode, keys)
    if trained_ranges:
        check_integer_ops(model_bytes)
    return model_bytes


def _check_export(model, mode, target, max_length, streaming):
    """`(max_length, rolling)` of `convert_causal_lm`'s checked arguments:
    `rolling` is `(sink_tokens, slots)` of a streaming step, or None."""
    if not isinstance(model, CausalLM):
        raise TypeError(
            "`model` must be a CausalLM (keras_posenc.models.build_causal_lm). "
            f"Received: {type(model).__name__}"
        )
    if mode not in LM_MODES:
        raise ValueError(f"`mode` must be one of {LM_MODES}. Received: mode={mode!r}")
    if target not in TARGETS:
        raise ValueError(
            f"`target` must be one of {TARGETS}. Received: target={target!r}"
        )
    streaming = generation.streaming_from(streaming)
    rolling = None
    if streaming is not None:
        if max_length is not None:
            raise ValueError(
                "`max_length` must be None with `streaming` (the rolling cache "
                "has sink_tokens + cache_window slots). Received: "
                f"max_length={max_length!r}, streaming={streaming!r}"
            )
        rolling = model.check_streaming(streaming)  # (sink, S)
        max_length = rolling[1]
    elif max_length is None:
        max_length = DEFAULT_MAX_LENGTH
    if (
        isinstance(max_length, bool)
        or not isinstance(max_length, int)
        or max_length < 2
    ):
        raise ValueError(
            f"`max_length` must be an int >= 2. Received: max_length={max_length!r}"
        )
    check_cache_length(model, max_length)
    if target == "tflm":
        _refuse_runtime_exponentials(model)
    check_float32(model, None if mode != "float32" else FLOAT32_PURPOSE)
    if mode != "float32":
        refuse_float_only_layers(model, "int8")
    return max_length, rolling


def _refuse_runtime_exponentials(model):
    """A TFLM step cannot take an int8 EXP of the runtime position."""
    for layer in nested_layers(model):
        if isinstance(layer, RotaryEmbedding) and _runtime_exponential(layer):
            raise ExportError(
                f"{layer.name}: rope_type={layer.rope_type!r}"
                + (" with xPos" if layer.xpos_scale_base is not None else "")
                + " takes an exponential of the runtime position or length "
                "when decoding, and TFLM's EXP kernel is float-only (an int8 "
                "EXP fails to prepare); export it with target='litert'"
            )


def _check_calibration(model, calibration_ids, mode):
    """`(ids or None, trained_ranges)`: float32 calibrates nothing; int8
    without data reads a quantization-aware model's trained ranges."""
    trained_ranges = calibration_ids is None and mode != "float32"
    quantized = model.get_config().get("quantize")
    if trained_ranges and not quantized:
        raise ExportError(
            f"`calibration_ids` may be None in mode={mode!r} only for a "
            "quantization-aware CausalLM (quantize=True, e.g. from "
            "tflite_export.quantize_aware) or in mode='float32'. Received: None "
            f"for {model.name}, built with quantize=False"
        )
    if calibration_ids is None and mode == "float32" and quantized:
        raise ExportError(
            "A quantization-aware CausalLM converts without data in "
            f"mode='int8' or 'int4' only. Received: mode={mode!r}"
        )
    if calibration_ids is None:
        return None, trained_ranges
    return check_calibration_ids(model, calibration_ids), trained_ranges


def _convert_steps(model, shape, keys, mode, calibration):
    """The converter's bytes of the signatures `keys` (`shape`: the cache
    length and sink tokens); `calibration` the representative dataset, or
    None (float32, or trained ranges)."""
    max_length, sink = shape
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "saved_model")
        with keras_posenc.ops.bounded_masking(), static_decoding():
            signatures = _signatures(model, max_length, keys, sink)
            check_trained_ranges(model, list(signatures.values()))
            # Weights frozen into constants: the converter keeps variables of
            # multi-signature SavedModels as READ_VARIABLE ops otherwise.
            frozen = {key: freeze(function) for key, function in signatures.items()}
            save_for_converter(path, frozen)
        with reading_saved_signatures():
            converter = tf.lite.TFLiteConverter.from_saved_model(
                path, signature_keys=keys
            )
        if mode != "float32":  # int4: int8, then its kernels rewritten
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if calibration is not None:  # else the fake quantizers' ranges
                converter.representative_dataset = calibration
                ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
                converter.target_spec.supported_ops = ops
            converter.inference_input_type = tf.int8
            converter.inference_output_type = tf.int8
        return run_converter(converter, mode)


def check_cache_length(model, length, name="max_length"):
    """Refuses a cache of `length` slots the model's tables cannot reach.

    `name` is the argument (or expression) the length came from.
    """
    limit = model.max_length
    if model.position == "learned" and length > limit:
        raise ValueError(
            f"`{name}` must be <= the model's max_length={limit} for "
            f"position='learned'. Received: {name}={length}"
        )
    for layer in nested_layers(model):
        limit = (
            getattr(layer, "max_position", None)
            if isinstance(layer, RotaryEmbedding)
            else None
        )
        if limit is not None and length > limit:
            raise ValueError(
                f"`{name}` must be at most {limit} for {layer.name}: xPos "
                f"(xpos_scale_base={layer.xpos_scale_base}) scales leave float32 "
                f"past it. Received: {name}={length}"
            )


def _runtime_exponential(rotary):
    """Whether a decoding step of `rotary` runs an EXP (no table can serve)."""
    if rotary.position_only:
        return False  # cos, sin and xPos scales are rows of a constant table
    exponential = ROPE_TYPES[rotary.rope_type].length_exponential
    return exponential or rotary.xpos_scale_base is not None


def check_calibration_ids(model, calibration_ids):
    """The calibration token ids as int32 `(N, L)`, checked against the vocabulary."""
    ids = np.asarray(calibration_ids)
    if ids.ndim != 2 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise ExportError(
            "`calibration_ids` must be integer token ids (N, L) with N, L >= 1. "
            f"Received: shape={ids.shape}, dtype={ids.dtype}"
        )
    vocab = model.get_config()["vocab_size"]
    if ids.min() < 0 or ids.max() >= vocab:
        raise ExportError(
            f"`calibration_ids` must lie in [0, vocab_size={vocab}). "
            f"Received: ids in [{ids.min()}, {ids.max()}]"
        )
    return ids.astype(np.int32)


def _signatures(model, max_length, keys, sink_tokens=None):
    shapes = model.cache_shapes(1, max_length)
    cache_specs = {
        f"cache_{i}": tf.TensorSpec(shape, tf.float32, name=f"cache_{i}")
        for i, shape in enumerate(shapes)
    }

    def outputs(logits, cache):
        return {"logits": logits, **{f"cache_{i}": c for i, c in enumerate(cache)}}

    def decode(token, index, **cache):
        ordered = [cache[f"cache_{i}"] for i in range(len(shapes))]
        return outputs(
            *model.call_with_cache(token, ordered, index, sink_tokens=sink_tokens)
        )

    def prefill(tokens):
        empty = [tf.zeros(shape, tf.float32) for shape in shapes]
        return outputs(*model.call_with_cache(tokens, empty, 0))

    token = tf.TensorSpec((1, 1), tf.int32, name="token")
    index = tf.TensorSpec((), tf.int32, name="index")
    concrete = {
        "decode": tf.function(decode, autograph=False).get_concrete_function(
            token, index, **cache_specs
        )
    }
    if "prefill" in keys:
        tokens = tf.TensorSpec((1, max_length), tf.int32, name="tokens")
        concrete["prefill"] = tf.function(
            prefill, autograph=False
        ).get_concrete_function(tokens)
    return concrete


def _calibration(model, ids, max_length, keys, sink_tokens=None):
    """Representative `(signature, inputs)` pairs from decoding real sequences.

    A rolling cache (`sink_tokens`) reads each whole sequence, past its
    length; a full cache the first `max_length` tokens of each.
    """
    if sink_tokens is None:
        _, step = model.compiled_steps(1, max_length)
    else:
        step = tf.function(
            lambda token, cache, index: model.call_with_cache(
                token, cache, index, sink_tokens=sink_tokens
            ),
            autograph=False,
        )
    samples = []
    for row in ids[:CALIBRATION_SEQUENCES]:
        row = row if sink_tokens is not None else row[:max_length]
        cache = model.empty_cache(1, max_length)
        if "prefill" in keys:
            padded = np.zeros((1, max_length), np.int32)
            padded[0, : len(row)] = row
            samples.append(("prefill", {"tokens": padded}))
        for t, token in enumerate(row):
            inputs = {
                "token": np.array([[token]], np.int32),
                "index": np.array(t, np.int32),
            }
            inputs.update({f"cache_{i}": c.numpy() for i, c in enumerate(cache)})
            samples.append(("decode", inputs))
            _, cache = step(tf.constant(inputs["token"]), cache, tf.constant(t))

    def generator():
        yield from samples

    return generator


def _check_types(model_bytes, mode, keys):
    """Raises unless int8 was produced where int8 was asked."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    found = sorted(interpreter.get_signature_list())
    if found != sorted(keys):
        raise ExportError(f"Expected signatures {sorted(keys)}, found {found}")
    contract = device_contract(model_bytes)
    layout = [port.name for port in contract.inputs + contract.outputs]
    caches = list(contract.caches)
    if layout != ["token", "index", *caches, "logits", *caches]:
        raise ExportError(f"The decode step's tensors are out of order: {layout}")
    if mode == "float32":
        return
    for key in keys:
        runner = interpreter.get_signature_runner(key)
        details = {**runner.get_input_details(), **runner.get_output_details()}
        for name, detail in details.items():
            want = "int32" if name in ("token", "tokens", "index") else "int8"
            got = np.dtype(detail["dtype"]).name
            if got != want:
                raise ExportError(
                    f"The converter did not produce a full int8 model: {key}/{name} "
                    f"is {got} (expected {want})"
                )
