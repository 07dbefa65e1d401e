"""Verification of a .tflite model in LiteRT and in the TFLM interpreter."""

import dataclasses
import re

import numpy as np

from tflite_export._child import run_worker
from tflite_export.firmware import smallest_arena

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
    max_error: float = None
    tflm_max_error: float = None
    tflm_vs_litert: float = None
    accuracy_keras: float = None
    accuracy_litert: float = None
    accuracy_tflm: float = None

    def table(self):
        rows = [
            ("ops", ", ".join(self.ops)),
            ("input / output dtype", f"{self.input_dtype} / {self.output_dtype}"),
            ("size", f"{self.size_bytes} bytes"),
            ("output scale", f"{self.output_scale:.6g}"),
            ("TFLM", "runs" if self.tflm_ok else f"FAILS: {self.tflm_error}"),
            ("TFLM missing ops", ", ".join(self.tflm_missing_ops) or "none"),
            ("TFLM arena", _maybe(self.arena_bytes, "{} bytes")),
            ("max |LiteRT - Keras|", _maybe(self.max_error, "{:.4f}")),
            ("max |TFLM - Keras|", _maybe(self.tflm_max_error, "{:.4f}")),
            ("max |TFLM - LiteRT|", _maybe(self.tflm_vs_litert, "{:.4f}")),
            ("accuracy Keras", _maybe(self.accuracy_keras, "{:.4f}")),
            ("accuracy LiteRT", _maybe(self.accuracy_litert, "{:.4f}")),
            ("accuracy TFLM", _maybe(self.accuracy_tflm, "{:.4f}")),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"| {name:<{width}} | {value} |" for name, value in rows)


def verify(model_bytes, keras_model=None, x=None, y=None):
    """Runs `model_bytes` in LiteRT and TFLM and reports what it found.

    Args:
        model_bytes: the `.tflite` model.
        keras_model: optional float Keras model to compare outputs against.
        x: optional inputs `(N, ...)` (float or integer ids, unquantized).
        y: optional integer labels `(N,)` (turn on accuracy reporting).

    Returns:
        A `Report`.
    """
    interpreter = _litert(model_bytes)
    signatures = sorted(interpreter.get_signature_list())
    if "decode" in signatures:
        raise ValueError(
            "`model_bytes` must be a one-input model of `convert`; these are a "
            f"causal LM export of `convert_causal_lm` (signatures {signatures}). "
            "Run it with tflite_export.generate_tflite(model_bytes, prompt_ids, "
            "max_new_tokens, runtime=...)"
        )
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    ops = sorted({op["op_name"] for op in interpreter._get_ops_details()})
    if x is None:
        x = np.zeros([2] + list(inp["shape"][1:]), dtype=inp["dtype"])
    x = np.asarray(x)
    quantized = quantize(x, inp)
    litert = np.stack(
        [_run_litert(interpreter, inp, out, example[None])[0] for example in quantized]
    )
    litert = dequantize(litert, out)
    tflm_raw, tflm_info = run_tflm(model_bytes, quantized)
    report = Report(
        ops=ops,
        input_dtype=np.dtype(inp["dtype"]).name,
        output_dtype=np.dtype(out["dtype"]).name,
        size_bytes=len(model_bytes),
        output_scale=float(out["quantization"][0]),
        tflm_ok=tflm_raw is not None,
        tflm_missing_ops=tflm_info["missing_ops"],
        tflm_error=tflm_info["error"],
        arena_bytes=tflm_info["arena_bytes"],
    )
    tflm = None if tflm_raw is None else dequantize(tflm_raw, out)
    if tflm is not None:
        report.tflm_vs_litert = float(np.max(np.abs(tflm - litert)))
    reference = None
    if keras_model is not None:
        reference = np.asarray(keras_model.predict(x, verbose=0, batch_size=64))
        report.max_error = float(np.max(np.abs(litert - reference)))
        if tflm is not None:
            report.tflm_max_error = float(np.max(np.abs(tflm - reference)))
    if y is not None:
        y = np.asarray(y)
        report.accuracy_litert = _accuracy(litert, y)
        report.accuracy_tflm = None if tflm is None else _accuracy(tflm, y)
        report.accuracy_keras = None if reference is None else _accuracy(reference, y)
    return report


def run_tflm(model_bytes, quantized_inputs):
    """`(raw outputs or None, info)` from the TFLM interpreter in a subprocess.

    `info["arena_bytes"]` is the smallest arena that runs the model
    (`tflite_export.firmware.bisect_arena`), not the larger one it ran in.
    """
    info = {"missing_ops": [], "error": None, "arena_bytes": None}
    arrays = {"model": np.frombuffer(model_bytes, np.uint8), "inputs": quantized_inputs}
    results, log, code = run_worker(
        "tflite_export._tflm_worker", arrays, TFLM_TIMEOUT_SECONDS
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
    info["arena_bytes"] = smallest_arena(model_bytes)
    return results["outputs"], info


def _litert(model_bytes):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(
        model_content=model_bytes,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    interpreter.allocate_tensors()
    return interpreter


def _run_litert(interpreter, inp, out, example):
    interpreter.set_tensor(inp["index"], example)
    interpreter.invoke()
    return interpreter.get_tensor(out["index"])


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


def _maybe(value, template):
    return "n/a" if value is None else template.format(value)
