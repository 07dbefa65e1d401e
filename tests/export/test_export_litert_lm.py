"""`.litertlm` bundles: the engine's signatures, refusals, the emulator, the engine."""

import json

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import split_between_passes

from keras_posenc.generation import Streaming
from keras_posenc.models import build_causal_lm
from keras_posenc.models.methods import METHODS
from tflite_export import ExportError
from tflite_export.litert_lm import (
    byte_tokenizer,
    cache_names,
    convert_litert_lm,
    engine_model,
    litert_lm_blocker,
    prefill_plan,
)

VOCAB = 258  # 256 bytes, <bos> 256, <eos> 257
BOS, EOS = 256, 257
PROMPTS = ["abc", "the quick brown fox jumps", "x"]
REFUSED = {"hybrid": "convolution inputs", "fox": "gate sums"}


def ascii_lm(position, **options):
    """A seeded random LM whose argmax is a lower-case letter or a space:
    varied text that decodes as ASCII (the engine returns text)."""
    tf.keras.utils.set_random_seed(1)
    model = build_causal_lm(
        VOCAB,
        hidden_dim=32,
        num_layers=2,
        num_heads=2,
        position=position,
        **builder_kwargs(**options),
    )
    bias = np.full(VOCAB, -30.0, np.float32)
    bias[97:123] = bias[32] = 0.0
    model._parts.head.bias.assign(bias)
    return model


def pydoc_lm():
    """A byte-level `rope` LM trained briefly on the pydoc text (its argmax
    is confident: int8 rounding flips few tokens), and windows of the text."""
    from keras_posenc.data.language_modeling import pydoc_bytes

    tf.keras.utils.set_random_seed(1)
    model = build_causal_lm(
        VOCAB, hidden_dim=32, num_layers=2, num_heads=2, position="rope"
    )
    text, _ = pydoc_bytes()
    windows = text[: 3000 * 33].reshape(3000, 33)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(3e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(windows[:, :-1], windows[:, 1:], batch_size=32, verbose=0)
    return model, windows[:8]


def keras_greedy(model, text, count):
    ids = [BOS, *text.encode()]
    return list(model.generate([ids], max_new_tokens=count)[0][len(ids) :])


def test_the_engines_prefill_split_matches_its_rule():
    """The longest signature while the rest fills it, then the shortest that
    holds the rest; every token once."""
    assert prefill_plan((4, 8), 3) == [(4, 3)]
    assert prefill_plan((4, 8), 4) == [(4, 4)]
    assert prefill_plan((4, 8), 5) == [(8, 5)]
    assert prefill_plan((8, 4), 25) == [(8, 8)] * 3 + [(4, 1)]
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = tuple(sorted(set(rng.integers(1, 40, 3).tolist())))
        total = int(rng.integers(1, 300))
        plan = prefill_plan(lengths, total)
        assert sum(count for _, count in plan) == total
        assert all(count <= size and size in lengths for size, count in plan)
        assert all(count == size for size, count in plan[:-1])


def test_the_byte_tokenizer_maps_byte_b_to_id_b():
    document = json.loads(byte_tokenizer(VOCAB, BOS, (EOS,)))
    vocab = document["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(VOCAB))
    assert document["model"]["merges"] == []
    assert vocab["<bos>"] == BOS and vocab["<eos>"] == EOS
    assert vocab["a"] == 97 and vocab["Ġ"] == 32  # GPT-2's byte characters
    assert [t["id"] for t in document["added_tokens"]] == [BOS, EOS]
    tokenizers = pytest.importorskip("tokenizers", reason="needs tokenizers (HF)")
    tokenizer = tokenizers.Tokenizer.from_str(byte_tokenizer(VOCAB, BOS, (EOS,)))
    text = "héllo, wörld\n\t!"
    assert tokenizer.encode(text).ids == list(text.encode())
    assert tokenizer.decode(list(text.encode())) == text


def test_the_caches_are_keys_and_values_heads_first():
    model = ascii_lm("t5")
    assert model.cache_kinds() == ["keys", "values"] * 2
    assert cache_names(model) == [
        "kv_cache_k_0",
        "kv_cache_v_0",
        "kv_cache_k_1",
        "kv_cache_v_1",
    ]
    assert model.cache_shapes(1, 24) == [(1, 2, 24, 16)] * 4


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"model": "not a model"}, TypeError, "must be a CausalLM"),
        ({"mode": "int8"}, ExportError, "sampler reads float32 or float16"),
        ({"mode": "int16"}, ValueError, "`mode` must be one of"),
        ({"streaming": Streaming(8, 2)}, ExportError, "owns the positions"),
        ({"path": "model.tflite"}, ValueError, "ending in '.litertlm'"),
        ({"prefill_lengths": ()}, ValueError, "prefill_lengths"),
        ({"prefill_lengths": (4, 4)}, ValueError, "distinct"),
        ({"prefill_lengths": 8}, ValueError, "prefill_lengths"),
        ({"start_token": VOCAB}, ValueError, "start_token"),
        ({"stop_tokens": (1.5,)}, TypeError, "stop_tokens"),
        ({"max_num_tokens": 0}, ValueError, "max_num_tokens"),
        ({"tokenizer": "vocab.txt"}, ValueError, "tokenizer"),
        ({"tokenizer": "missing.json"}, ValueError, "existing tokenizer.json"),
        ({"mode": "int8_float_io"}, ExportError, "needs `calibration_ids`"),
        ({"calibration_ids": np.ones((2, 9), int)}, ValueError, "int8_float_io' only"),
        ({"stop_tokens": None}, TypeError, "`stop_tokens` must be an int or a seq"),
        (
            {"start_token": EOS, "stop_tokens": (EOS,)},
            ValueError,
            "`start_token` must be an id that is not also a stop token",
        ),
        ({"tokenizer": [1, 2, 3]}, ValueError, "`tokenizer` must be .*bytes"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(tmp_path, change, error, match):
    arguments = {"model": ascii_lm("alibi"), "path": str(tmp_path / "m.litertlm")}
    arguments.update(change)
    if not str(arguments["path"]).startswith(str(tmp_path)):
        arguments["path"] = str(tmp_path / arguments["path"])
    with pytest.raises(error, match=match):
        convert_litert_lm(**arguments)
    assert list(tmp_path.iterdir()) == []


def test_a_json_that_is_no_tokenizer_is_refused(tmp_path):
    """A JSON list is valid JSON: the engine aborted on loading its bundle."""
    source = tmp_path / "tokenizer.json"
    source.write_text("[1, 2, 3]")
    out = tmp_path / "m.litertlm"
    with pytest.raises(ValueError, match="`tokenizer` must be an HF tokenizer.json"):
        convert_litert_lm(ascii_lm("alibi"), out, tokenizer=source)
    assert not out.exists()


@pytest.mark.parametrize("vocab_size", [VOCAB - 2, VOCAB + 1])
def test_a_tokenizer_that_does_not_cover_the_vocabulary_is_refused(
    tmp_path, vocab_size
):
    """Every id the model reads or writes has a token, and no token another id."""
    source = tmp_path / "tokenizer.json"
    source.write_text(byte_tokenizer(vocab_size))
    out = tmp_path / "m.litertlm"
    match = f"ids are the model's 0 .. {VOCAB - 1}"
    with pytest.raises(ValueError, match=match):
        convert_litert_lm(ascii_lm("alibi"), out, tokenizer=source)
    assert not out.exists()


def test_prefills_longer_than_a_learned_models_context_are_refused(tmp_path):
    """The error names what the user passed, not a derived `max_num_tokens`."""
    model = ascii_lm("learned", max_length=32)
    out = tmp_path / "m.litertlm"
    with pytest.raises(ValueError, match="`prefill_lengths` must be at most .*=32"):
        convert_litert_lm(model, out, prefill_lengths=(16, 64))
    assert not out.exists()


def test_dynamic_int8_refuses_kernels_the_converter_leaves_float(tmp_path):
    """Dynamic-range quantization skips kernels under 1024 values: refused by
    name before converting (hidden_dim=16: 16 x 16 projections)."""
    tf.keras.utils.set_random_seed(1)
    model = build_causal_lm(VOCAB, hidden_dim=16, num_heads=2, position="fire")
    out = tmp_path / "m.litertlm"
    match = r"1024 values or more only.*ffn_hidden_0 \(16, 32\)"
    with pytest.raises(ExportError, match=match):
        convert_litert_lm(model, out, mode="dynamic_int8")
    assert not out.exists()


@pytest.mark.parametrize("position", sorted(REFUSED))
def test_methods_whose_cache_is_not_keys_and_values_are_refused(tmp_path, position):
    model = ascii_lm(position)
    assert REFUSED[position] in litert_lm_blocker(model)
    with pytest.raises(ExportError, match=f"position='{position}'.*not keys and"):
        convert_litert_lm(model, tmp_path / "m.litertlm")
    assert list(tmp_path.iterdir()) == []


#: Rotary scalings of the HF table (`keras_posenc.ops.rotary.ROPE_TYPES`).
SCALED = dict(scaling_factor=2.0, original_max_position_embeddings=8)
ROTARY = {
    "linear": dict(rope_type="linear", scaling_factor=2.0),
    "yarn": dict(rope_type="yarn", **SCALED),
    "llama3": dict(rope_type="llama3", **SCALED),
    "dynamic": dict(rope_type="dynamic", **SCALED),
    "longrope": dict(
        rope_type="longrope",
        rope_parameters={"short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        **SCALED,
    ),
}


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_a_rotary_type_reading_the_length_is_refused(tmp_path, rope_type):
    model = ascii_lm("rope", position_options=ROTARY[rope_type])
    with pytest.raises(ExportError, match="read the current length"):
        convert_litert_lm(model, tmp_path / "m.litertlm")
    assert list(tmp_path.iterdir()) == []


def test_a_learned_table_must_hold_the_padded_context(tmp_path):
    model = ascii_lm("learned", position_options={"max_length": 32})
    with pytest.raises(ValueError, match=r"max_num_tokens \+ max\(prefill_lengths\)"):
        convert_litert_lm(model, tmp_path / "m.litertlm", max_num_tokens=30)


def test_an_existing_file_is_kept_unless_forced(tmp_path):
    target = tmp_path / "m.litertlm"
    target.write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        convert_litert_lm(ascii_lm("alibi"), target)
    assert target.read_bytes() == b"keep"


EXPORTED = split_between_passes(
    sorted(set(METHODS) - set(REFUSED)),
    ("t5", "rope", "hpn", "gated", "xpos", "kerple", "fire", "dynamic_bias"),
)


@pytest.mark.slow
@pytest.mark.parametrize("position", EXPORTED)
def test_the_emulated_engine_generates_keras_greedy_text(position):
    """Chunked, padded prefill from non-zero positions, the last prompt token
    through decode, caches carried: Keras' tokens for every exported method."""
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from tflite_export.litert_lm_emulator import EngineEmulator

    model = ascii_lm(position)
    emulator = EngineEmulator(engine_model(model, 48, (4, 8)))
    assert emulator.prefill_lengths == [4, 8] and emulator.cache_length == 48
    for text in PROMPTS:
        want = keras_greedy(model, text, 12)
        assert emulator.generate([BOS, *text.encode()], 12) == want, text


@pytest.mark.slow
def test_a_grouped_query_lm_runs_in_the_emulated_engine():
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from tflite_export.litert_lm_emulator import EngineEmulator

    tf.keras.utils.set_random_seed(1)
    model = build_causal_lm(
        VOCAB,
        hidden_dim=32,
        num_layers=2,
        num_heads=4,
        position="rope",
        num_key_value_heads=2,
    )
    emulator = EngineEmulator(engine_model(model, 40, (4, 8)))
    inputs = emulator.runners["decode"].get_input_details()
    assert tuple(inputs["kv_cache_k_0"]["shape"]) == (1, 2, 40, 8)
    for text in PROMPTS[:2]:
        want = keras_greedy(model, text, 10)
        assert emulator.generate([BOS, *text.encode()], 10) == want, text


@pytest.mark.slow
@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_rotary_scalings_of_fixed_frequencies_export(rope_type):
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from tflite_export.litert_lm_emulator import EngineEmulator

    model = ascii_lm("rope", position_options=ROTARY[rope_type])
    emulator = EngineEmulator(engine_model(model, 40, (4, 8)))
    for text in PROMPTS[:2]:
        want = keras_greedy(model, text, 10)
        assert emulator.generate([BOS, *text.encode()], 10) == want, text


@pytest.mark.slow
def test_a_signature_left_float_by_the_calibration_is_refused(monkeypatch):
    from tflite_export import litert_lm_model

    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    real = litert_lm_model._calibration

    def decode_only(*args):
        samples = [s for s in real(*args)() if s[0] == "decode"]
        return lambda: iter(samples)

    monkeypatch.setattr(litert_lm_model, "_calibration", decode_only)
    model = ascii_lm("alibi")
    ids = np.random.default_rng(0).integers(0, 256, (4, 12))
    with pytest.raises(ExportError, match="left signature 'prefill_4' float32"):
        engine_model(model, 24, (4,), "int8_float_io", ids)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    pytest.importorskip("litert_lm_builder", reason="needs litert-lm-builder")
    folder = tmp_path_factory.mktemp("litertlm")
    model, ids = pydoc_lm()
    paths = {}
    for mode in ("float32", "dynamic_int8", "int8_float_io"):
        paths[mode] = convert_litert_lm(
            model,
            folder / f"{mode}.litertlm",
            start_token=BOS,
            stop_tokens=(EOS,),
            max_num_tokens=64,
            prefill_lengths=(4, 8),
            mode=mode,
            calibration_ids=ids if mode == "int8_float_io" else None,
        )
    return model, paths


@pytest.mark.slow
def test_the_bundle_holds_the_engines_signatures_tokenizer_and_metadata(bundles):
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    from ai_edge_litert.interpreter import Interpreter

    from tflite_export.litert_lm_emulator import read_litert_lm

    model, paths = bundles
    contents = read_litert_lm(paths["float32"])
    interpreter = Interpreter(model_content=contents["tflite"])
    signatures = interpreter.get_signature_list()
    caches = cache_names(model)
    assert sorted(signatures) == ["decode", "prefill_4", "prefill_8"]
    assert sorted(signatures["decode"]["outputs"]) == sorted(["logits", *caches])
    assert sorted(signatures["prefill_8"]["outputs"]) == sorted(caches)
    details = interpreter.get_signature_runner("prefill_8").get_input_details()
    assert tuple(details["tokens"]["shape"]) == (1, 8)
    assert tuple(details["input_pos"]["shape"]) == (8,)
    assert tuple(details["kv_cache_k_0"]["shape"]) == (1, 2, 64 + 8, 16)
    assert contents["tokenizer"] == byte_tokenizer(VOCAB, BOS, (EOS,))
    metadata = contents["metadata"]
    assert list(metadata.start_token.token_ids.ids) == [BOS]
    assert [list(s.token_ids.ids) for s in metadata.stop_tokens] == [[EOS]]
    assert metadata.max_num_tokens == 64
    assert metadata.llm_model_type.HasField("generic_model")
    assert metadata.sampler_params.k == 1
    assert not metadata.supports_thinking and not metadata.supports_function_calling
    for mode, path in paths.items():  # the sampler reads float logits
        runner = Interpreter(model_content=read_litert_lm(path)["tflite"])
        outputs = runner.get_signature_runner("decode").get_output_details()
        assert outputs["logits"]["dtype"] == np.float32, mode
    sizes = {mode: len(read_litert_lm(path)["tflite"]) for mode, path in paths.items()}
    assert sizes["dynamic_int8"] < sizes["float32"] * 0.75, sizes
    assert sizes["int8_float_io"] < sizes["float32"] * 0.85, sizes  # shared kernels


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["float32", "dynamic_int8", "int8_float_io"])
def test_the_engine_generates_what_keras_and_the_emulator_do(bundles, mode):
    """float32 and int8 weights: the engine's greedy text is the emulator's
    (and float32's Keras'); int8 activations: mostly the emulator's (the
    engine's int8 kernels round apart from the interpreter's: near-equal
    logits of this random model flip; `--only litertlm` measures it)."""
    litert_lm = pytest.importorskip("litert_lm", reason="needs litert-lm-api")
    from tflite_export.litert_lm_emulator import EngineEmulator

    model, paths = bundles
    emulator = EngineEmulator(paths[mode])
    engine = litert_lm.Engine(str(paths[mode]), backend=litert_lm.Backend.CPU())
    assert engine.bos_token_id == BOS and engine.eos_token_ids == [[EOS]]
    assert engine.tokenize("héllo") == list("héllo".encode())
    same = total = 0
    for text in [*PROMPTS, "hello world", "position"]:
        ids = [BOS, *text.encode()]
        emulated = emulator.generate(ids, 20)
        if mode == "float32":
            assert emulated == keras_greedy(model, text, 20), text
        session = engine.create_session(
            apply_prompt_template=False,
            sampler_config=litert_lm.SamplerConfig(top_k=1),
            max_output_tokens=20,
        )
        session.run_prefill([text])
        got = session.run_decode().texts[0]
        if mode != "int8_float_io":
            assert got == bytes(emulated).decode(), (text, got)
        same += sum(a == b for a, b in zip(got.encode(), emulated))
        total += len(emulated)
    assert same / total >= 0.5, (same, total)


def test_a_mixed_precision_model_is_refused_naming_the_layer(tmp_path):
    from keras_posenc._compat import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = ascii_lm("alibi")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for mode in ("float32", "dynamic_int8"):
        with pytest.raises(ValueError, match="float32"):
            convert_litert_lm(model, tmp_path / "m.litertlm", mode=mode)
    assert list(tmp_path.iterdir()) == []
