"""Causal LMs bundled as `.litertlm` for LiteRT-LM, the on-device LM engine.

`convert_litert_lm` writes one file the engine (`litert_lm.Engine`, the
`litert-lm run` CLI, phones' LiteRT-LM) loads as it is: a TFLite model with
the engine's signatures, a tokenizer and the LLM metadata. The signatures
(read by the engine by name):

- `prefill_<N>` for each prefill length N: inputs `tokens` int32 `(1, N)`,
  `input_pos` int32 `(N,)` and the caches; outputs the caches. A chunk
  continues from the caches it is given at `input_pos[0]` (the engine
  splits a prompt over the lengths and pads the last chunk with token 0
  and position 0: the padded tokens land past the prompt, in slots each
  later decode step writes before it reads them);
- `decode`: inputs `tokens` `(1, 1)`, `input_pos` `(1,)` and the caches;
  outputs `logits` float32 `(1, 1, V)` and the caches.

The caches are `kv_cache_k_<i>` and `kv_cache_v_<i>` for the i-th attention,
`(1, N, S, H)` float32 each: the attention layer's own heads-first cache
(`keras_posenc.ops.cache`), so no step moves a cached key. The engine binds
one buffer as a cache's input and output and zero-fills it at the start.
S is `max_num_tokens` plus the longest prefill length (room for a padded
last chunk).
"""

import io
import os
import pathlib
import tempfile

import numpy as np

from keras_posenc import DynamicPositionBias, FireBias
from keras_posenc.models import CausalLM
from keras_posenc.training.quantization import check_float32
from keras_posenc.utils import keras, nested_layers, require_tensorflow, verbose
from tflite_export.c_array import atomic_write, check_targets
from tflite_export.causal_lm import check_cache_length, check_calibration_ids
from tflite_export.convert import (
    FLOAT32_PURPOSE,
    ExportError,
    refuse_float_only_layers,
)
from tflite_export.litert_lm_model import (  # noqa: F401 (public here too)
    cache_names,
    engine_model,
    prefill_plan,
    share_identical_buffers,
)
from tflite_export.litert_lm_tokenizer import (  # noqa: F401 (public here too)
    EXTRA,
    byte_tokenizer,
    tokenizer_text,
)

#: The modes of `convert_litert_lm`: float32; int8 weights with float
#: activations (`"dynamic_int8"`); int8 weights and activations inside,
#: float32 caches and logits at the signatures (`"int8_float_io"`).
LITERT_LM_MODES = ("float32", "dynamic_int8", "int8_float_io")
#: The prefill lengths of an export that names none.
DEFAULT_PREFILL_LENGTHS = (16, 128)
#: The converter's dynamic-range mode leaves kernels of fewer values float32.
DYNAMIC_MIN_ELEMENTS = 1024


def convert_litert_lm(
    model,
    path,
    tokenizer="bytes",
    start_token=None,
    stop_tokens=(),
    max_num_tokens=None,
    prefill_lengths=DEFAULT_PREFILL_LENGTHS,
    mode="float32",
    force=False,
    calibration_ids=None,
    streaming=None,
):
    """Writes a causal LM as one `.litertlm` file LiteRT-LM runs; returns its path.

    `litert-lm run model.litertlm --prompt "..."` (or `litert_lm.Engine`)
    then generates with it: the engine tokenizes the prompt, puts
    `start_token` first, prefills, decodes and stops at a stop token or at
    `max_num_tokens`. Every method whose cache is keys and values exports;
    refused by name before any work: `hybrid` and `fox` (their caches hold
    a convolution's inputs or a gate's sums), rotary types whose
    frequencies read the current length (`dynamic`, `longrope`: a padded
    prefill chunk would read its padded length), `streaming` (the engine
    owns the positions and stops at its context limit), and full-int8
    logits (`mode="int8"`: the engine's sampler reads float logits).

    Args:
        model: a `CausalLM` (`keras_posenc.models.build_causal_lm`).
        path: the `.litertlm` file to write (kept unless `force`).
        tokenizer: `"bytes"` (ids 0-255 are the bytes of UTF-8 text; ids
            past them special tokens) or the path of an HF `tokenizer.json`.
        start_token: int or None, the id the engine puts before a prompt.
        stop_tokens: ints, the ids that end generation.
        max_num_tokens: int, the engine's context (prompt plus generated
            text). Defaults to the model's `max_length` (minus the longest
            prefill length for `position="learned"`).
        prefill_lengths: ints, the lengths of the `prefill_<N>` signatures.
        mode: one of `LITERT_LM_MODES`. Defaults to `"float32"`.
        force: bool, whether to replace an existing file. Defaults to False.
        calibration_ids: int array `(N, L)` of real token sequences, for
            `"int8_float_io"` (None for a quantization-aware model).
        streaming: must be None (refused by name otherwise).

    Returns:
        The written path, as a `pathlib.Path`.
    """
    require_tensorflow("convert_litert_lm")
    plan = _plan(**locals())  # every argument checked before any work
    builder = _builder()
    model_bytes = engine_model(
        model, plan["cache_length"], plan["prefill_lengths"], mode, plan["ids"]
    )
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        (folder / "model.tflite").write_bytes(model_bytes)
        (folder / "tokenizer.json").write_text(plan["tokenizer"], encoding="utf-8")
        (folder / "llm_metadata.pb").write_bytes(plan["metadata"])
        bundle = builder.LitertLmFileBuilder()
        bundle.add_tflite_model(
            str(folder / "model.tflite"), builder.TfLiteModelType.PREFILL_DECODE
        )
        bundle.add_hf_tokenizer(str(folder / "tokenizer.json"))
        bundle.add_llm_metadata(
            str(folder / "llm_metadata.pb"),
            supports_thinking=False,
            supports_function_calling=False,
        )
        stream = io.BytesIO()
        bundle.build(stream)
    return atomic_write(path, stream.getvalue(), force)


def _plan(
    model,
    path,
    tokenizer,
    start_token,
    stop_tokens,
    max_num_tokens,
    prefill_lengths,
    mode,
    force,
    calibration_ids,
    streaming,
):
    """Every argument checked before any work; what the export needs."""
    _check_model_and_mode(model, mode, streaming)
    if not isinstance(path, (str, os.PathLike)) or not str(path).endswith(".litertlm"):
        raise ValueError(
            f"`path` must be a file name ending in '.litertlm'. Received: {path!r}"
        )
    check_targets([pathlib.Path(path)], force)
    vocab = model.get_config()["vocab_size"]
    lengths = _prefill_lengths(prefill_lengths)
    tokens = _tokens(start_token, stop_tokens, vocab)
    max_num_tokens = _context(model, max_num_tokens, lengths)
    cache_length = max_num_tokens + max(lengths)
    check_cache_length(model, cache_length, "max_num_tokens + max(prefill_lengths)")
    text = tokenizer_text(tokenizer, vocab, tokens)
    check_float32(model, FLOAT32_PURPOSE if mode == "float32" else None)
    if mode == "int8_float_io":
        refuse_float_only_layers(model, "int8")
    if mode == "dynamic_int8":
        _refuse_small_kernels(model)
    ids = _calibration_ids(model, calibration_ids, mode)
    _builder()  # the extra, before any work
    return {
        "cache_length": cache_length,
        "prefill_lengths": lengths,
        "tokenizer": text,
        "metadata": llm_metadata(tokens, max_num_tokens),
        "ids": ids,
    }


def _check_model_and_mode(model, mode, streaming):
    """A `CausalLM` the engine can run, in a mode it reads, not streaming."""
    if not isinstance(model, CausalLM):
        raise TypeError(
            "`model` must be a CausalLM (keras_posenc.models.build_causal_lm). "
            f"Received: {type(model).__name__}"
        )
    if mode == "int8":
        raise ExportError(
            "mode='int8' (full-int8 logits) cannot run in LiteRT-LM: the engine's "
            "sampler reads float32 or float16 logits. Use mode='int8_float_io' "
            "(int8 inside, float logits and caches) or 'dynamic_int8' (int8 "
            "weights)"
        )
    if mode not in LITERT_LM_MODES:
        raise ValueError(
            f"`mode` must be one of {LITERT_LM_MODES}. Received: mode={mode!r}"
        )
    if streaming is not None:
        raise ExportError(
            "`streaming` must be None for LiteRT-LM: the engine owns the "
            "positions and stops at its context limit, so a rolling cache "
            f"never streams there. Received: streaming={streaming!r}"
        )
    refusal = litert_lm_blocker(model)
    if refusal is not None:
        raise ExportError(f"{model.name} cannot run in LiteRT-LM: {refusal}")


def _context(model, max_num_tokens, lengths):
    """The engine's context `max_num_tokens` (>= 2): by default the model's
    `max_length`, less the longest prefill for `learned` positions."""
    if max_num_tokens is None:
        max_num_tokens = model.max_length
        if model.position == "learned":
            if max(lengths) + 2 > model.max_length:
                _fail(
                    "prefill_lengths",
                    f"at most the model's max_length={model.max_length} minus 2 "
                    "for position='learned' (the context is max_length minus the "
                    "longest prefill, and holds 2 tokens at least)",
                    list(lengths),
                )
            max_num_tokens -= max(lengths)
    max_num_tokens = _positive_int("max_num_tokens", max_num_tokens)
    if max_num_tokens < 2:
        _fail("max_num_tokens", "an int >= 2", max_num_tokens)
    return max_num_tokens


def _calibration_ids(model, calibration_ids, mode):
    """The checked calibration ids of `int8_float_io` (None: trained ranges)."""
    if mode != "int8_float_io":
        if calibration_ids is not None:
            raise ValueError(
                "`calibration_ids` is read by mode='int8_float_io' only. Received: "
                f"calibration ids with mode={mode!r}"
            )
        return None
    if calibration_ids is None and not model.get_config().get("quantize"):
        raise ExportError(
            "mode='int8_float_io' needs `calibration_ids` (real token "
            "sequences) unless the model is quantization-aware. Received: "
            "calibration_ids=None"
        )
    if calibration_ids is None:
        return None
    return check_calibration_ids(model, calibration_ids)


def _projection_layers(model):
    """The Dense layers of `model` that run as FULLY_CONNECTED on the device.

    A bias producer's MLP reads only positions, which the export folds into
    constants, so its Dense layers are not among them.
    """
    folded = (DynamicPositionBias, FireBias)
    return [
        layer
        for layer in nested_layers(model, lambda layer: not isinstance(layer, folded))
        if isinstance(layer, keras.layers.Dense)
    ]


def _refuse_small_kernels(model):
    """Refuses `dynamic_int8` where the converter would leave kernels float.

    Dynamic-range quantization skips kernels of fewer than
    `DYNAMIC_MIN_ELEMENTS` values; a projection that small stays float32.
    (A bias producer's MLP is folded into constants, so it does not count.)
    """
    small = [
        f"{layer.name} {tuple(layer.kernel.shape)}"
        for layer in _projection_layers(model)
        if int(np.prod(layer.kernel.shape)) < DYNAMIC_MIN_ELEMENTS
    ]
    if small:
        raise ExportError(
            f"mode='dynamic_int8' quantizes kernels of {DYNAMIC_MIN_ELEMENTS} "
            f"values or more only, and {model.name}'s projections "
            f"{', '.join(small[:4])}{' ...' if len(small) > 4 else ''} are "
            "smaller: they would stay float32. Use mode='int8_float_io' "
            "(calibrated int8) or 'float32', or a wider model"
        )


def litert_lm_blocker(model):
    """Why `model` cannot run in LiteRT-LM, or None."""
    held = sorted(set(model.cache_kinds()) - {"keys", "values"})
    if held:
        return (
            f"position={model.position!r} caches {' and '.join(held)}, not keys "
            "and values (the engine's caches are kv_cache_k_<i> and "
            "kv_cache_v_<i>)"
        )
    if model.reads_current_length:
        return (
            "its rotary frequencies read the current length ('dynamic', "
            "'longrope'): a padded prefill chunk would read its padded length"
        )
    return None


def _fail(name, expected, received, error=ValueError):
    raise error(f"`{name}` must be {expected}. Received: {name}={received!r}")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        _fail(name, "a positive int", value)
    return int(value)


def _prefill_lengths(prefill_lengths):
    if isinstance(prefill_lengths, (str, bytes)) or not hasattr(
        prefill_lengths, "__iter__"
    ):
        _fail("prefill_lengths", "a sequence of positive ints", prefill_lengths)
    lengths = tuple(prefill_lengths)
    if not lengths or len(set(lengths)) != len(lengths):
        _fail("prefill_lengths", "one or more distinct positive ints", prefill_lengths)
    for length in lengths:
        _positive_int("prefill_lengths", length)
    return tuple(sorted(lengths))


def _tokens(start_token, stop_tokens, vocab):
    """`(start, stops)` checked against the vocabulary."""
    if isinstance(stop_tokens, (int, np.integer)):
        stop_tokens = (stop_tokens,)
    if isinstance(stop_tokens, (str, bytes)) or not hasattr(stop_tokens, "__iter__"):
        _fail("stop_tokens", "an int or a sequence of ints", stop_tokens, TypeError)
    stops = tuple(stop_tokens)
    for name, values in (
        ("start_token", () if start_token is None else (start_token,)),
        ("stop_tokens", stops),
    ):
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                _fail(name, "int token ids", value, error=TypeError)
            if not 0 <= value < vocab:
                _fail(name, f"ids in [0, vocab_size={vocab})", value)
    if start_token is not None and start_token in stops:
        _fail(
            "start_token",
            f"an id that is not also a stop token (stop_tokens={list(stops)}: the "
            "engine would stop before the first new token)",
            start_token,
        )
    return (
        None if start_token is None else int(start_token),
        tuple(int(s) for s in stops),
    )


def llm_metadata(tokens, max_num_tokens):
    """The serialized `LlmMetadata` proto: tokens, context, greedy sampler."""
    from litert_lm_builder.runtime.proto import (
        llm_metadata_pb2,
        llm_model_type_pb2,
        sampler_params_pb2,
    )

    start, stops = tokens
    metadata = llm_metadata_pb2.LlmMetadata()
    if start is not None:
        metadata.start_token.token_ids.ids.append(start)
    for stop in stops:
        metadata.stop_tokens.add().token_ids.ids.append(stop)
    metadata.max_num_tokens = max_num_tokens
    metadata.llm_model_type.CopyFrom(
        llm_model_type_pb2.LlmModelType(generic_model=llm_model_type_pb2.GenericModel())
    )
    sampler = metadata.sampler_params
    sampler.type = sampler_params_pb2.SamplerParameters.TOP_P  # k=1: greedy
    sampler.k, sampler.p, sampler.temperature = 1, 1.0, 1.0
    metadata.supports_thinking = False
    metadata.supports_function_calling = False
    return metadata.SerializeToString()


def _builder():
    try:
        import litert_lm_builder
    except ImportError as error:
        raise ImportError(
            f"convert_litert_lm needs litert-lm-builder: {EXTRA}"
        ) from error
    quiet_engine()
    return litert_lm_builder


def quiet_engine():
    """The LiteRT-LM engine's C++ log at warnings and above (its INFO lines,
    ~70 a run, are not the user's), unless `KERAS_POSENC_VERBOSE=1`; nothing
    without the engine (`litert-lm-api`)."""
    try:
        import litert_lm
    except ImportError:
        return
    if not verbose():
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.WARNING)
