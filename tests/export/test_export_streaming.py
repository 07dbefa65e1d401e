"""Streaming exports: a rolling-cache decode step in LiteRT and TFLM."""

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import split_between_passes
from ops_oracle import assert_header_lists_the_model_ops

from keras_posenc.generation import Streaming
from keras_posenc.models import build_causal_lm
from tflite_export import (
    ExportError,
    convert_causal_lm,
    device_contract,
    generate_tflite,
)
from tflite_export.firmware import smallest_arena
from tflite_export.generate import tflm_generation

pytestmark = pytest.mark.slow  # every test converts a model

pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")

VOCAB = 17
WINDOW, SINKS = 5, 2  # a cache of 7 slots


def lm(position, **kwargs):
    tf.keras.utils.set_random_seed(5)
    options = dict(hidden_dim=16, num_layers=2, num_heads=2, max_length=24)
    return build_causal_lm(
        VOCAB, position=position, **builder_kwargs(**options, **kwargs)
    )


def calibration(length=30):
    return np.random.default_rng(0).integers(1, VOCAB, (4, length))


#: One method per kind of in-cache position (bias table, rotation, the
#: gate's sums), split between the passes (the TFLite graph is the same ops
#: in both modes): each pass streams a bias table and a rotation.
STREAMED = split_between_passes(
    ("t5", "alibi", "rope", "xpos", "fire", "fox"), keras2=("alibi", "rope", "fire")
)


@pytest.mark.parametrize("position", STREAMED)
def test_a_float32_step_streams_past_its_cache_as_keras_does(position):
    model = lm(position)
    streaming = Streaming(WINDOW, sink_tokens=SINKS)
    model_bytes = convert_causal_lm(
        model, calibration(), mode="float32", streaming=streaming
    )
    contract = device_contract(model_bytes)
    assert (contract.cache_length, contract.sink_tokens) == (WINDOW + SINKS, SINKS)
    prompts = [[3, 1, 4, 1], [5, 9]]  # 4 + 26 tokens: 4x the 7 slots
    want = model.generate(prompts, 26, streaming=streaming)
    np.testing.assert_array_equal(generate_tflite(model_bytes, prompts, 26), want)


def test_an_int8_tflm_step_streams_4x_its_cache_in_the_arena_of_one_that_stops():
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model = lm("rope")
    slots = WINDOW + SINKS
    streaming = convert_causal_lm(
        model,
        calibration(),
        streaming=Streaming(WINDOW, sink_tokens=SINKS),
        target="tflm",
    )
    stopping = convert_causal_lm(model, calibration(), max_length=slots, target="tflm")
    for model_bytes in (streaming, stopping):  # integer positions, int8 tensors
        contract = device_contract(model_bytes)
        assert_header_lists_the_model_ops(model_bytes, contract.c_header(arena_bytes=1))
        assert {p.dtype for p in contract.inputs[2:] + contract.outputs} == {"int8"}
        assert not {"SIN", "COS", "EXP", "FLOOR_MOD"} & set(contract.ops)
    assert (
        device_contract(streaming).cache_bytes == device_contract(stopping).cache_bytes
    )
    # The query is turned three ways (its place, its slot, a lap on), not
    # by its distance to every slot: no product the size of a key cache.
    cache = device_contract(stopping).inputs[2].shape  # (1, N, S, H)
    assert largest_elementwise_output(streaming) < np.prod(cache)
    assert largest_elementwise_output(stopping) < np.prod(cache)
    options = dict(
        max_new_tokens=4 * slots - 2,
        sampler="greedy",
        temperature=1.0,
        top_k=50,
        top_p=0.9,
        seed=None,
        stop_token_ids=(),
        pad_token_id=0,
    )
    prompts, lengths = np.array([[3, 1]], np.int32), np.array([2])
    long = tflm_generation(streaming, prompts, lengths, options)
    tflm_generation(stopping, prompts, lengths, dict(options, max_new_tokens=slots - 2))
    arena, short_arena = smallest_arena(streaming), smallest_arena(stopping)
    assert long.shape == (1, 4 * slots) and (long[0, 2:] > 0).any()
    litert = generate_tflite(streaming, prompts, 4 * slots - 2)
    assert (long == litert).mean() > 0.5  # int8 kernels round a step apart
    # 4x the cache length in a fixed arena: the stopping step's, plus the
    # slot arithmetic's int32 rows, the three turned queries and their ops'
    # nodes (measured: 41760 against 37880 bytes).
    assert arena <= short_arena * 1.15, (arena, short_arena)


def largest_elementwise_output(model_bytes):
    """The most values any MUL, ADD or SUM of `model_bytes` writes."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    shapes = {t["index"]: t["shape"] for t in interpreter.get_tensor_details()}
    return max(
        int(np.prod(shapes[op["outputs"][0]]))
        for op in interpreter._get_ops_details()
        if op["op_name"] in ("MUL", "ADD", "SUM")
    )


def test_the_contract_and_header_say_the_step_streams():
    model_bytes = convert_causal_lm(
        lm("alibi"),
        calibration(),
        streaming=Streaming(WINDOW, sink_tokens=0),
        mode="float32",
    )
    contract = device_contract(model_bytes)
    assert contract.streams and contract.sink_tokens == 0
    assert "t may run past the cache length 5" in contract.table()
    header = contract.c_header("g_lm")
    assert "#define G_LM_STREAMS 1" in header
    assert "#define G_LM_SINK_TOKENS 0" in header
    stopping = convert_causal_lm(lm("alibi"), calibration(), mode="float32")
    assert not device_contract(stopping).streams
    with pytest.raises(RuntimeError, match="TFLM cannot run the model"):
        device_contract(stopping).c_header("g_lm")  # LiteRT's prefill: no arena
    header = device_contract(stopping).c_header("g_lm", arena_bytes=1)
    assert "#define G_LM_STREAMS 0" in header
    with pytest.raises(ValueError, match="max_new_tokens.*cache length 64"):
        generate_tflite(stopping, [[1, 2]], 63)


@pytest.mark.parametrize(
    "position, kwargs, error, match",
    [
        ("t5", {"max_length": 16}, ValueError, "max_length.*None with `streaming`"),
        ("t5", {"streaming": WINDOW}, TypeError, "`streaming` must be None or a"),
        ("learned", {}, ValueError, "streaming.*absolute position encoding"),
        ("fox", {}, ExportError, "forgetting gate's log-sigmoid needs LOG"),
    ],
)
def test_streaming_exports_a_rolling_cache_cannot_hold_are_refused(
    position, kwargs, error, match
):
    arguments = {"streaming": Streaming(WINDOW, sink_tokens=SINKS), **kwargs}
    with pytest.raises(error, match=match):
        convert_causal_lm(lm(position), calibration(), **arguments)
