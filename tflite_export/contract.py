"""The device contract of a causal LM export: every tensor a firmware touches.

A decode step of `convert_causal_lm` reads the token, its position and the
caches, and writes the logits and the updated caches; between steps each
output cache goes back into its input. `device_contract` reads all of it from
the `.tflite` bytes (positions in the subgraph's input and output lists,
names, shapes, dtypes, scales, zero points, which output feeds which input),
`DeviceContract.table()` prints it and `DeviceContract.c_header()` writes it
as a C/C++ header for the firmware (`docs/lm_on_device.md` drives TFLM with
it). The Python TFLM runner (`tflite_export.generate`) finds its tensors by
the same contract.

Usage:
    python -m tflite_export.contract MODEL.tflite [--header OUT.h] [--name g_model]
"""

import dataclasses
import functools

import numpy as np

from tflite_export import firmware
from tflite_export.metadata import ROLLING, read_metadata
from tflite_export.verify import dequantize, quantize

#: Inputs of the decode step, in the order `convert_causal_lm` lays them out.
STEP_INPUTS = ("token", "index")
#: The decode step's first output; the caches follow.
STEP_OUTPUTS = ("logits",)
#: The C type of a logits dtype.
C_TYPES = {"int8": "int8_t", "float32": "float"}
#: A cache byte copy is exact while `|scale_out / scale_in - 1| * 255 < 1/2`.
COPY_TOLERANCE = 0.5 / 255


@dataclasses.dataclass(frozen=True)
class Port:
    """One input or output of a signature."""

    index: int  # position in the subgraph's input (or output) list
    name: str
    shape: tuple
    dtype: str
    scale: float  # 0.0: not quantized
    zero_point: int
    tensor: int  # the tensor's index in the subgraph

    @property
    def bytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def quantize(self, values):
        """`values` (real numbers) as this port's raw dtype."""
        return quantize(np.asarray(values), self._detail())

    def dequantize(self, raw):
        """Real float32 values of this port's raw `raw`."""
        return dequantize(np.asarray(raw), self._detail())

    def _detail(self):  # the LiteRT tensor detail `verify` reads
        return {"dtype": self.dtype, "quantization": (self.scale, self.zero_point)}


@dataclasses.dataclass(frozen=True)
class Feed:
    """An output cache that becomes an input cache before the next step."""

    output: int
    input: int
    copy: bool  # True: a byte copy is exact (same zero point, same scale)


@dataclasses.dataclass(frozen=True)
class DeviceContract:
    """What a firmware needs to drive the decode step of an LM export."""

    signature: str
    subgraph: int
    inputs: tuple
    outputs: tuple
    feeds: tuple
    ops: tuple
    #: A streaming step's first tokens kept (`convert_causal_lm(streaming=
    #: ...)`), None for a step that stops at its cache length.
    sink_tokens: object = None
    #: The `.tflite` bytes the contract was read from (for the arena).
    model_bytes: bytes = dataclasses.field(default=b"", repr=False, compare=False)

    @functools.cached_property
    def arena(self):
        """The step's TFLM `firmware.Arena`: on this 64-bit host and for a
        32-bit part (`firmware.measure_arena`)."""
        return firmware.measure_arena(self.model_bytes)

    @property
    def arena_bytes(self):
        """The smallest TFLM arena that runs the step on this 64-bit host."""
        return self.arena.bytes

    @property
    def streams(self):
        """Whether the step runs past its cache length (a rolling cache)."""
        return self.sink_tokens is not None

    @property
    def cache_length(self):
        """S: the slots of a key or value cache `(1, N, S, H)`."""
        keys = [p for p in self.inputs if p.name in self.caches and len(p.shape) == 4]
        return int((keys or [self.input_port("cache_0")])[0].shape[2])

    @property
    def vocab_size(self):
        return int(self.output_port("logits").shape[-1])

    @property
    def caches(self):
        return tuple(p.name for p in self.inputs if p.name.startswith("cache_"))

    @property
    def cache_bytes(self):
        """Bytes of all cache inputs: the state a firmware keeps between steps."""
        return sum(self.input_port(name).bytes for name in self.caches)

    def input_port(self, name):
        return _port(self.inputs, name, "input")

    def output_port(self, name):
        return _port(self.outputs, name, "output")

    def table(self):
        """The contract as a Markdown table, with the step's protocol under it."""
        lines = [
            f"signature `{self.signature}` (subgraph {self.subgraph}): "
            f"cache length {self.cache_length}, vocabulary {self.vocab_size}",
            "",
            "| | index | name | shape | dtype | scale | zero point | bytes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for kind, ports in (("input", self.inputs), ("output", self.outputs)):
            for port in ports:
                scale = f"{port.scale:.9g}" if port.scale else "-"
                zero = str(port.zero_point) if port.scale else "-"
                lines.append(
                    f"| {kind} | {port.index} | {port.name} | {list(port.shape)} | "
                    f"{port.dtype} | {scale} | {zero} | {port.bytes} |"
                )
        lines += ["", *self.protocol()]
        return "\n".join(lines)

    def protocol(self):
        """The decoding loop in words, one line each."""
        moves = []
        for feed in self.feeds:
            out, into = self.outputs[feed.output], self.inputs[feed.input]
            if feed.copy:
                moves.append(
                    f"copy the bytes of output {feed.output} (cache {feed.input})"
                )
            else:
                moves.append(
                    f"requantize output {feed.output} (cache {feed.input}): "
                    f"round((raw{-out.zero_point:+d}) * {out.scale:.9g} / "
                    f"{into.scale:.9g}){into.zero_point:+d}, clamped to int8"
                )
        steps = [
            f"1. Keep the caches in a buffer of your own ({self.cache_bytes} bytes), "
            "each filled with its input's zero point (real 0) at the start.",
            "2. Per token t = 0, 1, ...: write the token id to input "
            f"{self.input_port('token').index}, t to input "
            f"{self.input_port('index').index} and each cache from your buffer to "
            f"its input ({', '.join(str(f.input) for f in self.feeds)}); invoke.",
            f"3. Read the logits from output {self.output_port('logits').index} "
            "(real = scale * (raw - zero point); argmax needs no dequantizing).",
            "4. Before writing any input, move the new caches into your buffer "
            "(TFLM may reuse an input's memory for an output): "
            + "; ".join(moves)
            + ".",
            f"5. Stop before t reaches the cache length {self.cache_length}."
            if not self.streams
            else f"5. t may run past the cache length {self.cache_length} (up to "
            "2**31 - 1): the step keeps the first "
            f"{self.sink_tokens} tokens and writes each new one over the oldest "
            "of the others.",
        ]
        return steps

    def c_header(self, name="g_model", arena_bytes=None):
        """A C/C++ header of the contract; its macros and arrays start `name`.

        It holds the model's ops as `NAME_NUM_OPS` and the X-macro `NAME_OPS(X)`
        and the arena `NAME_ARENA_BYTES` and `NAME_ARENA_BYTES_32BIT`:
        `arena_bytes`, a positive int for both or a `firmware.Arena`, or when
        None the step's measured `arena`.
        """
        firmware.check_c_name(name, "name")
        if arena_bytes is None:
            arena_bytes = self.arena
        upper = name.upper()
        guard = f"{upper}_{self.signature.upper()}_H_"
        lines = [
            "// Generated by tflite_export: the device contract of a causal LM's",
            f"// `{self.signature}` step (subgraph {self.subgraph}).",
            *(f"// {line}" for line in self.protocol()),
            f"// Builtin ops: {', '.join(self.ops)}.",
            f"#ifndef {guard}",
            f"#define {guard}",
            "",
            "#include <stdint.h>",
            "#include <string.h>",
            "",
            *firmware.header_macros(upper, self.ops, arena_bytes),
            "",
            *self._macros(upper),
            "",
            *_C_STRUCTS.format(name=name).splitlines(),
            "",
            *self._arrays(name),
            "",
            *_C_HELPERS.format(
                name=name,
                upper=upper,
                logit=C_TYPES[self.output_port("logits").dtype],
                indent=" " * (len(name) + 31),
            ).splitlines(),
            "",
            f"#endif  // {guard}",
            "",
        ]
        return "\n".join(lines)

    def _macros(self, upper):
        """The sizes' macros, then each port's index, scale and zero point."""
        lines = [
            f"#define {upper}_CACHE_LENGTH {self.cache_length}",
            f"#define {upper}_STREAMS {int(self.streams)}",
            f"#define {upper}_SINK_TOKENS {self.sink_tokens or 0}",
            f"#define {upper}_VOCAB_SIZE {self.vocab_size}",
            f"#define {upper}_NUM_INPUTS {len(self.inputs)}",
            f"#define {upper}_NUM_OUTPUTS {len(self.outputs)}",
            f"#define {upper}_NUM_CACHES {len(self.feeds)}",
            f"#define {upper}_CACHE_BYTES {self.cache_bytes}",
        ]
        groups = (("INPUT", self.inputs), ("OUTPUT", self.outputs))
        for kind, group in groups:
            for port in group:
                lines.append(f"#define {upper}_{kind}_{port.name.upper()} {port.index}")
        for kind, group in groups:
            for port in group:
                if port.scale:
                    macro = f"{upper}_{kind}_{port.name.upper()}"
                    lines += [
                        f"#define {macro}_SCALE {_float(port.scale)}",
                        f"#define {macro}_ZERO_POINT {port.zero_point}",
                    ]
        return lines

    def _arrays(self, name):
        """The feeds' byte tables, the ports' and the feeds' arrays."""
        lines = []
        for j, feed in enumerate(self.feeds):
            if not feed.copy:  # integer requantization: one byte read a value
                table = feed_table(self.outputs[feed.output], self.inputs[feed.input])
                lines += _byte_table(f"{name}_feed_table_{j}", table)
        for kind, group in (("inputs", self.inputs), ("outputs", self.outputs)):
            lines.append(f"static const {name}_port {name}_{kind}[] = {{")
            lines += [f"    {_port_literal(port)}," for port in group]
            lines.append("};")
        lines.append(f"static const {name}_feed {name}_feeds[] = {{")
        for j, feed in enumerate(self.feeds):
            out, into = self.outputs[feed.output], self.inputs[feed.input]
            table = "0" if feed.copy else f"{name}_feed_table_{j}"
            lines.append(
                f"    {{{feed.output}, {feed.input}, {into.bytes}, {int(feed.copy)}, "
                f"{_float(out.scale)}, {out.zero_point}, {_float(into.scale)}, "
                f"{into.zero_point}, {table}}},"
            )
        lines.append("};")
        return lines


#: The header's two structs (`{name}`: the macros' and arrays' prefix).
_C_STRUCTS = """\
// One input or output: position, name, shape, dtype, quantization.
typedef struct {{
  int index;
  const char* name;
  int rank;
  int shape[6];
  const char* dtype;
  float scale;  // 0: not quantized
  int zero_point;
  int bytes;
}} {name}_port;

// An output cache that goes back into an input before the next step.
typedef struct {{
  int output;
  int input;
  int bytes;
  int copy;  // 1: copy the bytes; 0: requantize (scales differ)
  float output_scale;
  int output_zero_point;
  float input_scale;
  int input_zero_point;
  const int8_t* table;  // copy 0: the input byte of each output byte
}} {name}_feed;"""

#: The header's two helpers: a cache's feed and the greedy token.
_C_HELPERS = """\
// Output cache `from` of `feed` as the raw bytes `to` of its input.
static inline void {name}_feed_cache(const {name}_feed* feed,
{indent}const int8_t* from, int8_t* to) {{
  if (feed->copy) {{
    memcpy(to, from, (size_t)feed->bytes);
    return;
  }}
  for (int i = 0; i < feed->bytes; ++i) {{  // integer: no float op
    to[i] = feed->table[(uint8_t)from[i]];
  }}
}}

// The greedy token: the first largest of the raw {logit} logits
// (any pointer to the logits output's data).
static inline int {name}_argmax(const void* raw) {{
  const {logit}* logits = (const {logit}*)raw;
  int best = 0;
  for (int v = 1; v < {upper}_VOCAB_SIZE; ++v) {{
    if (logits[v] > logits[best]) best = v;
  }}
  return best;
}}"""


def feed_table(output, into):
    """int8 `(256,)`: the `into` byte of each `output` byte, by its unsigned value.

    Entry `b` requantizes the int8 value of byte `b` from the output's scale
    and zero point onto the input's as the float32 loop did (`real = (q -
    zero) * scale` in float32, rounded half to even), so a firmware moves a
    cache with one table read a value.
    """
    raw = np.arange(256, dtype=np.uint8).view(np.int8)
    real = (raw.astype(np.float32) - output.zero_point) * np.float32(output.scale)
    moved = np.rint(real / np.float32(into.scale)) + into.zero_point
    return np.clip(moved, -128, 127).astype(np.int8)


def _byte_table(name, table):
    """C lines of `static const int8_t name[256]`, 16 values a line."""
    lines = [f"static const int8_t {name}[256] = {{"]
    for start in range(0, 256, 16):
        lines.append(
            "    " + ", ".join(str(int(v)) for v in table[start : start + 16]) + ","
        )
    return lines + ["};", ""]


def device_contract(model_bytes, source=None):
    """The `DeviceContract` of the decode step of a `convert_causal_lm` export.

    Bytes that are cut short or not a TFLite model raise a ValueError (naming
    `source`, the file they came from, when given).

    Example (`model_bytes` from `convert_causal_lm`):

        contract = device_contract(model_bytes)
        print(contract.table())
        header_text = contract.c_header("g_model")
    """
    signature = "decode"
    if not isinstance(model_bytes, (bytes, bytearray)):
        raise TypeError(
            "`model_bytes` must be bytes of convert_causal_lm. "
            f"Received: {type(model_bytes).__name__}"
        )
    model_bytes = bytes(model_bytes)
    model = firmware.read_model(model_bytes, source)
    found = _signatures(model)
    if signature not in found:
        raise ValueError(
            "`model_bytes` must be a causal LM export of convert_causal_lm (a "
            f"decode signature). Received: signatures {sorted(found)}"
        )
    number, inputs, outputs = found[signature]
    subgraph = model.Subgraphs(number)
    in_ports = tuple(
        _port_of(subgraph, position, tensor, inputs)
        for position, tensor in enumerate(subgraph.InputsAsNumpy())
    )
    out_ports = tuple(
        _port_of(subgraph, position, tensor, outputs)
        for position, tensor in enumerate(subgraph.OutputsAsNumpy())
    )
    feeds = []
    by_name = {port.name: port for port in in_ports}
    for port in out_ports:
        if port.name in by_name:
            into = by_name[port.name]
            copy = into.zero_point == port.zero_point and (
                into.scale == port.scale
                or (
                    into.scale > 0 and abs(port.scale / into.scale - 1) < COPY_TOLERANCE
                )
            )
            feeds.append(Feed(port.index, into.index, bool(copy)))
    rolling = read_metadata(model_bytes, ROLLING) or {}
    contract = DeviceContract(
        signature,
        number,
        in_ports,
        out_ports,
        tuple(feeds),
        firmware.model_ops(model_bytes),
        rolling.get("sink_tokens"),
        model_bytes,
    )
    missing = {"token", "index", "cache_0"} - {p.name for p in in_ports}
    if missing or "logits" not in {p.name for p in out_ports}:
        raise ValueError(
            "`model_bytes` must be a causal LM export of convert_causal_lm "
            "(inputs token, index, cache_0.., output logits). Received: inputs "
            f"{[p.name for p in in_ports]}, outputs {[p.name for p in out_ports]}"
        )
    return contract


def _signatures(model):
    """`{key: (subgraph, {input name: tensor}, {output name: tensor})}`."""
    found = {}
    for k in range(model.SignatureDefsLength()):
        definition = model.SignatureDefs(k)
        inputs = {
            definition.Inputs(i).Name().decode(): definition.Inputs(i).TensorIndex()
            for i in range(definition.InputsLength())
        }
        outputs = {
            definition.Outputs(i).Name().decode(): definition.Outputs(i).TensorIndex()
            for i in range(definition.OutputsLength())
        }
        found[definition.SignatureKey().decode()] = (
            definition.SubgraphIndex(),
            inputs,
            outputs,
        )
    return found


def _port_of(subgraph, position, tensor, names):
    from ai_edge_litert import schema_py_generated as schema

    entry = subgraph.Tensors(int(tensor))
    by_tensor = {index: name for name, index in names.items()}
    quantization = entry.Quantization()
    scale, zero = 0.0, 0
    if quantization is not None and quantization.ScaleLength() == 1:
        scale = float(quantization.Scale(0))
        zero = int(quantization.ZeroPoint(0))
    types = {
        value: key.lower()
        for key, value in vars(schema.TensorType).items()
        if not key.startswith("_")
    }
    return Port(
        index=position,
        name=by_tensor.get(int(tensor), entry.Name().decode()),
        shape=tuple(int(size) for size in entry.ShapeAsNumpy())
        if entry.ShapeLength()
        else (),
        dtype=types[entry.Type()],
        scale=scale,
        zero_point=zero,
        tensor=int(tensor),
    )


def _port(ports, name, kind):
    for port in ports:
        if port.name == name:
            return port
    raise KeyError(f"no {kind} named {name!r}; found {[p.name for p in ports]}")


def _port_literal(port):
    shape = list(port.shape) + [0] * (6 - len(port.shape))
    return (
        f'{{{port.index}, "{port.name}", {len(port.shape)}, '
        f'{{{", ".join(map(str, shape))}}}, "{port.dtype}", '
        f"{_float(port.scale)}, {port.zero_point}, {port.bytes}}}"
    )


def _float(value):
    """A C float literal that reads back as the same float32."""
    return f"{np.float32(value)!r}".replace("np.float32(", "").rstrip(")") + "f"


def main(argv=None):
    """Prints a model's contract table; `--header` also writes the C header."""
    import argparse
    import pathlib
    import sys

    from tflite_export.c_array import atomic_write, check_targets

    parser = argparse.ArgumentParser(
        prog="python -m tflite_export.contract",
        description="Prints the device contract of a causal LM export "
        "(convert_causal_lm) and optionally writes it as a C/C++ header.",
    )
    parser.add_argument("model", type=pathlib.Path, help="an LM export (.tflite)")
    parser.add_argument(
        "--header",
        type=pathlib.Path,
        default=None,
        help="also write the contract as this C/C++ header (with the model's "
        "ops and the smallest TFLM arena, measured here)",
    )
    parser.add_argument(
        "--name", default="g_model", help="prefix of the C names (default g_model)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite --header")
    args = parser.parse_args(argv)
    try:
        firmware.check_c_name(args.name, "--name")
        if args.header is not None and args.header.resolve() == args.model.resolve():
            raise ValueError(f"--header {args.header} is the model; choose another")
        if args.header is not None:  # before the arena is measured
            check_targets([args.header], args.force)
        contract = device_contract(args.model.read_bytes(), source=args.model)
        header = contract.c_header(args.name) if args.header else None
        if header is not None:
            atomic_write(args.header, header, force=args.force)
    except (OSError, ValueError, TypeError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(contract.table())
    if header is not None:
        print(f"wrote {args.header}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
