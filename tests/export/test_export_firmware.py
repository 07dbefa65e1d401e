"""A firmware from the docs as written: the ops, the arena, the loop, its inputs."""

import math
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from ops_oracle import ROOT, assert_header_lists_the_model_ops, resolver_methods

from keras_posenc.generation import Streaming
from keras_posenc.models import build_causal_lm
from tflite_export import (
    c_array,
    convert_causal_lm,
    device_contract,
    generate_tflite,
    verify_causal_lm,
    write_c_array,
)
from tflite_export.c_array import c_header
from tflite_export.firmware import (
    TFLM_OPS,
    measure_arena,
    model_ops,
    resolver_method,
    smallest_arena,
)

pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")

VOCAB = 19
LOOP = ROOT / "examples" / "firmware" / "lm_main.cc"
REPLAY = ROOT / "tests" / "fixtures" / "tflm_replay"


def test_every_op_tflm_runs_registers_through_a_method_of_tflms_resolver():
    methods = set(resolver_methods())
    assert {resolver_method(op) for op in TFLM_OPS} <= methods
    for op, method in [
        ("BATCH_MATMUL", "AddBatchMatMul"),
        ("CONV_2D", "AddConv2D"),
        ("CUMSUM", "AddCumSum"),
        ("PADV2", "AddPadV2"),
        ("SELECT_V2", "AddSelectV2"),
        ("REDUCE_MIN", "AddReduceMin"),
        ("BATCH_TO_SPACE_ND", "AddBatchToSpaceNd"),
        ("DYNAMIC_UPDATE_SLICE", "AddDynamicUpdateSlice"),
    ]:
        assert resolver_method(op) == method


def test_every_op_of_the_table_has_a_kernel_in_the_tflm_runtime():
    """Read from the installed runtime's symbols: `Register_<OP>` kernels."""
    tflm = pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    library = os.path.join(
        os.path.dirname(tflm.__file__), "python", "tflite_micro", "_runtime.so"
    )
    with open(library, "rb") as stream:
        symbols = re.findall(
            rb"Register_([A-Z0-9_]+?)(?:_INT8|_INT16|_INT32|_FLOAT|_REF)?Ev",
            stream.read(),
        )
    assert TFLM_OPS <= {name.decode() for name in symbols}


def test_an_op_tflm_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match="TFLM has no kernel for the builtin op GELU"):
        resolver_method("GELU")


def lm(position):
    tf.keras.utils.set_random_seed(3)
    return build_causal_lm(
        VOCAB, hidden_dim=16, num_layers=2, num_heads=2, position=position
    )


def calibration():
    return np.random.default_rng(0).integers(1, VOCAB, (4, 12))


#: The issue's three exports and a streaming one (the loop's other condition).
FIRMWARES = ("alibi", "t5", "hybrid", "rope-streaming")


@pytest.fixture(scope="module")
def exports():
    found = {}
    for name in FIRMWARES:
        position = name.split("-")[0]
        streaming = Streaming(6, sink_tokens=2) if "-" in name else None
        length = None if streaming else 16
        found[name] = convert_causal_lm(
            lm(position),
            calibration(),
            max_length=length,
            target="tflm",
            streaming=streaming,
        )
    return found


def runs_in_tflm(model_bytes, arena):
    from tflite_micro.python.tflite_micro import runtime

    try:
        interpreter = runtime.Interpreter.from_bytes(model_bytes, arena_size=arena)
    except RuntimeError:
        return False
    contract = device_contract(model_bytes)
    for port in contract.inputs:
        interpreter.set_input(np.zeros(port.shape, port.dtype), port.index)
    interpreter.invoke()
    return True


@pytest.mark.slow
def test_the_header_arena_is_the_smallest_that_runs_and_above_the_reported_use(
    exports,
):
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model_bytes = exports["alibi"]
    arena = smallest_arena(model_bytes)
    assert runs_in_tflm(model_bytes, arena)
    assert not runs_in_tflm(model_bytes, arena - 1)
    header = device_contract(model_bytes).c_header("g_model")
    assert f"#define G_MODEL_ARENA_BYTES {arena}\n" in header
    # What TFLM says it used after allocating in a large arena is too small.
    script = (
        "import sys\nfrom tflite_micro.python.tflite_micro import runtime\n"
        "runtime.Interpreter.from_bytes(sys.stdin.buffer.read(), "
        "arena_size=1 << 22).print_allocations()\n"
    )
    record = subprocess.run(
        [sys.executable, "-c", script], input=model_bytes, capture_output=True
    )
    used = re.search(
        rb"Arena allocation total (\d+) bytes", record.stdout + record.stderr
    )
    assert used and int(used.group(1)) < arena


@pytest.mark.slow
def test_the_32bit_arena_is_the_hosts_less_half_of_each_recorded_pointer_struct(
    exports,
):
    """A 32-bit part's figure: the host's less what 4-byte pointers save on
    the structs TFLM records, one TfLiteEvalTensor per tensor (24 -> 12
    bytes), one node per operator (64 -> 32) and one TfLiteTensor per input
    and output (64 -> 32); both figures in both headers."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    from ai_edge_litert.interpreter import Interpreter

    model_bytes = exports["t5"]
    graph = Interpreter(model_content=model_bytes)
    tensors = len(graph.get_tensor_details())
    ports = len(graph.get_input_details()) + len(graph.get_output_details())
    operators = len(graph._get_ops_details())
    arena = measure_arena(model_bytes)
    assert arena.bytes == smallest_arena(model_bytes)
    assert arena.bytes_32bit == arena.bytes - 12 * tensors - 32 * (operators + ports)
    for header in (
        device_contract(model_bytes).c_header("g_model"),
        c_header("g_model", model_ops(model_bytes), arena),
    ):
        assert f"#define G_MODEL_ARENA_BYTES {arena.bytes}\n" in header
        assert f"#define G_MODEL_ARENA_BYTES_32BIT {arena.bytes_32bit}\n" in header
    given = c_header("g_model", model_ops(model_bytes), 5000)  # one figure given
    assert "#define G_MODEL_ARENA_BYTES_32BIT 5000\n" in given


@pytest.mark.slow
def test_every_header_lists_exactly_the_models_ops(exports, tmp_path):
    for model_bytes in exports.values():
        contract = device_contract(model_bytes)
        assert_header_lists_the_model_ops(
            model_bytes, contract.c_header("g_model", arena_bytes=1)
        )
        write_c_array(model_bytes, tmp_path / "lm.cc", force=True, arena_bytes=1)
        assert_header_lists_the_model_ops(model_bytes, (tmp_path / "lm.h").read_text())


def record_tflm(model_bytes, prompt, new_tokens, path):
    """The Python TFLM interpreter driven as the loop drives it, recorded for
    the stand-in (`tests/fixtures/tflm_replay/README.md`); returns the new ids."""
    from test_export_contract import firmware_loop

    contract = device_contract(model_bytes)
    steps = []
    tokens = firmware_loop(model_bytes, prompt, new_tokens, steps)
    ops = "".join(f"{resolver_method(op)} " for op in contract.ops).encode()
    with open(path, "wb") as stream:
        stream.write(struct.pack("<2i", smallest_arena(model_bytes), len(ops)) + ops)
        for ports in (contract.inputs, contract.outputs):
            sizes = [len(ports), *[port.bytes for port in ports]]
            stream.write(struct.pack(f"<{len(sizes)}i", *sizes))
        index = contract.input_port("index").index
        stream.write(struct.pack("<2i", index, len(steps)) + b"".join(steps))
    return tokens[len(prompt) :]


def docs_build_line(compiler, tflm):
    """The guide's host build line (`docs/lm_on_device.md`) as words, its
    TFLM checkout at `tflm` and `compiler` for g++, without the library
    (the stand-in's `replay.cc` takes its place)."""
    doc = (ROOT / "docs" / "lm_on_device.md").read_text()
    block = re.search(r"```sh\n# The host.*?```", doc, re.S).group(0)
    line = re.search(r"^g\+\+ .*?[^\\]$", block, re.S | re.M).group(0)
    words = line.replace("\\\n", " ").split()
    assert words[-2:] == ["-o", "lm"] and words[-3].endswith(".a"), words
    values = {"$TFLM": str(tflm), "$DOWNLOADS": str(tflm / "downloads")}
    for name, value in values.items():
        words = [word.replace(name, value) for word in words]
    return [compiler] + words[1:-3] + words[-2:]


def build_loop(model_bytes, folder, defines=()):
    """The docs' loop file, the CLI's three files and the stand-in, built
    with the guide's host build line (warnings as errors for our files) and
    `defines` in `folder`; the replay recorded for prompt `[4, 7, 1]`.
    Returns `(command line to run, the tokens TFLM gave)`."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++)")
    contract = device_contract(model_bytes)
    write_c_array(model_bytes, folder / "lm.cc")
    (folder / "lm_decode.h").write_text(contract.c_header("g_model"))
    shutil.copy(LOOP, folder / "lm_main.cc")
    command = docs_build_line(compiler, REPLAY) + [f"-D{d}" for d in defines]
    subprocess.run(command + [str(REPLAY / "replay.cc")], cwd=folder, check=True)
    prompt = [4, 7, 1]
    slots = contract.cache_length
    new = 2 * slots if contract.streams else slots - len(prompt)
    want = record_tflm(model_bytes, prompt, new, folder / "steps.bin")
    return ["./lm", *map(str, prompt)], want


def run_loop(command, folder):
    run = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        env={**os.environ, "LM_REPLAY": str(folder / "steps.bin")},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.splitlines()


def printed_tokens(lines):
    return [
        int(v) for line in lines if line.startswith("tokens") for v in line.split()[1:]
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", FIRMWARES)
def test_the_docs_firmware_loop_builds_against_tflms_names_and_generates_tflms_tokens(
    exports, tmp_path, name
):
    """The loop file as the docs show it, the CLI's three files, g++ -Werror;
    the stand-in refuses any step fed otherwise than the Python TFLM was."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    model_bytes = exports[name]
    command, want = build_loop(model_bytes, tmp_path)
    prompt, new = [4, 7, 1], len(want)
    assert (
        want
        == generate_tflite(model_bytes, [prompt], new, runtime="tflm")[0, 3:].tolist()
    )
    lines = run_loop(command, tmp_path)
    assert printed_tokens(lines) == want
    assert f"generated {new} tokens; a second run gave the same" in lines
    assert lines.count(f"arena {smallest_arena(model_bytes)}") == 1  # made once
    assert "more than once" not in "\n".join(lines)


@pytest.mark.slow
def test_a_board_build_prints_through_the_debug_log_callback(exports, tmp_path):
    """On TFLM's board target MicroPrintf only calls a registered callback: the
    loop printed nothing there; built with -DLM_DEBUG_LOG_CALLBACK it registers
    one, and the tokens reach stdout as on the host."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    silent, board = tmp_path / "silent", tmp_path / "board"
    silent.mkdir()
    board.mkdir()
    command, _ = build_loop(exports["alibi"], silent, ["TFLM_REPLAY_BOARD"])
    lines = run_loop(command, silent)  # the stand-in's own "arena" line only
    assert not [line for line in lines if not line.startswith("arena ")]
    defines = ["TFLM_REPLAY_BOARD", "LM_DEBUG_LOG_CALLBACK"]
    command, want = build_loop(exports["alibi"], board, defines)
    lines = run_loop(command, board)
    assert printed_tokens(lines) == want
    assert f"generated {len(want)} tokens; a second run gave the same" in lines


@pytest.mark.parametrize("compiler", ["gcc", "arm-none-eabi-gcc"])
def test_the_qemu_boards_reset_words_compile_without_a_warning(tmp_path, compiler):
    """`examples/firmware/mps2_vectors.c`, which the guide's Cortex-M4 line
    links, as C99 with warnings as errors (on the host's gcc when no ARM
    toolchain is installed)."""
    if shutil.which(compiler) is None:
        pytest.skip(f"needs {compiler}")
    source = ROOT / "examples" / "firmware" / "mps2_vectors.c"
    flags = ["-mcpu=cortex-m4+nofp", "-mthumb"] if compiler.startswith("arm") else []
    command = [compiler, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
    subprocess.run(
        command + flags + ["-c", str(source), "-o", str(tmp_path / "v.o")], check=True
    )
    doc = (ROOT / "docs" / "lm_on_device.md").read_text()
    assert "examples/firmware/mps2_vectors.c -o mps2_vectors.o" in doc


def test_the_docs_show_the_loop_file_verbatim():
    doc = (ROOT / "docs" / "lm_on_device.md").read_text()
    assert f"```cpp\n{LOOP.read_text()}```" in doc
    assert "model->version() != TFLITE_SCHEMA_VERSION" in LOOP.read_text()
    assert "G_MODEL_OPS(REGISTER_OP)" in LOOP.read_text()


@pytest.fixture(scope="module")
def dense():
    """A one-layer model's bytes: the C array's refusals need no LM."""
    inputs = tf.keras.Input((4,), batch_size=1)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


BAD_ARENAS = [-5, 0, 1.7, "abc", math.nan, True, 2**40]


@pytest.mark.parametrize("value", BAD_ARENAS)
def test_an_arena_that_is_not_a_positive_int_is_refused(value, dense, tmp_path):
    with pytest.raises(
        ValueError, match="`arena_bytes` must be (a positive int|at most)"
    ):
        write_c_array(dense, tmp_path / "m.cc", arena_bytes=value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_contract_header_refuses_an_arena_that_is_not_a_positive_int(exports):
    contract = device_contract(exports["alibi"])
    for value in BAD_ARENAS:
        with pytest.raises(ValueError, match="`arena_bytes` must be (a positive|at)"):
            contract.c_header("g_model", arena_bytes=value)


#: Keywords, standard names and what every firmware includes (TFLM's
#: namespace, stdio and stdlib, string.h).
NAMES = ["int", "class", "uint8_t", "NULL", "__x", "2lm", "tflite", "stdin"]
NAMES += ["printf", "exit", "strlen"]


@pytest.mark.parametrize("name", NAMES)
def test_a_c_keyword_or_standard_name_is_refused(name, dense, tmp_path):
    with pytest.raises(ValueError, match="`name` must"):
        write_c_array(dense, tmp_path / "m.cc", name=name, arena_bytes=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_contract_header_refuses_a_c_keyword(exports):
    with pytest.raises(ValueError, match="`name` must"):
        device_contract(exports["alibi"]).c_header("uint8_t", arena_bytes=1)


def test_a_c_array_of_a_string_names_model_bytes(tmp_path):
    with pytest.raises(TypeError, match="`model_bytes` must be the bytes"):
        write_c_array("abc", tmp_path / "m.cc")
    with pytest.raises(ValueError, match="identifier TFL3"):
        write_c_array(b"abc", tmp_path / "m.cc")


def test_a_missing_folder_leaves_every_file_as_it_was(dense, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.h").write_text("keep me")
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        write_c_array(dense, "no_such_dir/m.cc", header_path="old.h", force=True)
    assert (tmp_path / "old.h").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.h"]


def test_a_failed_rename_puts_back_the_files_it_replaced(tmp_path, monkeypatch):
    first, second = tmp_path / "a.h", tmp_path / "b.cc"
    first.write_text("old a")
    replace = os.replace
    calls = []

    def failing(source, target):
        calls.append(target)
        if str(target) == str(second):
            raise OSError("disk full")
        return replace(source, target)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk full"):
        c_array.atomic_write_all([(first, "new a"), (second, "new b")], force=True)
    monkeypatch.setattr(os, "replace", replace)
    assert first.read_text() == "old a" and not second.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["a.h"]


@pytest.mark.slow
def test_truncated_or_foreign_bytes_are_refused_by_every_reader(exports, tmp_path):
    model_bytes = exports["alibi"]
    cut = model_bytes[: len(model_bytes) // 2]
    for bad in (cut, model_bytes[:-9], b"\x00\x00\x00\x00TFL3" + b"\xff" * 40):
        with pytest.raises(ValueError, match="truncated or not a TFLite model"):
            device_contract(bad)
    with pytest.raises(ValueError, match="truncated or not a TFLite model"):
        verify_causal_lm(cut, lm("alibi"), calibration())
    from tflite_export import contract

    path = tmp_path / "lm.tflite"
    path.write_bytes(cut)
    run = subprocess.run(
        [sys.executable, "-m", "tflite_export.contract", str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    error = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and str(path) in error[0] and "truncated" in error[0]
    assert contract.main([str(path)]) == 2


@pytest.mark.slow
def test_verify_causal_lm_names_token_ids_and_refuses_another_vocabulary(exports):
    model_bytes = exports["alibi"]
    with pytest.raises(ValueError, match="`token_ids` must be token ids"):
        verify_causal_lm(model_bytes, lm("alibi"), np.full((1, 4), VOCAB + 3))
    other = build_causal_lm(VOCAB + 5, hidden_dim=16, num_layers=2, num_heads=2)
    with pytest.raises(ValueError, match="the export's vocabulary is 19"):
        verify_causal_lm(model_bytes, other, calibration())


def test_an_operator_naming_an_op_code_past_the_table_is_refused(dense):
    """`read_model` checks each operator's op-code index against the table
    (a mutated file passed it, and `model_ops` then raised TypeError)."""
    from tensorflow.lite.tools import flatbuffer_utils

    from tflite_export.firmware import model_ops, read_model

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(dense))
    model.subgraphs[0].operators[0].opcodeIndex = len(model.operatorCodes) + 3
    bad = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    with pytest.raises(ValueError, match="names op code .* of 1"):
        read_model(bad)
    with pytest.raises(ValueError, match="truncated or not a TFLite model"):
        model_ops(bad)


def test_random_byte_mutations_are_read_or_refused_with_a_value_error(dense):
    """150 one-byte mutations: each is a model `model_ops` reads, or a
    ValueError; never another error."""
    from tflite_export.firmware import model_ops

    rng = np.random.default_rng(0)
    for _ in range(150):
        data = bytearray(dense)
        data[rng.integers(8, len(data))] = rng.integers(0, 256)
        try:
            model_ops(bytes(data))
        except ValueError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("first", ["lm.h", "lm_decode.h"])
def test_both_headers_of_a_model_build_together_with_the_larger_arena(
    exports, tmp_path, first
):
    """`write_c_array`'s header and the contract's both define the ops and the
    arena; with different arena figures a firmware that included both failed
    to build. The larger figure holds, whichever comes first."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("needs a C++ compiler (g++)")
    model_bytes = exports["alibi"]
    write_c_array(model_bytes, tmp_path / "lm.cc", arena_bytes=1000)
    header = device_contract(model_bytes).c_header("g_model", arena_bytes=3000)
    (tmp_path / "lm_decode.h").write_text(header)
    second = "lm_decode.h" if first == "lm.h" else "lm.h"
    (tmp_path / "both.cc").write_text(
        f'#include "{first}"\n#include "{second}"\n'
        'static_assert(G_MODEL_ARENA_BYTES == 3000, "the larger arena");\n'
        'static_assert(G_MODEL_ARENA_BYTES_32BIT == 3000, "the larger, 32-bit");\n'
        "int main() { return G_MODEL_NUM_OPS > 0 ? 0 : 1; }\n"
    )
    command = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-c"]
    subprocess.run(command + ["both.cc", "-o", "both.o"], cwd=tmp_path, check=True)
