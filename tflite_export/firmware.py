"""What a TFLM firmware needs besides the model: its ops and its arena.

Every header the package writes for a microcontroller (`write_c_array`'s,
`DeviceContract.c_header`'s) carries three macros a firmware uses as they
are (`examples/firmware/lm_main.cc` does):

- `G_MODEL_NUM_OPS`, the number of builtin ops in the model: the size of
  TFLM's `MicroMutableOpResolver<G_MODEL_NUM_OPS>`;
- `G_MODEL_OPS(X)`, an X-macro with one `X(AddSoftmax)` per op, named as the
  resolver's registration methods;
- `G_MODEL_ARENA_BYTES`, the smallest arena with which the TFLM interpreter
  allocates and invokes the model on this 64-bit host (`smallest_arena`),
  and `G_MODEL_ARENA_BYTES_32BIT`, the same for a 32-bit part (Cortex-M),
  derived from TFLM's recorded allocations (`measure_arena`).

`read_model` is the one reader of `.tflite` bytes: it walks the whole
flatbuffer once, so a truncated file or another format is refused with a
`ValueError` before anything else reads it.
"""

import dataclasses
import re
import struct

import numpy as np

from tflite_export._tflm.child import run_worker

#: Builtin ops that TFLM's `MicroMutableOpResolver` can register (read from
#: its `Add...` methods; every one has a `Register_<OP>` kernel in the
#: `tflite-micro` runtime, `tests/export/test_export_firmware.py`).
TFLM_OPS = frozenset(
    """ABS ADD ADD_N ARG_MAX ARG_MIN ASSIGN_VARIABLE AVERAGE_POOL_2D BATCH_MATMUL
    BATCH_TO_SPACE_ND BROADCAST_ARGS BROADCAST_TO CALL_ONCE CAST CEIL CONCATENATION
    CONV_2D COS CUMSUM DEPTH_TO_SPACE DEPTHWISE_CONV_2D DEQUANTIZE DIV
    DYNAMIC_UPDATE_SLICE ELU EMBEDDING_LOOKUP EQUAL EXP EXPAND_DIMS FILL FLOOR
    FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GATHER GATHER_ND GREATER GREATER_EQUAL
    HARD_SWISH IF L2_NORMALIZATION L2_POOL_2D LEAKY_RELU LESS LESS_EQUAL LOG
    LOG_SOFTMAX LOGICAL_AND LOGICAL_NOT LOGICAL_OR LOGISTIC MAX_POOL_2D MAXIMUM MEAN
    MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL PACK PAD PADV2 PRELU QUANTIZE READ_VARIABLE
    REDUCE_MAX REDUCE_MIN RELU RELU6 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR
    REVERSE_V2 ROUND RSQRT SELECT_V2 SHAPE SIN SLICE SOFTMAX SPACE_TO_BATCH_ND
    SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE SQUEEZE
    STRIDED_SLICE SUB SUM SVDF TANH TRANSPOSE TRANSPOSE_CONV
    UNIDIRECTIONAL_SEQUENCE_LSTM UNPACK VAR_HANDLE WHILE ZEROS_LIKE""".split()
)
#: Registration methods whose names are not the op's words in CamelCase.
IRREGULAR_METHODS = {
    "BATCH_MATMUL": "AddBatchMatMul",
    "CUMSUM": "AddCumSum",
    "PADV2": "AddPadV2",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "AddUnidirectionalSequenceLSTM",
}
#: Arenas tried by `smallest_arena` at most (a model needing more is refused).
MAX_ARENA_BYTES = 64 << 20
#: Seconds the arena search may take in its child process.
ARENA_TIMEOUT_SECONDS = 300
#: Children the arena search may lose to TFLM crashes before it gives up.
MAX_ARENA_RESTARTS = 12
#: What `bisect_arena` writes to its log before each size it tries.
ARENA_PROBE = "arena probe"

#: C and C++ keywords and the standard names a generated header would clash
#: with (`write_c_array(name=...)`, `c_header(name)`).
_C_RESERVED = frozenset(
    """alignas alignof and and_eq asm auto bitand bitor bool break case catch char
    char8_t char16_t char32_t class compl concept const consteval constexpr
    constinit const_cast continue co_await co_return co_yield decltype default
    delete do double dynamic_cast else enum explicit export extern false final
    float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq override private protected public register
    reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true
    try typedef typeid typename union unsigned using virtual void volatile wchar_t
    while xor xor_eq _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary
    _Noreturn _Static_assert _Thread_local NULL EOF FILE main errno assert offsetof
    size_t ptrdiff_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t
    uint64_t intptr_t uintptr_t intmax_t uintmax_t std memcpy memset lrintf
    tflite stdin stdout stderr printf fprintf sprintf snprintf puts putchar
    getchar scanf exit abort atexit malloc calloc realloc free strlen strcmp
    strncmp strcpy strncpy strcat memmove memcmp rand srand time clock abs
    labs fabs sqrt exp log sin cos""".split()
)
#: The largest arena a header may declare: a 32-bit part's largest object.
MAX_HEADER_ARENA_BYTES = 2**31 - 1
#: Bytes a 32-bit part saves on each allocation TFLM records under these
#: names: structs of pointers and ints, sizeof with TF_LITE_STATIC_MEMORY (as
#: TFLM is built) on x86-64 and on Cortex-M (arm-none-eabi-g++): TfLiteEvalTensor
#: 24 and 12, TfLiteTensor 64 and 32, NodeAndRegistration 64 and 32. The other
#: records (kernels' data, quantization parameters) count in full, so the
#: 32-bit figure is an upper bound (`docs/lm_on_device.md` has it measured).
POINTER_SAVINGS_32BIT = {
    "TfLiteEvalTensor data": 12,
    "Persistent TfLiteTensor data": 32,
    "NodeAndRegistration struct": 32,
}
#: A line of TFLM's `print_allocations`: the record's name and its count.
_RECORD = re.compile(r"'([^']+)' used \d+ bytes .*?for (\d+) ")


@dataclasses.dataclass(frozen=True)
class Arena:
    """A model's TFLM arena in bytes: on a 64-bit host and on a 32-bit part.

    `bytes` is the smallest arena with which the TFLM interpreter allocated
    and ran the model here (bisection on this 64-bit host; TFLM's planner
    needs more than `arena_used_bytes` reports). `bytes_32bit` is that less
    what 4-byte pointers save on the tensors and nodes TFLM recorded in it
    (`POINTER_SAVINGS_32BIT`): the figure for a Cortex-M or another 32-bit
    part, where the host's is 27-40% above the smallest that runs (8-16% for
    this one: `docs/lm_on_device.md`).
    """

    bytes: int
    bytes_32bit: int

    @classmethod
    def of(cls, host_bytes, bytes_32bit):
        """The `Arena` of a report's two figures, or None without them."""
        return None if host_bytes is None else cls(host_bytes, bytes_32bit)


def bytes_32bit(host_bytes, allocations):
    """`host_bytes` less the 32-bit savings of TFLM's `print_allocations` text."""
    saved = sum(
        POINTER_SAVINGS_32BIT.get(name, 0) * int(count)
        for name, count in _RECORD.findall(allocations)
    )
    return host_bytes - saved


def check_c_name(value, argument="name"):
    """`value`, a C identifier that no C or C++ keyword or standard name takes."""
    if not isinstance(value, str) or not value.isidentifier() or not value.isascii():
        raise ValueError(
            f"`{argument}` must be a C identifier. Received: {argument}={value!r}"
        )
    if value in _C_RESERVED:
        raise ValueError(
            f"`{argument}` must be a C identifier that is not a C or C++ keyword "
            f"or standard name. Received: {argument}={value!r}"
        )
    if value.startswith("__") or (value[0] == "_" and value[1:2].isupper()):
        raise ValueError(
            f"`{argument}` must not start with two underscores or an underscore "
            f"and a capital (names reserved to C and C++). Received: "
            f"{argument}={value!r}"
        )
    return value


def check_model_bytes(model_bytes, argument="model_bytes"):
    """`model_bytes` as bytes; a TypeError names `argument` for anything else."""
    if not isinstance(model_bytes, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"`{argument}` must be the bytes of a .tflite model. Received: "
            f"{type(model_bytes).__name__}"
        )
    return bytes(model_bytes)


def read_model(model_bytes, source=None):
    """The flatbuffer's root `Model`, after reading every table of it once.

    Raises:
        TypeError: `model_bytes` is not bytes.
        ValueError: the bytes are not a TFLite model, or are cut short;
            the message names `source` (a file name) when given.
    """
    from ai_edge_litert import schema_py_generated as schema

    # A bytearray stays itself, so that a caller can edit the model in place.
    data = model_bytes if isinstance(model_bytes, bytearray) else None
    data = check_model_bytes(model_bytes) if data is None else data
    what = f"`{source}`" if source else "`model_bytes`"
    if len(data) < 8 or bytes(data[4:8]) != b"TFL3":
        raise ValueError(
            f"{what} must be a .tflite flatbuffer (identifier TFL3). Received: "
            f"{len(data)} bytes starting {bytes(data[:8])!r}"
        )
    try:
        root = struct.unpack_from("<I", data, 0)[0]
        if not 8 <= root < len(data):
            raise ValueError(f"the root table's offset {root} lies outside the file")
        model = schema.Model.GetRootAs(data, 0)
        _walk(model, len(data))
        if model.SubgraphsLength() == 0:
            raise ValueError("no subgraph")
    except (struct.error, IndexError, ValueError, TypeError, OverflowError) as error:
        raise ValueError(
            f"{what} is truncated or not a TFLite model: reading its "
            f"{len(data)} bytes as one failed ({error})"
        ) from error
    return model


def _walk(model, size):
    """Reads every field a reader of the package touches (raises if cut)."""
    model.Version()
    codes = model.OperatorCodesLength()
    for k in range(codes):
        code = model.OperatorCodes(k)
        code.BuiltinCode(), code.DeprecatedBuiltinCode()
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        subgraph.InputsAsNumpy(), subgraph.OutputsAsNumpy()
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            tensor.ShapeAsNumpy(), tensor.Type(), tensor.Name(), tensor.Buffer()
            quantization = tensor.Quantization()
            if quantization is not None:
                quantization.ScaleAsNumpy(), quantization.ZeroPointAsNumpy()
        for o in range(subgraph.OperatorsLength()):
            operator = subgraph.Operators(o)
            if not 0 <= operator.OpcodeIndex() < codes:
                raise ValueError(
                    f"operator {o} of subgraph {s} names op code "
                    f"{operator.OpcodeIndex()} of {codes}"
                )
            operator.InputsAsNumpy(), operator.OutputsAsNumpy()
    for b in range(model.BuffersLength()):
        buffer = model.Buffers(b)
        if buffer.Offset() > 1:  # data after the flatbuffer (models over 2 GB)
            if buffer.Offset() + buffer.Size() > size:
                raise ValueError("a buffer ends past the file")
        elif buffer.DataLength():
            buffer.DataAsNumpy()
    for k in range(model.SignatureDefsLength()):
        definition = model.SignatureDefs(k)
        definition.SignatureKey()
        for i in range(definition.InputsLength()):
            definition.Inputs(i).Name()
        for i in range(definition.OutputsLength()):
            definition.Outputs(i).Name()
    for k in range(model.MetadataLength()):
        model.Metadata(k).Name()


def model_ops(model_bytes):
    """The builtin op names the model's operators run (every subgraph), sorted.

    Operator codes no operator uses (the QAT export's rewrites leave some)
    are not listed: a firmware registers what runs.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = read_model(model_bytes)
    names = {
        value: key
        for key, value in vars(schema.BuiltinOperator).items()
        if key.isupper()
    }
    used = set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for o in range(subgraph.OperatorsLength()):
            used.add(subgraph.Operators(o).OpcodeIndex())
    found = set()
    for k in used:
        code = model.OperatorCodes(k)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        found.add(names.get(builtin, f"BUILTIN_{builtin}"))
    return tuple(sorted(found))


def resolver_method(op):
    """TFLM's `MicroMutableOpResolver` method that registers builtin `op`."""
    if op not in TFLM_OPS:
        raise ValueError(
            f"TFLM has no kernel for the builtin op {op}: a firmware cannot "
            "register it (tflite_export.microcontroller_blockers names the layer "
            "that emits it)"
        )
    if op in IRREGULAR_METHODS:
        return IRREGULAR_METHODS[op]
    # Words keep a leading digit's letters in capitals: CONV_2D -> Conv2D.
    words = (w if w[:1].isdigit() else w.capitalize() for w in op.split("_"))
    return "Add" + "".join(words)


def check_arena_bytes(arena_bytes):
    """`arena_bytes` as a positive int (bools, floats, strings refused)."""
    if (
        isinstance(arena_bytes, bool)
        or not isinstance(arena_bytes, (int, np.integer))
        or arena_bytes < 1
    ):
        raise ValueError(
            "`arena_bytes` must be a positive int (the TFLM arena in bytes). "
            f"Received: arena_bytes={arena_bytes!r}"
        )
    if arena_bytes > MAX_HEADER_ARENA_BYTES:
        raise ValueError(
            f"`arena_bytes` must be at most {MAX_HEADER_ARENA_BYTES} (2**31 - 1: "
            "the largest array a 32-bit part can address). Received: "
            f"arena_bytes={arena_bytes!r}"
        )
    return int(arena_bytes)


def header_macros(prefix, ops, arena):
    """The ops and arena macros of a header, as lines; `prefix` in capitals.

    `arena` is an `Arena`, or a positive int given for both figures.
    """
    methods = [resolver_method(op) for op in ops]
    if isinstance(arena, Arena):
        arena = Arena(*map(check_arena_bytes, (arena.bytes, arena.bytes_32bit)))
    else:
        arena = Arena(*[check_arena_bytes(arena)] * 2)
    if arena.bytes == arena.bytes_32bit:
        about = ["// The TFLM arena (given), on every target."]
    else:
        about = [
            "// The TFLM arena: the smallest with which the TFLM interpreter",
            f"// allocated and ran the model on a 64-bit host ({prefix}_ARENA_BYTES),",
            "// and for a 32-bit part such as a Cortex-M the same less what its",
            "// 4-byte pointers save on the tensors and nodes TFLM recorded",
            f"// ({prefix}_ARENA_BYTES_32BIT, an upper bound).",
        ]
    lines = [
        f"// The model's {len(ops)} builtin ops, for "
        f"tflite::MicroMutableOpResolver<{prefix}_NUM_OPS>:",
        f"// expand {prefix}_OPS(X) with X(method) calling resolver.method().",
        f"#define {prefix}_NUM_OPS {len(ops)}",
        f"#define {prefix}_OPS(X) \\",
        *(f"  X({method}) \\" for method in methods[:-1]),
        f"  X({methods[-1]})",
        *about,
        "// With the model's other header included too, the larger figures hold.",
    ]
    figures = {"ARENA_BYTES": arena.bytes, "ARENA_BYTES_32BIT": arena.bytes_32bit}
    for macro, value in figures.items():
        name = f"{prefix}_{macro}"
        lines += [
            f"#if defined({name}) && {name} < {value}",
            f"#undef {name}",
            "#endif",
            f"#ifndef {name}",
            f"#define {name} {value}",
            "#endif",
        ]
    return lines


def bisect_arena(model_bytes, runtime, low=0, high=64 << 10, log=None):
    """The smallest arena (bytes) with which TFLM allocates and invokes the model.

    Bisects between `low` (known to fail) and `high`, doubling `high` until
    it runs; `runtime` is `tflite_micro.python.tflite_micro.runtime`; every
    input is set to zeros before invoking. Each size is written to `log`
    (a text stream) before it is tried: TFLM crashes on some arenas that are
    too small ("Failed to allocate tail memory"), and the parent
    (`smallest_arena`) reads the last size tried to go on without it.
    """

    def runs(size):
        if log is not None:
            log.write(f"{ARENA_PROBE} {size}\n")
            log.flush()
        try:
            interpreter = runtime.Interpreter.from_bytes(model_bytes, arena_size=size)
        except RuntimeError:  # "TFLM failed to allocate tensors"
            return False
        index = 0
        while True:
            try:
                detail = interpreter.get_input_details(index)
            except (IndexError, RuntimeError, ValueError):
                break
            interpreter.set_input(np.zeros(detail["shape"], detail["dtype"]), index)
            index += 1
        try:
            interpreter.invoke()
        except RuntimeError:
            return False
        return True

    while not runs(high):
        low, high = high, high * 4
        if high > MAX_ARENA_BYTES:
            raise RuntimeError(
                f"TFLM cannot run the model in an arena of {MAX_ARENA_BYTES} bytes"
            )
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if runs(middle) else (middle, high)
    return high


def smallest_arena(model_bytes):
    """The smallest TFLM arena that runs `model_bytes` on this 64-bit host.

    `measure_arena(model_bytes).bytes`.
    """
    return measure_arena(model_bytes).bytes


def measure_arena(model_bytes):
    """The `Arena` of `model_bytes`: `bisect_arena` in child processes (TFLM
    may crash), then TFLM's record of what it allocated in that arena.

    A child that crashes on a size too small is replaced by one that goes on
    from the sizes known so far, the crashing size counted as failing.

    Raises:
        RuntimeError: TFLM cannot run the model (the reason from its log).
    """
    data = check_model_bytes(model_bytes)
    read_model(data)
    low, high = 0, 64 << 10
    for _ in range(MAX_ARENA_RESTARTS):
        arrays = {
            "model": np.frombuffer(data, np.uint8),
            "arena_search": np.array([low, high]),
        }
        results, log, code = run_worker(
            "tflite_export._tflm.worker", arrays, ARENA_TIMEOUT_SECONDS
        )
        if results is not None:
            return Arena(int(results["arena"]), int(results["arena_32bit"]))
        tried = [int(size) for size in re.findall(rf"{ARENA_PROBE} (\d+)", log)]
        crashed = code < 0 and tried and tried[-1] < MAX_ARENA_BYTES
        if not crashed or tried[-1] <= low:
            lines = [
                line
                for line in log.splitlines()
                if line.strip() and not line.startswith(ARENA_PROBE)
            ]
            raise RuntimeError(
                "TFLM cannot run the model, so it has no arena (pass arena_bytes= "
                "to write a header anyway): "
                + (lines[-1] if lines else f"exit status {code}")
            )
        # Sizes before the crash: each ran (the next one is at most it) or
        # failed (the next one is larger); the crashing one failed.
        for size, following in zip(tried, tried[1:]):
            if following <= size:
                high = min(high, size)
            else:
                low = max(low, size)
        low = max(low, tried[-1])
        if low >= high:
            high = low * 4
    raise RuntimeError(f"TFLM crashed {MAX_ARENA_RESTARTS} times searching its arena")
