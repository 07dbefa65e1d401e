"""Causal LMs on the device: prefill/decode LiteRT, a TFLM decode step, generation."""

import gc

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from kernels import fully_connected_kernels
from marks import split_between_passes
from ops_oracle import assert_header_lists_the_model_ops

import tflite_export
from keras_posenc import IS_KERAS_3, samplers
from keras_posenc.generation import Sampling
from keras_posenc.models import build_causal_lm
from tflite_export import (
    ExportError,
    convert_causal_lm,
    device_contract,
    generate_tflite,
)
from tflite_export.generate import Decoder

#: Every test here converts a model to TFLite.
pytestmark = pytest.mark.slow

pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")

VOCAB = 17
PROMPTS = [[3, 1, 4, 1], [5, 9]]


def lm(position, **kwargs):
    tf.keras.utils.set_random_seed(5)
    return build_causal_lm(
        VOCAB,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        position=position,
        **builder_kwargs(**kwargs),
    )


def calibration():
    return np.random.default_rng(0).integers(1, VOCAB, (4, 12))


def signature_details(model_bytes):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    found = {}
    for key in interpreter.get_signature_list():
        runner = interpreter.get_signature_runner(key)
        found[key] = {**runner.get_input_details(), **runner.get_output_details()}
    return found


#: Ragged prompts and the signatures' shapes, on four methods split between
#: the passes; every method's float32 tokens are the conformance matrix's
#: (`test_export_conformance.py`).
EXPORTED = split_between_passes(("t5", "rope", "hybrid", "cope"), ("t5", "hybrid"))


@pytest.mark.parametrize("position", EXPORTED)
def test_float32_litert_generation_equals_keras_greedy_tokens(position):
    model = lm(position, max_length=32)
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    details = signature_details(model_bytes)
    assert sorted(details) == ["decode", "prefill"]
    shapes = model.cache_shapes(1, 16)
    assert [
        tuple(details["decode"][f"cache_{i}"]["shape"]) for i in range(len(shapes))
    ] == shapes
    np.testing.assert_array_equal(
        generate_tflite(model_bytes, PROMPTS, 9), model.generate(PROMPTS, 9)
    )
    header = device_contract(model_bytes).c_header(arena_bytes=1)
    assert_header_lists_the_model_ops(model_bytes, header)


def test_a_shared_bias_lm_generates_in_litert_as_in_keras():
    model = lm("t5", max_length=32, share_position_bias=True)
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    np.testing.assert_array_equal(
        generate_tflite(model_bytes, PROMPTS, 9), model.generate(PROMPTS, 9)
    )


def test_a_conversion_leaves_no_graph_alive():
    """The exporter's SavedModel holds no custom gradient: loading one
    registers it in TensorFlow's global gradient registry, which keeps its
    graphs alive for the rest of the process."""
    from tensorflow.python.framework.func_graph import FuncGraph

    def graphs():
        gc.collect()
        return sum(isinstance(o, FuncGraph) for o in gc.get_objects())

    model = lm("t5", max_length=32)  # its bias's expansion has a custom gradient
    convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    before = graphs()
    convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    assert graphs() == before


@pytest.mark.parametrize(
    "position, match", [("fox", "LOG .*CUMSUM"), ("cope", "FLOOR and CEIL")]
)
def test_float_only_methods_refuse_an_int8_lm_before_converting(position, match):
    model = lm(position, max_length=32)
    for target in ("litert", "tflm"):
        with pytest.raises(ExportError, match=f"{match}.*mode='float32'"):
            convert_causal_lm(model, calibration(), mode="int8", target=target)


if IS_KERAS_3:  # the TFLite graph is the same TensorFlow ops in either mode

    @pytest.mark.parametrize("position", ["fox", "cope"])
    @pytest.mark.parametrize("window", [None, 3])
    def test_float_only_methods_generate_in_tflm_at_float32(position, window):
        """float32 runs in LiteRT and TFLM (fox: the step adds this token's log
        gate to the cached sum; cope: each step recounts over the cached keys),
        dense and block-local (the step's window mask is the band's)."""
        pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
        model = lm(position, max_length=32, attention_window=window)
        model_bytes = convert_causal_lm(
            model, calibration(), mode="float32", max_length=16, target="tflm"
        )
        np.testing.assert_array_equal(
            generate_tflite(model_bytes, PROMPTS, 9, runtime="tflm"),
            model.generate(PROMPTS, 9),
        )
        # A sampler instance crosses to the TFLM child process and draws alike.
        top_k = Sampling(samplers.TopKSampler(k=4, temperature=2.0), seed=3)
        np.testing.assert_array_equal(
            generate_tflite(model_bytes, PROMPTS, 9, runtime="tflm", sampling=top_k),
            model.generate(PROMPTS, 9, top_k),
        )


def operator_names(model_bytes):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    return {op["op_name"] for op in interpreter._get_ops_details()}


@pytest.mark.parametrize("position", ["rope", "hybrid"])
def test_int8_tflm_decoding_agrees_with_int8_litert(position):
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model = lm(position)
    model_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    details = signature_details(model_bytes)
    assert list(details) == ["decode"]  # one subgraph for microcontrollers
    for name, detail in details["decode"].items():
        want = np.int32 if name in ("token", "index") else np.int8
        assert detail["dtype"] == want, name
    # Rotary cosines, sines and xPos scales are rows of constant tables,
    # gathered at integer positions (never rounded to int8 on the way).
    assert not operator_names(model_bytes) & {"SIN", "COS", "EXP"}
    assert not float_to_integer_casts(model_bytes)
    litert = generate_tflite(model_bytes, PROMPTS, 8, runtime="litert")
    # NumPy scalars reach the TFLM worker as JSON numbers.
    scalars = Sampling(temperature=np.float32(1.0), seed=np.int64(0))
    tflm = generate_tflite(model_bytes, PROMPTS, np.int64(8), "tflm", scalars)
    for row, prompt in enumerate(PROMPTS):
        tokens = litert[row, : len(prompt) + 8]  # the row's prompt and new tokens
        end = decided_length(model_bytes, tokens, len(prompt))
        np.testing.assert_array_equal(tflm[row, :end], tokens[:end])


def test_a_bias_table_of_every_pair_folds_into_the_int8_tflm_step():
    """fire's `(S, S)` table masked by band_part left float NEG, SELECT_V2 and
    ZEROS_LIKE ops over an int32 grid: TFLM failed ("Type INT32 (2) not
    supported"). Masked by a constant, the table folds and the step runs."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model = lm("fire")
    model_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    from tflite_export.generate import teacher_forced_logits

    assert not operator_names(model_bytes) & {"NEG", "ZEROS_LIKE", "LOGICAL_AND"}
    sequence = calibration()[0]
    tflm = teacher_forced_logits(model_bytes, sequence, "tflm")
    litert = teacher_forced_logits(model_bytes, sequence, "litert")
    step = device_contract(model_bytes).output_port("logits").scale
    assert np.abs(tflm - litert).max() <= 12 * step * 1.001


def float_to_integer_casts(model_bytes):
    """The CAST ops of `model_bytes` from a float tensor to an integer one."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    tensors = interpreter.get_tensor_details()
    dtypes = {t["index"]: np.dtype(t["dtype"]) for t in tensors}
    return [
        op
        for op in interpreter._get_ops_details()
        if op["op_name"] == "CAST"
        and dtypes[op["inputs"][0]].kind == "f"
        and dtypes[op["outputs"][0]].kind in "iu"
    ]


def assert_tflm_decodes_as_litert(model_bytes):
    """Greedy TFLM tokens are LiteRT's up to where kernel rounding decides."""
    litert = generate_tflite(model_bytes, PROMPTS, 8, runtime="litert")
    tflm = generate_tflite(model_bytes, PROMPTS, 8, runtime="tflm")
    for row, prompt in enumerate(PROMPTS):
        tokens = litert[row, : len(prompt) + 8]
        end = decided_length(model_bytes, tokens, len(prompt))
        np.testing.assert_array_equal(tflm[row, :end], tokens[:end])


def decided_length(model_bytes, tokens, prompt_length):
    """How many of `tokens` greedy decoding decides despite kernel rounding.

    Reads `tokens` teacher-forced through LiteRT and TFLM. Their int8 kernels
    (and float SIN/COS islands) round some logits a step apart, and the int8
    caches carry that forward (measured here: at most 9 output steps over 12
    tokens, out of 256; an int8 cache that does not drift is open work).
    Where LiteRT's best two logits are closer than twice the two runtimes'
    gap, the next token may differ; up to the first such step both must
    agree exactly.
    """
    litert, tflm = Decoder(model_bytes, "litert"), Decoder(model_bytes, "tflm")
    step = litert.contract.output_port("logits").scale
    end = len(tokens)
    for t in range(len(tokens) - 1):
        logits = litert.run_decode(int(tokens[t]), t)[0]
        gap = np.abs(logits - tflm.run_decode(int(tokens[t]), t)[0]).max()
        assert gap <= 12 * step * 1.001, (t, gap / step)  # 5% of the int8 range
        best, second = np.sort(logits)[-1:-3:-1]
        if t + 1 >= prompt_length and best - second <= 2 * gap and end == len(tokens):
            end = t + 1  # tokens[t + 1] may differ: rounding decided it
    return end


def test_int8_litert_prefill_and_decode_with_a_window():
    model = lm("alibi", attention_window=4)
    model_bytes = convert_causal_lm(model, calibration(), max_length=16)
    details = signature_details(model_bytes)
    assert details["prefill"]["logits"]["dtype"] == np.int8
    assert generate_tflite(model_bytes, PROMPTS, 8).shape == (2, 12)
    # Teacher-forced int8 logits against Keras: the step reads its cache right.
    decoder = Decoder(model_bytes, "litert")
    sequence = np.random.default_rng(1).integers(1, VOCAB, 14)
    logits = [decoder.run_decode(int(token), t) for t, token in enumerate(sequence)]
    reference = model(sequence[None]).numpy()[0]
    error = np.abs(np.concatenate(logits) - reference).max()
    assert error < 0.1 * np.ptp(reference)
    # TFLM runs the band's block arithmetic (int32 DIV: it has no FLOOR_DIV).
    tflm_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    np.testing.assert_array_equal(
        generate_tflite(tflm_bytes, PROMPTS, 8, runtime="tflm"),
        generate_tflite(model_bytes, PROMPTS, 8),
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"mode": "int16x8"}, ValueError, "mode"),
        ({"target": "gpu"}, ValueError, "target"),
        ({"max_length": 1}, ValueError, "max_length"),
        ({"calibration_ids": np.full((2, 4), VOCAB)}, ExportError, "calibration_ids"),
        (
            {"calibration_ids": np.zeros((2, 4), "float32")},
            ExportError,
            "calibration_ids",
        ),
    ],
)
def test_bad_export_arguments_are_refused(kwargs, error, match):
    arguments = {"calibration_ids": calibration(), **kwargs}
    with pytest.raises(error, match=match):
        convert_causal_lm(lm("none", max_length=8), **arguments)


def test_only_causal_lms_and_learned_tables_long_enough_are_exported():
    from keras_posenc.models import build_encoder

    with pytest.raises(TypeError, match="CausalLM"):
        convert_causal_lm(build_encoder(vocab_size=5), calibration())
    with pytest.raises(ValueError, match="max_length"):
        convert_causal_lm(lm("learned", max_length=8), calibration(), max_length=16)


@pytest.fixture(scope="module")
def small_bytes():
    tf.keras.utils.set_random_seed(5)
    model = build_causal_lm(
        VOCAB, hidden_dim=8, num_layers=1, num_heads=2, position="none"
    )
    return convert_causal_lm(model, calibration(), mode="float32", max_length=8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt_ids": [list(range(1, 10))]}, "prompt_ids"),
        ({"max_new_tokens": 6}, "max_new_tokens"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"runtime": "gpu"}, "runtime"),
    ],
)
def test_bad_generation_arguments_are_refused(small_bytes, kwargs, match):
    arguments = {"prompt_ids": [[1, 2, 3]], "max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate_tflite(small_bytes, **arguments)
    with pytest.raises(TypeError, match="`sampling` must be None or a"):
        generate_tflite(small_bytes, [[1, 2]], 2, sampling="beam")


#: Length-dependent rotary types (their cos and sin are computed per step).
DYNAMIC = dict(
    rope_type="dynamic", scaling_factor=2.0, original_max_position_embeddings=8
)
LONGROPE = dict(
    rope_type="longrope",
    scaling_factor=2.0,
    original_max_position_embeddings=8,
    rope_parameters={"short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
)


@pytest.mark.parametrize(
    "position,options,match",
    [
        ("rope", DYNAMIC, "rope_type='dynamic' takes an exponential.*EXP"),
        ("xpos", DYNAMIC, "rope_type='dynamic' with xPos.*EXP"),
        ("xpos", LONGROPE, "rope_type='longrope' with xPos.*EXP"),
    ],
)
def test_a_runtime_exponential_is_refused_for_microcontrollers_before_converting(
    position, options, match
):
    model = lm(position, position_options=options)
    with pytest.raises(ExportError, match=match):
        convert_causal_lm(model, calibration(), target="tflm")


def test_length_dependent_sines_run_in_tflm_as_float_islands():
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model = lm("rope", position_options=LONGROPE)
    model_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    assert {"SIN", "COS"} <= operator_names(model_bytes)
    assert_tflm_decodes_as_litert(model_bytes)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"prompt_ids": [[1, VOCAB]]}, ValueError, f"vocab_size={VOCAB}"),
        ({"prompt_ids": [[1.5, 2]]}, TypeError, "prompt_ids"),
        ({"runtime": "tflm"}, ValueError, "target='tflm'"),
    ],
)
def test_bad_ids_and_a_litert_file_for_tflm_are_refused(
    small_bytes, kwargs, error, match
):
    arguments = {"prompt_ids": [[1, 2, 3]], "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=match):
        generate_tflite(small_bytes, **arguments)


def test_teacher_forced_logits_are_the_keras_models_in_both_runtimes():
    """A float32 TFLM step fed a sequence token by token: the Keras model's
    logits of the whole sequence, in LiteRT and in TFLM, one row or several."""
    from tflite_export.generate import teacher_forced_logits

    tf.keras.utils.set_random_seed(5)
    model = build_causal_lm(
        VOCAB, hidden_dim=8, num_layers=1, num_heads=2, position="alibi"
    )
    model_bytes = convert_causal_lm(
        model, None, mode="float32", max_length=12, target="tflm"
    )
    rows = np.random.default_rng(2).integers(0, VOCAB, (2, 10))
    expected = model(rows).numpy()
    for runtime in ("litert", "tflm"):
        got = teacher_forced_logits(model_bytes, rows, runtime)
        np.testing.assert_allclose(got, expected, atol=1e-4)
        one = teacher_forced_logits(model_bytes, rows[1], runtime)
        np.testing.assert_allclose(one, expected[1], atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"token_ids": [[1, VOCAB]]}, ValueError, f"vocab_size={VOCAB}"),
        ({"token_ids": [1.5, 2]}, ValueError, "`token_ids` must be a non-empty"),
        ({"token_ids": np.ones((1, 1, 2), int)}, ValueError, r"\(B, T\) array"),
        ({"token_ids": [1] * 9}, ValueError, "at most the cache length 8"),
        ({"runtime": "xnnpack"}, ValueError, "`runtime` must be one of"),
        ({"model_bytes": "lm.tflite"}, ValueError, "`model_bytes` must be bytes"),
    ],
)
def test_teacher_forcing_refuses_bad_ids_and_runtimes(
    small_bytes, kwargs, error, match
):
    from tflite_export.generate import teacher_forced_logits

    arguments = {"model_bytes": small_bytes, "token_ids": [1, 2, 3], **kwargs}
    with pytest.raises(error, match=match):
        teacher_forced_logits(**arguments)


def test_seeded_sampling_of_a_batch_equals_keras_and_numpy_scalars_work():
    tf.keras.utils.set_random_seed(5)
    model = build_causal_lm(
        VOCAB, hidden_dim=8, num_layers=1, num_heads=2, position="alibi"
    )
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=12)
    prompts = [[1, 2, 3]] * 3  # equal prompts draw different samples
    options = dict(sampler="top_k", top_k=np.int64(5), temperature=np.float32(2.0))
    keras_tokens = model.generate(
        prompts, np.int64(6), sampling=Sampling(seed=np.int64(3), **options)
    )
    litert = generate_tflite(
        model_bytes, prompts, 6, sampling=Sampling(seed=3, **options)
    )
    np.testing.assert_array_equal(litert, keras_tokens)
    assert len({tuple(row) for row in litert}) > 1


#: Every rotary scaling, and xPos: cached and recomputed Keras decoding and
#: float32 LiteRT decoding give the same greedy tokens (a length-dependent
#: type refuses the recompute, `CausalLM.reads_current_length`).
ROTARY_CASES = {
    "default": {},
    "linear": dict(rope_type="linear", scaling_factor=2.0),
    "ntk": dict(rope_type="ntk", scaling_factor=2.0),
    "dynamic": DYNAMIC,
    "yarn": dict(
        rope_type="yarn", scaling_factor=2.0, original_max_position_embeddings=8
    ),
    "llama3": dict(
        rope_type="llama3", scaling_factor=2.0, original_max_position_embeddings=8
    ),
    "longrope": LONGROPE,
}


#: Every scaling with RoPE; xPos (its scales multiply cos and sin, whatever
#: the frequencies) with one fixed and one length-dependent scaling. Split
#: between the passes (the same TensorFlow ops in both), each with a fixed
#: and a length-dependent table.
ROTARY_EXPORTS = split_between_passes(
    [("rope", case) for case in sorted(ROTARY_CASES)]
    + [("xpos", "default"), ("xpos", "dynamic")],
    keras2=[("rope", case) for case in ("dynamic", "linear", "longrope", "yarn")],
)
#: The scalings whose decode step is converted and run in LiteRT: one of
#: each way the step's table is built (fixed frequencies, a length-dependent
#: table, an attention factor, per-frequency factors that switch with the
#: length). `linear`, `ntk` and `llama3` only change the fixed frequency
#: vector, which the step folds exactly as `default`'s (same function), so
#: they decode cached and recomputed in Keras only.
CONVERTED_CASES = ("default", "dynamic", "yarn", "longrope")


@pytest.mark.slow
@pytest.mark.parametrize("position, case", ROTARY_EXPORTS)
def test_every_rotary_scaling_decodes_alike_cached_recomputed_and_in_litert(
    position, case
):
    model = lm(position, max_length=32, position_options=ROTARY_CASES[case])
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [5, 9]]  # across the training length
    cached = model.generate(prompts, 5)
    if not model.reads_current_length:  # (refused for it: see CausalLM)
        recomputed = model.generate(prompts, 5, use_cache=False)
        np.testing.assert_array_equal(recomputed, cached)
    if case not in CONVERTED_CASES:
        return
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    np.testing.assert_array_equal(generate_tflite(model_bytes, prompts, 5), cached)


def test_an_xpos_cache_past_its_float32_range_is_refused():
    import math

    model = lm("xpos", position_options={"xpos_scale_base": 1.0})
    limit = int(80 / math.log(1.4 / 0.4))  # e^80 at the steepest slot
    with pytest.raises(ValueError, match=f"max_length` must be at most {limit}"):
        convert_causal_lm(model, calibration(), mode="float32", max_length=limit + 1)


@pytest.mark.parametrize(
    "position", split_between_passes(["alibi", "t5", "dynamic_bias"], ["alibi"])
)
def test_a_relative_bias_is_stored_as_its_distinct_distances(position):
    """O(S): `(1, N, 2S - 1)` distances, no `(S, S)` table, same tokens."""
    from ai_edge_litert.interpreter import Interpreter

    model = lm(position, max_length=32)
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=32)
    shapes = [
        tuple(t["shape"])
        for t in Interpreter(model_content=model_bytes).get_tensor_details()
    ]
    assert not [s for s in shapes if s[-2:] == (32, 32)]
    assert (1, 2, 63) in shapes  # the two heads' distances -31 .. 31
    np.testing.assert_array_equal(
        generate_tflite(model_bytes, PROMPTS, 9), model.generate(PROMPTS, 9)
    )


@pytest.mark.parametrize("position", ["alibi", "rope"])
def test_grouped_query_lms_export_with_a_cache_of_their_key_heads(position):
    """`num_key_value_heads=1`: float32 LiteRT generates Keras' tokens, and
    the int8 TFLM step's key and value caches are 1/4 of multi-head's (4
    query heads), each its own int8 tensor, and it decodes as int8 LiteRT."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")

    def four_heads(**options):
        tf.keras.utils.set_random_seed(5)
        return build_causal_lm(
            VOCAB,
            hidden_dim=16,
            num_layers=2,
            num_heads=4,
            position=position,
            **options,
        )

    model = four_heads(num_key_value_heads=1)
    model_bytes = convert_causal_lm(model, calibration(), mode="float32", max_length=16)
    np.testing.assert_array_equal(
        generate_tflite(model_bytes, PROMPTS, 9), model.generate(PROMPTS, 9)
    )
    grouped = device_contract(
        convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    )
    multi = device_contract(
        convert_causal_lm(four_heads(), calibration(), max_length=16, target="tflm")
    )
    assert [grouped.input_port(c).shape for c in grouped.caches] == [(1, 1, 16, 4)] * 4
    assert grouped.cache_bytes * 4 == multi.cache_bytes
    tflm_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    assert_tflm_decodes_as_litert(tflm_bytes)


@pytest.mark.parametrize("target", ["tflm", "litert"])
def test_int4_kernels_are_the_int8_kernels_on_a_4_bit_grid(target):
    """Every kernel INT4, two a byte (low nibble first), within half a 4-bit
    step of the int8 kernel's values, per channel in LiteRT and per tensor in
    TFLM (whose FULLY_CONNECTED refuses per-channel INT4); the biases keep
    their values; TFLM runs the step and decodes as LiteRT."""
    model = lm("alibi")
    int8 = convert_causal_lm(model, calibration(), max_length=16, target=target)
    int4 = convert_causal_lm(
        model, calibration(), mode="int4", max_length=16, target=target
    )
    before, after = fully_connected_kernels(int8), fully_connected_kernels(int4)
    assert len(before) == len(after) > 0
    for (k8, w8, b8, bias8, _), (k4, w4, b4, bias4, x4) in zip(before, after):
        assert k8.type == 9 and k4.type == 17  # INT8, INT4
        rows = k8.shape[0]
        real = w8.view(np.int8).reshape(rows, -1) * np.asarray(k8.quantization.scale)[
            :, None
        ].astype(np.float64)
        nibbles = np.stack([w4 & 0x0F, w4 >> 4], 1).reshape(-1)[: real.size]
        values = np.where(nibbles > 7, nibbles.astype(int) - 16, nibbles)
        scales = np.asarray(k4.quantization.scale, np.float64)
        assert len(scales) == (1 if target == "tflm" else rows) or rows == 1
        step = np.broadcast_to(scales, (rows,))[:, None]
        assert np.abs(values).max() <= 7
        error = np.abs(values.reshape(rows, -1) * step - real)
        assert (error <= step / 2 + 1e-6).all()
        if b8 is not None:  # real bias = int32 x (input scale x kernel scale)
            old_bias = bias8 * np.asarray(b8.quantization.scale, np.float64)
            new_bias = bias4 * np.asarray(b4.quantization.scale, np.float64)
            np.testing.assert_allclose(new_bias, old_bias, atol=float(step.max()) * x4)
    if target == "tflm":
        pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
        kernel_bytes = sum(len(w8) for _, w8, *_ in before)
        assert len(int8) - len(int4) >= 0.45 * kernel_bytes  # half of each kernel
        assert_tflm_decodes_as_litert(int4)


@pytest.mark.parametrize("position", ["alibi", "hybrid"])
def test_a_calibrated_int8_step_writes_its_caches_in_int8(position):
    """The converter writes a calibrated cache in float (DEQUANTIZE, float
    DYNAMIC_UPDATE_SLICE, QUANTIZE: 4 float bytes of arena per cached value);
    the export rewires each write to int8, requantizing what is on another
    range, and drops the float tensors: no float tensor is left, and the
    step decodes as before."""
    from tensorflow.lite.tools import flatbuffer_utils

    from tflite_export import causal_lm

    model = lm(position)
    model_bytes = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    parsed = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_bytes))
    graph = parsed.subgraphs[0]
    names = {
        flatbuffer_utils.opcode_to_name(parsed, op.opcodeIndex)
        for op in graph.operators
    }
    assert "DEQUANTIZE" not in names
    floats = [t for t in graph.tensors if t.type == 0]  # hybrid: a 3-value mask
    assert all(np.prod(t.shape) < 16 for t in floats), [t.name for t in floats]
    with pytest.MonkeyPatch.context() as patch:  # the converter's own writes
        patch.setattr(causal_lm, "integer_update_slices", lambda b, **o: b)
        floating = convert_causal_lm(model, calibration(), max_length=16, target="tflm")
    assert "DEQUANTIZE" in operator_names(floating)
    text = calibration()[:2]
    rewired = tflite_export.verify_causal_lm(model_bytes, model, text)
    island = tflite_export.verify_causal_lm(floating, model, text)
    assert rewired.arena_bytes < island.arena_bytes
    assert rewired.bits_per_token_litert == pytest.approx(
        island.bits_per_token_litert, abs=0.02
    )


@pytest.mark.parametrize(
    "position", split_between_passes(["alibi", "kerple", "t5"], ["alibi"])
)
def test_an_int8_steps_first_positions_do_not_depend_on_its_cache_length(position):
    """The slots after a step's position are masked, whatever the cache
    length: their bias no longer widens the int8 ranges (ALiBi's
    `-slope |j - i|` once gave the empty slots of a long cache its most
    negative values), so a calibrated step of a bias stored as distances
    reads its first positions alike with 16 slots and with 64 (before, the
    longer step lost resolution). FIRE's `(S, S)` table is one int8
    constant whose range the longer distances still widen."""
    model = lm(position, max_length=64)
    text = calibration()[:2]
    bits = [
        tflite_export.verify_causal_lm(
            convert_causal_lm(model, calibration(), max_length=length), model, text
        ).bits_per_token_litert
        for length in (16, 64)
    ]
    assert bits[0] == pytest.approx(bits[1], abs=1e-6)
