"""Verification of a .tflite model in LiteRT and in the TFLM interpreter."""

import dataclasses
import re

import numpy as np

from tflite_export._tflm.child import run_worker
from tflite_export.firmware import Arena, measure_arena

#: TFLM runs in a subprocess for at most this many seconds.
TFLM_TIMEOUT_SECONDS = 300


@dataclasses.dataclass
class Report:
    """What `verify` measured; `table()` formats it for people."""

    ops: list
    input_dtype: str
    output_dtype: str
    size_bytes: int
    output_scale: float
    tflm_ok: bool
    tflm_missing_ops: list
    tflm_error: str = None
    arena_bytes: int = None
    arena_bytes_32bit: int = None
    output_range: float = None
    max_error: float = None
    tflm_max_error: float = None
    tflm_vs_litert: float = None
    accuracy_keras: float = None
    accuracy_litert: float = None
    accuracy_tflm: float = None

    @property
    def arena(self):
        """The `firmware.Arena` of both figures (None when TFLM did not run)."""
        return Arena.of(self.arena_bytes, self.arena_bytes_32bit)

    def table(self):
        """A titled two-column table; each error beside its yardsticks."""
        rows = [
            ("ops", ", ".join(self.ops)),
            ("input / output dtype", f"{self.input_dtype} / {self.output_dtype}"),
            ("size", f"{self.size_bytes} bytes"),
            ("output scale", f"{self.output_scale:.6g}"),
            ("TFLM", "runs" if self.tflm_ok else f"FAILS: {self.tflm_error}"),
            ("TFLM missing ops", ", ".join(self.tflm_missing_ops) or "none"),
            ("TFLM arena, 64-bit host", _maybe(self.arena_bytes, "{} bytes")),
            ("TFLM arena, 32-bit part", _maybe(self.arena_bytes_32bit, "{} bytes")),
            ("largest error, LiteRT vs Keras", self._error(self.max_error)),
            ("largest error, TFLM vs Keras", self._error(self.tflm_max_error)),
            ("largest gap, TFLM vs LiteRT", self._error(self.tflm_vs_litert)),
            ("accuracy Keras", _maybe(self.accuracy_keras, "{:.4f}")),
            ("accuracy LiteRT", _maybe(self.accuracy_litert, "{:.4f}")),
            ("accuracy TFLM", _maybe(self.accuracy_tflm, "{:.4f}")),
        ]
        title = "The exported model in LiteRT and in TFLM (tflite_export.verify)"
        return titled_table(title, rows)

    def _error(self, error):
        """`error` (output units) in the output's quantization steps and as
        a share of the outputs' range."""
        if error is None:
            return "n/a"
        scales = []
        if self.output_scale:
            scales.append(f"{error / self.output_scale:.1f} {self.output_dtype} steps")
        if self.output_range:
            share = 100 * error / self.output_range
            scales.append(f"{share:.1f}% of the outputs' range {self.output_range:.4g}")
        return f"{error:.4f}" + (f" ({'; '.join(scales)})" if scales else "")


def verify(model_bytes, keras_model=None, x=None, y=None):
    """Runs `model_bytes` in LiteRT and TFLM and reports what it found.

    A model of several outputs is compared output by output, in Keras'
    order (`convert` keeps it): the errors are the largest over all of
    them; dtypes and scale are the first output's.

    Args:
        model_bytes: the `.tflite` model.
        keras_model: optional float Keras model to compare outputs against.
        x: optional inputs `(N, ...)` (float or integer ids, unquantized).
        y: optional integer labels `(N,)` (turn on accuracy reporting; one
            output models only).

    Returns:
        A `Report`.
    """
    interpreter = _litert(model_bytes)
    inp, outs = _checked_ports(interpreter, keras_model, y)
    ops = sorted({op["op_name"] for op in interpreter._get_ops_details()})
    if x is None:
        x = np.zeros([2] + list(inp["shape"][1:]), dtype=inp["dtype"])
    x = np.asarray(x)
    quantized = quantize(x, inp)
    litert = _run_litert(interpreter, inp, outs, quantized)
    tflm_raw, tflm_info = run_tflm(model_bytes, quantized, len(outs))
    report = Report(
        ops=ops,
        input_dtype=np.dtype(inp["dtype"]).name,
        output_dtype=np.dtype(outs[0]["dtype"]).name,
        size_bytes=len(model_bytes),
        output_scale=float(outs[0]["quantization"][0]),
        tflm_ok=tflm_raw is not None,
        tflm_missing_ops=tflm_info["missing_ops"],
        tflm_error=tflm_info["error"],
        arena_bytes=tflm_info["arena_bytes"],
        arena_bytes_32bit=tflm_info["arena_bytes_32bit"],
    )
    report.output_range = max(float(np.ptp(output)) for output in litert)
    tflm = None
    if tflm_raw is not None:
        tflm = [dequantize(raw, out) for raw, out in zip(tflm_raw, outs)]
        report.tflm_vs_litert = _largest_gap(tflm, litert)
    reference = None
    if keras_model is not None:
        reference = _keras_outputs(keras_model, x)
        report.max_error = _largest_gap(litert, reference)
        if tflm is not None:
            report.tflm_max_error = _largest_gap(tflm, reference)
    if y is not None:
        y = np.asarray(y)
        report.accuracy_litert = _accuracy(litert[0], y)
        report.accuracy_tflm = None if tflm is None else _accuracy(tflm[0], y)
        report.accuracy_keras = (
            None if reference is None else _accuracy(reference[0], y)
        )
    return report


def _checked_ports(interpreter, keras_model, y):
    """`(input, outputs)` details of a `convert` model `verify` can compare."""
    signatures = sorted(interpreter.get_signature_list())
    if "decode" in signatures:
        raise ValueError(
            "`model_bytes` must be a one-input model of `convert`; these are a "
            f"causal LM export of `convert_causal_lm` (signatures {signatures}). "
            "Run it with tflite_export.generate_tflite(model_bytes, prompt_ids, "
            "max_new_tokens, runtime=...)"
        )
    inp = interpreter.get_input_details()[0]
    outs = interpreter.get_output_details()
    if y is not None and len(outs) > 1:
        raise ValueError(
            "`y` must be None for a model of several outputs (accuracy reads "
            f"one output's classes). Received: labels for {len(outs)} outputs"
        )
    if keras_model is not None and len(keras_model.outputs) != len(outs):
        raise ValueError(
            f"`keras_model` must have the TFLite model's {len(outs)} outputs. "
            f"Received: {keras_model.name} with {len(keras_model.outputs)}"
        )
    return inp, outs


def _keras_outputs(keras_model, x):
    """The Keras model's outputs on `x`, a list of arrays in its order."""
    reference = keras_model.predict(x, verbose=0, batch_size=64)
    if not isinstance(reference, (list, tuple)):
        reference = [reference]
    return [np.asarray(r) for r in reference]


def run_tflm(model_bytes, quantized_inputs, num_outputs=None):
    """`(raw outputs or None, info)` from the TFLM interpreter in a subprocess.

    The outputs are one array `(N, ...)`, or with `num_outputs` a list of
    that many, one per model output. `info["arena_bytes"]` is the smallest
    arena that runs the model (`tflite_export.firmware.bisect_arena`), not
    the larger one it ran in.
    """
    info = {
        "missing_ops": [],
        "error": None,
        "arena_bytes": None,
        "arena_bytes_32bit": None,
    }
    arrays = {
        "model": np.frombuffer(model_bytes, np.uint8),
        "inputs": quantized_inputs,
        "num_outputs": np.array(num_outputs or 1),
    }
    results, log, code = run_worker(
        "tflite_export._tflm.worker", arrays, TFLM_TIMEOUT_SECONDS
    )
    info["missing_ops"] = sorted(
        set(re.findall(r"Didn't find op for builtin opcode '(\w+)'", log))
    )
    if results is None:
        last = [line for line in log.strip().splitlines() if line.strip()]
        reason = last[-1] if last else ""
        if code < 0:
            reason = f"the interpreter aborted (signal {-code}) {reason}"
        info["error"] = reason.strip()
        return None, info
    arena = measure_arena(model_bytes)
    info["arena_bytes"], info["arena_bytes_32bit"] = arena.bytes, arena.bytes_32bit
    outputs = [results[f"output_{k}"] for k in range(num_outputs or 1)]
    return (outputs if num_outputs else outputs[0]), info


def _litert(model_bytes):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_content=model_bytes,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    return interpreter


def _run_litert(interpreter, inp, outs, examples):
    """Float32 outputs `[(N, ...)]` of LiteRT, one per output, one row per example."""
    rows = [[] for _ in outs]
    for example in examples:
        interpreter.set_tensor(inp["index"], example[None])
        interpreter.invoke()
        for row, out in zip(rows, outs):
            row.append(interpreter.get_tensor(out["index"])[0])
    return [dequantize(np.stack(row), out) for row, out in zip(rows, outs)]


def _largest_gap(ours, theirs):
    """The largest `|a - b|` over outputs compared pairwise."""
    return max(float(np.max(np.abs(a - b))) for a, b in zip(ours, theirs))


def quantize(values, detail):
    """`values` in the dtype of a LiteRT tensor `detail` (its scale and zero point)."""
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if dtype.kind == "f" or scale == 0:
        return values.astype(dtype)
    info = np.iinfo(dtype)
    quantized = np.round(values / scale + zero_point)
    return np.clip(quantized, info.min, info.max).astype(dtype)


def dequantize(values, detail):
    """Float32 values of raw outputs of a LiteRT tensor `detail`."""
    scale, zero_point = detail["quantization"]
    if scale == 0:
        return values.astype(np.float32)
    return (values.astype(np.float32) - zero_point) * scale


def _accuracy(outputs, labels):
    return float(np.mean(np.argmax(outputs, axis=-1) == labels))


def titled_table(title, rows):
    """`title` over a markdown table of `(what, value)` rows, headed."""
    width = max(len(name) for name, _ in rows)
    lines = [title, f"| {'what':<{width}} | value |", f"| {'---':<{width}} | --- |"]
    lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
    return "\n".join(lines)


def _maybe(value, template):
    return "n/a" if value is None else template.format(value)
