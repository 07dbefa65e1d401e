"""The device contract of an LM export: layout, names, table, C header, the loop."""

import dataclasses
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.models import build_causal_lm
from tflite_export import convert_causal_lm, device_contract, generate_tflite
from tflite_export.tensor_names import name_tensors

pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")

VOCAB = 19


@pytest.fixture(scope="module")
def exports():
    """A small int8 LM exported for both targets, and the converter's own bytes."""
    from tflite_export import causal_lm

    tf.keras.utils.set_random_seed(3)
    model = build_causal_lm(
        VOCAB, hidden_dim=16, num_layers=2, num_heads=2, position="hybrid"
    )
    ids = np.random.default_rng(0).integers(1, VOCAB, (4, 12))
    found = {
        target: convert_causal_lm(model, ids, max_length=16, target=target)
        for target in ("tflm", "litert")
    }
    with pytest.MonkeyPatch.context() as patch:  # the layout step skipped
        patch.setattr(causal_lm, "name_tensors", lambda model_bytes: model_bytes)
        patch.setattr(causal_lm, "_check_types", lambda *args: None)
        found["raw"] = convert_causal_lm(model, ids, max_length=16, target="litert")
    return found


def litert_details(model_bytes):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=model_bytes).get_signature_runner("decode")
    return runner.get_input_details(), runner.get_output_details()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tflm", "litert"])
def test_the_step_lists_token_index_caches_in_and_logits_caches_out(exports, target):
    from ai_edge_litert.interpreter import Interpreter

    model_bytes = exports[target]
    contract = device_contract(model_bytes)
    # hybrid: keys and values apart for each attention, the second layer's
    # convolution state before its attention
    caches = [f"cache_{i}" for i in range(5)]
    assert [p.name for p in contract.inputs] == ["token", "index", *caches]
    assert [p.name for p in contract.outputs] == ["logits", *caches]
    assert [p.index for p in contract.inputs] == list(range(7))
    assert [len(p.shape) for p in contract.inputs[2:]] == [4, 4, 3, 4, 4]
    # The subgraph's own lists, read by another reader, name the same tensors.
    interpreter = Interpreter(model_content=model_bytes)
    if target == "tflm":  # one subgraph: the interpreter's lists are the step's
        listed = [d["name"] for d in interpreter.get_input_details()]
        assert listed == ["token", "index", *caches]
        listed = [d["name"] for d in interpreter.get_output_details()]
        assert listed == ["logits", *caches]
    inputs, outputs = litert_details(model_bytes)
    for ports, details in ((contract.inputs, inputs), (contract.outputs, outputs)):
        for port in ports:
            detail = details[port.name]
            assert port.tensor == detail["index"]
            assert port.shape == tuple(detail["shape"])
            assert np.dtype(port.dtype) == np.dtype(detail["dtype"])
            assert port.scale == pytest.approx(detail["quantization"][0], rel=1e-7)
            assert port.zero_point == detail["quantization"][1]
    assert contract.cache_length == 16 and contract.vocab_size == VOCAB
    assert [(f.output, f.input) for f in contract.feeds] == [
        (i, i + 1) for i in range(1, 6)
    ]
    for feed in contract.feeds:  # a byte copy exactly where requantizing is one
        out, into = contract.outputs[feed.output], contract.inputs[feed.input]
        raw = np.arange(-128, 128)
        requantized = into.quantize(out.dequantize(raw))
        assert feed.copy == (requantized == raw).all(), (out, into)


@pytest.mark.slow
def test_naming_and_ordering_changes_nothing_the_model_computes(exports):
    """The in-place edit moves no buffer: same size, same outputs, new names."""
    from ai_edge_litert.interpreter import Interpreter

    raw, named = exports["raw"], exports["litert"]
    assert name_tensors(raw) == named and name_tensors(named) == named
    assert len(raw) == len(named)
    changed = np.flatnonzero(
        np.frombuffer(raw, np.uint8) != np.frombuffer(named, np.uint8)
    )
    assert 0 < len(changed) < 400  # names and the two lists, nothing else
    before = Interpreter(model_content=raw)
    assert any("PartitionedCall" in d["name"] for d in before.get_output_details())
    rng = np.random.default_rng(1)
    inputs, _ = litert_details(named)
    feeds = {}
    for name, detail in inputs.items():
        low, high = (0, VOCAB) if name == "token" else (0, 16)
        if name.startswith("cache_"):
            low, high = -128, 128
        feeds[name] = rng.integers(low, high, detail["shape"]).astype(detail["dtype"])
    tokens = rng.integers(0, VOCAB, (1, 16)).astype(np.int32)
    results = []
    for model_bytes in (raw, named):
        interpreter = Interpreter(model_content=model_bytes)
        decode = interpreter.get_signature_runner("decode")(**feeds)
        prefill = interpreter.get_signature_runner("prefill")(tokens=tokens)
        results.append((decode, prefill))
    for got, want in zip(results[1], results[0]):
        assert set(got) == set(want) == {"logits", *(f"cache_{i}" for i in range(5))}
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def feed_cache(contract, feed, raw):
    """The header's `feed_cache` in NumPy: a copy, or requantized as the float32
    loop did (the header's table holds these bytes)."""
    if feed.copy:
        return raw.copy()
    out, into = contract.outputs[feed.output], contract.inputs[feed.input]
    real = (raw.astype(np.float32) - out.zero_point) * np.float32(out.scale)
    moved = np.rint(real / np.float32(into.scale)) + into.zero_point
    return np.clip(moved, -128, 127).astype(np.int8)


def firmware_loop(model_bytes, prompt, new_tokens, steps=None):
    """The C++ loop of `docs/lm_on_device.md`, in Python, on raw TFLM tensors.

    Only the contract is read: positions, zero points, byte copies or
    requantizing. The logits stay raw (argmax of the int8 values). With a
    list `steps`, each step's raw inputs and outputs, in the subgraph's
    order, are appended to it as bytes.
    """
    from tflite_micro.python.tflite_micro import runtime

    contract = device_contract(model_bytes)
    micro = runtime.Interpreter.from_bytes(model_bytes, arena_size=4 << 20)
    state = {
        feed.input: np.full(
            contract.inputs[feed.input].shape,
            contract.inputs[feed.input].zero_point,
            np.int8,
        )
        for feed in contract.feeds
    }
    token_slot = contract.input_port("token").index
    index_slot = contract.input_port("index").index
    logits_slot = contract.output_port("logits").index
    tokens = list(prompt)
    for t in range(len(prompt) + new_tokens - 1):
        inputs = {
            token_slot: np.array([[tokens[t]]], np.int32),
            index_slot: np.array(t, np.int32),
            **state,
        }
        for slot, value in inputs.items():
            micro.set_input(value, slot)
        micro.invoke()
        outputs = [np.array(micro.get_output(p.index)) for p in contract.outputs]
        if steps is not None:
            ordered = [inputs[p.index] for p in contract.inputs] + outputs
            steps.append(b"".join(value.tobytes() for value in ordered))
        for feed in contract.feeds:
            state[feed.input] = feed_cache(contract, feed, outputs[feed.output])
        if t >= len(prompt) - 1:
            tokens.append(int(np.argmax(outputs[logits_slot][0, -1])))
    return tokens


@pytest.mark.slow
def test_a_firmware_loop_from_the_contract_alone_generates_what_generate_tflite_does(
    exports,
):
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    prompt = [4, 7, 1]
    expected = generate_tflite(exports["tflm"], [prompt], 10, runtime="tflm")
    assert firmware_loop(exports["tflm"], prompt, 10) == expected[0].tolist()


PRINT_HEADER = r"""
#include <cstdio>
#include "step.h"

int main() {
  std::printf("%d %d %d %d %d\n", LM_CACHE_LENGTH, LM_VOCAB_SIZE, LM_NUM_INPUTS,
              LM_NUM_OUTPUTS, LM_NUM_CACHES);
  std::printf("%d %d %d\n", LM_INPUT_TOKEN, LM_INPUT_INDEX, LM_OUTPUT_LOGITS);
  for (const lm_port& p : lm_inputs) {
    std::printf("in %d %s %s %.9g %d %d", p.index, p.name, p.dtype, p.scale,
                p.zero_point, p.bytes);
    for (int d = 0; d < p.rank; ++d) std::printf(" %d", p.shape[d]);
    std::printf("\n");
  }
  for (const lm_port& p : lm_outputs) {
    std::printf("out %d %s %s %.9g %d %d", p.index, p.name, p.dtype, p.scale,
                p.zero_point, p.bytes);
    for (int d = 0; d < p.rank; ++d) std::printf(" %d", p.shape[d]);
    std::printf("\n");
  }
  for (const lm_feed& f : lm_feeds) {
    std::printf("feed %d %d %d %d\n", f.output, f.input, f.bytes, f.copy);
  }
  return 0;
}
"""


@pytest.mark.slow
def test_the_c_header_compiles_and_holds_the_contract(exports, tmp_path):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++)")
    contract = device_contract(exports["tflm"])
    (tmp_path / "step.h").write_text(contract.c_header("lm", arena_bytes=4096))
    (tmp_path / "main.cc").write_text(PRINT_HEADER)
    program = tmp_path / "print_contract"
    command = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "main.cc"]
    subprocess.run(command + ["-o", str(program)], cwd=tmp_path, check=True)
    lines = subprocess.run(
        [str(program)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines[0].split() == ["16", str(VOCAB), "7", "6", "5"]
    assert lines[1].split() == ["0", "1", "0"]
    printed = [line.split() for line in lines[2:]]
    ports = [("in", p) for p in contract.inputs] + [
        ("out", p) for p in contract.outputs
    ]
    for row, (kind, port) in zip(printed, ports):
        assert row[:4] == [kind, str(port.index), port.name, port.dtype]
        assert np.float32(row[4]) == np.float32(port.scale)  # the same float32
        assert [int(v) for v in row[5:]] == [
            port.zero_point,
            port.bytes,
            *port.shape,
        ]
    feeds = [row for row in printed if row[0] == "feed"]
    assert feeds == [
        [
            "feed",
            str(f.output),
            str(f.input),
            str(contract.inputs[f.input].bytes),
            str(int(f.copy)),
        ]
        for f in contract.feeds
    ]
    assert "#define LM_ARENA_BYTES 4096" in contract.c_header("lm", arena_bytes=4096)
    # The same header is valid C for C firmware.
    c_compiler = shutil.which("gcc") or shutil.which("cc")
    if c_compiler is not None:
        (tmp_path / "main.c").write_text(
            '#include "step.h"\nint main(void) {\n'
            "  return lm_inputs[0].index + lm_feeds[0]"
            ".copy - 1 + lm_outputs[0].index;\n}\n"
        )
        subprocess.run(
            [
                c_compiler,
                "-std=c99",
                "-Wall",
                "-Werror",
                "main.c",
                "-o",
                "c_main",
                "-lm",
            ],
            cwd=tmp_path,
            check=True,
        )
        assert subprocess.run([str(tmp_path / "c_main")]).returncode == 0


@pytest.mark.slow
def test_the_table_lists_every_tensor_and_the_protocol(exports):
    contract = device_contract(exports["tflm"])
    table = contract.table()
    for port in contract.inputs:
        assert f"| input | {port.index} | {port.name} | {list(port.shape)} |" in table
    for port in contract.outputs:
        assert f"| output | {port.index} | {port.name} |" in table
    assert "copy the bytes of output 1 (cache 2); copy the bytes of output 2" in table
    for feed in contract.feeds:
        verb = "copy the bytes of" if feed.copy else "requantize"
        assert f"{verb} output {feed.output} (cache {feed.input})" in table
    assert f"({contract.cache_bytes} bytes)" in table
    assert f"cache length {contract.cache_length}" in table
    assert "X(AddFullyConnected)" in contract.c_header(arena_bytes=1)
    assert set(contract.ops) >= {"FULLY_CONNECTED", "GATHER"}


@pytest.mark.slow
def test_the_contract_command_prints_the_table_and_writes_the_header(
    exports, tmp_path, capsys
):
    """The module runs as a command once; its refusals run in this process
    (`main`, the command's body: each start of a Python with TensorFlow
    costs seconds)."""
    from tflite_export import contract

    model = tmp_path / "lm.tflite"
    model.write_bytes(exports["tflm"])
    header = tmp_path / "lm_decode.h"
    command = [sys.executable, "-m", "tflite_export.contract", str(model)]
    run = subprocess.run(
        command + ["--header", str(header), "--name", "lm"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert device_contract(exports["tflm"]).table() in run.stdout
    assert header.read_text() == device_contract(exports["tflm"]).c_header("lm")
    written = header.read_text()
    assert contract.main([str(model), "--header", str(header)]) == 2
    assert "exists" in capsys.readouterr().err
    assert header.read_text() == written
    assert contract.main([str(model), "--header", str(model), "--force"]) == 2
    assert "is the model" in capsys.readouterr().err
    assert model.read_bytes() == exports["tflm"]


def dense_bytes():
    inputs = tf.keras.Input((4,), batch_size=1)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def test_bytes_that_are_not_an_lm_export_are_refused():
    with pytest.raises(TypeError, match="`model_bytes` must be bytes"):
        device_contract("model.tflite")
    with pytest.raises(ValueError, match="identifier TFL3"):
        device_contract(b"\x00" * 32)
    with pytest.raises(ValueError, match="a decode signature"):
        device_contract(dense_bytes())


@pytest.mark.slow
def test_a_header_name_must_be_a_c_identifier(exports):
    contract = device_contract(exports["tflm"])
    with pytest.raises(ValueError, match="`name` must be a C identifier"):
        contract.c_header("2lm")


def with_a_requantized_feed(contract):
    """`contract` with its last cache input at another scale and zero point.

    Whether the converter gives a cache's input and output one range depends
    on the weights (Keras 2 initializes differently); this makes sure both
    kinds of feed are tested.
    """
    last = contract.feeds[-1]
    port = contract.inputs[last.input]
    moved = dataclasses.replace(
        port, scale=port.scale * 1.03, zero_point=port.zero_point + 2
    )
    inputs = (
        contract.inputs[: last.input] + (moved,) + contract.inputs[last.input + 1 :]
    )
    feeds = contract.feeds[:-1] + (dataclasses.replace(last, copy=False),)
    return dataclasses.replace(contract, inputs=inputs, feeds=feeds)


FEED_CACHES = r"""
#include <cstdio>
#include "step.h"

// Reads every output cache's raw bytes, writes what each input receives.
int main() {
  static int8_t from[1 << 16], to[1 << 16];
  for (const lm_feed& feed : lm_feeds) {
    if (std::fread(from, 1, feed.bytes, stdin) != (size_t)feed.bytes) return 1;
    lm_feed_cache(&feed, from, to);
    std::fwrite(to, 1, feed.bytes, stdout);
  }
  int8_t logits[LM_VOCAB_SIZE];
  if (std::fread(logits, 1, LM_VOCAB_SIZE, stdin) != LM_VOCAB_SIZE) return 1;
  std::printf("%d", lm_argmax(logits));
  return 0;
}
"""


@pytest.mark.slow
def test_the_headers_cache_feed_and_argmax_match_the_python_runner(exports, tmp_path):
    """Every int8 value through each feed: the C helpers, the NumPy mirror and
    the runner's dequantize-then-quantize give the same bytes."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++)")
    contract = with_a_requantized_feed(device_contract(exports["tflm"]))
    header = contract.c_header("lm", arena_bytes=4096)
    assert "lrintf" not in header and "float real" not in header  # integer only
    (tmp_path / "step.h").write_text(header)
    (tmp_path / "main.cc").write_text(FEED_CACHES)
    command = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "main.cc"]
    subprocess.run(command + ["-o", "feed"], cwd=tmp_path, check=True)
    rng = np.random.default_rng(0)
    raws = []
    for feed in contract.feeds:
        every = np.arange(-128, 128, dtype=np.int8)
        raws.append(
            np.resize(rng.permutation(every), contract.inputs[feed.input].bytes)
        )
    logits = rng.integers(-128, 128, VOCAB).astype(np.int8)
    logits[[3, 11]] = 127  # ties: the first one wins, as np.argmax
    stdin = b"".join(raw.tobytes() for raw in raws) + logits.tobytes()
    run = subprocess.run(
        [str(tmp_path / "feed")], input=stdin, capture_output=True, check=True
    )
    start = 0
    for feed, raw in zip(contract.feeds, raws):
        got = np.frombuffer(run.stdout[start : start + len(raw)], np.int8)
        start += len(raw)
        np.testing.assert_array_equal(got, feed_cache(contract, feed, raw))
        out, into = contract.outputs[feed.output], contract.inputs[feed.input]
        np.testing.assert_array_equal(got, into.quantize(out.dequantize(raw)))
    assert int(run.stdout[start:]) == 3 == int(np.argmax(logits))


ARGMAX = r"""
#include <cstdio>
#include "step.h"

// Reads the logits output's raw bytes, prints the header's greedy token.
int main() {
  static unsigned char raw[LM_VOCAB_SIZE * 4];
  size_t size = std::fread(raw, 1, sizeof(raw), stdin);
  if (size == 0) return 1;
  std::printf("%d", lm_argmax(raw));
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_the_headers_argmax_reads_the_logits_in_their_own_dtype(mode, tmp_path):
    """A float32 step's argmax reads floats (it read their bytes as int8)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++)")
    tf.keras.utils.set_random_seed(3)
    model = build_causal_lm(VOCAB, hidden_dim=16, num_layers=1, num_heads=2)
    ids = np.random.default_rng(0).integers(1, VOCAB, (4, 12))
    model_bytes = convert_causal_lm(model, ids, mode, max_length=16, target="tflm")
    contract = device_contract(model_bytes)
    dtype = contract.output_port("logits").dtype
    assert dtype == mode
    (tmp_path / "step.h").write_text(contract.c_header("lm", arena_bytes=4096))
    (tmp_path / "main.cc").write_text(ARGMAX)
    command = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "main.cc"]
    subprocess.run(command + ["-o", "argmax"], cwd=tmp_path, check=True)
    logits = np.linspace(-1.0, 0.5, VOCAB)[::-1].copy()  # largest first
    logits[7] = 0.9 if mode == "float32" else 1.0
    raw = (logits * (100 if mode == "int8" else 1)).astype(dtype)
    run = subprocess.run(
        [str(tmp_path / "argmax")], input=raw.tobytes(), capture_output=True, check=True
    )
    assert int(run.stdout) == 7 == int(np.argmax(raw))
