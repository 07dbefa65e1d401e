"""The second export path, measured: litert-torch on the PyTorch backend
against our float32 file, per method (`litert_torch`).

A child process on `KERAS_BACKEND=torch` (one per conversion: `KINDS`)
builds each method's token classifier (T=16, D=16, 2 heads, 2 layers) and
causal LM (cache of 32), saves it as `.keras`, and converts it with
litert-torch: the classifier with Keras' own `model.export(format="litert")`,
the LM's decode step
(`call_with_cache` of one token at a tensor index, caches in and out) with
`litert_torch.convert`. This process (TensorFlow) loads the same `.keras`
files, converts them with `tflite_export` at float32, and runs both files in
LiteRT on the same tokens: the classifier's outputs, and the decode step's
logits teacher-forced through 12 tokens (each file carrying its own caches).
`python -m benchmarks --only litert_torch` (litert-torch: `make bench`).
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks._common import write

VOCAB, LENGTH, CACHE = 24, 16, 32
TOKENS = np.random.default_rng(0).integers(1, VOCAB, size=(1, LENGTH)).astype("int32")


def run(quick):
    if importlib.util.find_spec("litert_torch") is None:
        print("litert_torch: skipped, it needs litert-torch (make bench installs it)")
        return
    from keras_posenc.models import METHODS

    methods = ["none", "t5", "rope", "alibi"] if quick else list(METHODS)
    with tempfile.TemporaryDirectory() as directory:
        rows = []
        for method in methods:
            converted = {kind: _convert(directory, method, kind) for kind in KINDS}
            rows += _rows(pathlib.Path(directory), method, converted)
    _write(rows, quick)


#: What is converted per method, each in a fresh PyTorch process: after one
#: conversion, litert-torch 0.10 fails the next in the same process
#: ("Verification failed" on a comparison), whatever the model.
KINDS = ("classifier", "LM decode step")


def _convert(directory, method, kind):
    """`{"error", "seconds"}` of one conversion, in a PyTorch child."""
    env = dict(os.environ, KERAS_BACKEND="torch")
    env.pop("TF_USE_LEGACY_KERAS", None)
    command = [sys.executable, "-m", "benchmarks.litert_torch", directory, method]
    child = subprocess.run(command + [kind], env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"the PyTorch child failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def _write(rows, quick):
    write(
        "litert_torch",
        "litert-torch (PyTorch backend) against our float32 file, per method"
        + (" (--quick: 4 methods)" if quick else ""),
        [
            "method",
            "model",
            "litert-torch",
            "its ops (Flex?)",
            "its size / ours",
            "max |theirs - ours|",
            "s to convert",
        ],
        rows,
        [
            "the same weights in both files (one `.keras` file each, saved on "
            "PyTorch, loaded here on TensorFlow); both run in LiteRT",
            "classifier: its outputs on 16 tokens; LM decode step: its logits "
            "teacher-forced through 12 tokens from empty caches (cache 32)",
            "ops: the builtin ops of the litert-torch file; a custom op is "
            "named, Flex ones marked (none here means LiteRT's builtins only)",
            "which path for what: docs/backends.md",
        ],
    )


def _rows(directory, method, converted):
    import tflite_export
    from keras_posenc.utils import keras

    encoder = keras.models.load_model(directory / f"{method}-encoder.keras")
    ours = tflite_export.convert(encoder, TOKENS, mode="float32")
    lm = keras.models.load_model(directory / f"{method}-lm.keras")
    ids = np.random.default_rng(1).integers(1, VOCAB, size=(8, 12)).astype("int32")
    ours_step = tflite_export.convert_causal_lm(
        lm, ids, mode="float32", max_length=CACHE, target="tflm"
    )
    rows = []
    for kind, mine, compare in (
        ("classifier", ours, _classifier_difference),
        ("LM decode step", ours_step, _step_difference),
    ):
        status = converted[kind]
        path = directory / f"{method}-{kind.split()[0]}.tflite"
        if status["error"] is not None:
            rows.append([f"`{method}`", kind, f"fails: {status['error']}", "", ""])
            rows[-1] += ["", f"{status['seconds']:.1f}"]
            continue
        theirs = path.read_bytes()
        rows.append(
            [
                f"`{method}`",
                kind,
                "converts",
                _ops(theirs),
                f"{len(theirs)} / {len(mine)}",
                f"{compare(theirs, mine):.1e}",
                f"{status['seconds']:.1f}",
            ]
        )
    return rows


def _ops(model_bytes):
    """The file's op names, custom ones named and Flex ones marked."""
    from tflite_export.firmware import model_ops, read_model

    model = read_model(model_bytes)
    custom = {
        model.OperatorCodes(k).CustomCode().decode()
        for k in range(model.OperatorCodesLength())
        if model.OperatorCodes(k).CustomCode()
    }
    flex = sorted(name for name in custom if name.startswith("Flex"))
    ops = [op for op in model_ops(model_bytes) if op != "CUSTOM"] + sorted(custom)
    return f"{len(ops)}: " + ", ".join(ops) + (f" (Flex: {flex})" if flex else "")


def _interpreter(model_bytes):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=bytes(model_bytes))
    interpreter.allocate_tensors()
    return interpreter


def _classifier_difference(theirs, ours):
    outputs = []
    for model_bytes in (theirs, ours):
        interpreter = _interpreter(model_bytes)
        given = interpreter.get_input_details()[0]
        interpreter.set_tensor(given["index"], TOKENS.astype(given["dtype"]))
        interpreter.invoke()
        outputs.append(
            interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        )
    return float(np.abs(outputs[0] - outputs[1]).max())


def _step_difference(theirs, ours):
    """Max |logits| difference, both teacher-forced through the same tokens."""
    from tflite_export.generate import teacher_forced_logits

    tokens = TOKENS[0, :12]
    mine = teacher_forced_logits(ours, tokens, runtime="litert")
    interpreter = _interpreter(theirs)
    given = interpreter.get_input_details()  # token, index, the caches
    outputs = interpreter.get_output_details()  # logits, the caches
    caches = [np.zeros(d["shape"], d["dtype"]) for d in given[2:]]
    logits = []
    for t, token in enumerate(tokens):
        values = [np.array([[token]], "int32"), np.array(t, "int32"), *caches]
        for detail, value in zip(given, values):
            interpreter.set_tensor(detail["index"], value.astype(detail["dtype"]))
        interpreter.invoke()
        step = [interpreter.get_tensor(d["index"]) for d in outputs]
        logits.append(step[0].reshape(-1))
        caches = step[1:]
    return float(np.abs(np.stack(logits) - mine).max())


def child(directory, method, kind):
    """On PyTorch: saves `method`'s model of `kind` as `.keras` and converts
    it; prints `{"error", "seconds"}` of the conversion as JSON."""
    import keras_posenc  # noqa: F401 (first: TensorFlow's start-up lines off)
    from keras_posenc.models import build_causal_lm, build_token_classifier
    from keras_posenc.utils import keras

    directory = pathlib.Path(directory)
    keras.utils.set_random_seed(0)
    size = dict(hidden_dim=16, num_heads=2, num_layers=2, position=method)
    if kind == "classifier":
        model = build_token_classifier(
            5, vocab_size=VOCAB, sequence_length=LENGTH, **size
        )
        model.save(directory / f"{method}-encoder.keras")
        path, convert = directory / f"{method}-classifier.tflite", _export_encoder
    else:
        model = build_causal_lm(VOCAB, position_options={"max_length": CACHE}, **size)
        model.save(directory / f"{method}-lm.keras")
        path, convert = directory / f"{method}-LM.tflite", _export_step
    print(json.dumps(_timed(convert, model, path)))


def _timed(convert, model, path):
    start = time.perf_counter()
    try:
        convert(model, str(path))
        error = None
    except Exception as e:  # noqa: BLE001 (reported per method, as measured)
        error = " ".join(str(e).split())[:160]
    return {"error": error, "seconds": time.perf_counter() - start}


def _export_encoder(encoder, path):
    from keras_posenc.utils import keras

    spec = [keras.InputSpec(shape=(1, LENGTH), dtype="int32")]
    encoder.export(path, format="litert", input_signature=spec, verbose=False)


def _export_step(lm, path):
    import litert_torch
    import torch

    class Step(torch.nn.Module):
        """One decode step: `(token, index, *caches) -> (logits, *caches)`."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, token, index, *cache):
            logits, cache = self.model.call_with_cache(token, list(cache), index)
            return (logits, *cache)

    shapes = lm.cache_shapes(1, CACHE)
    args = (
        torch.zeros((1, 1), dtype=torch.int32),
        torch.tensor(0, dtype=torch.int32),
        *[torch.zeros(shape) for shape in shapes],
    )
    litert_torch.convert(Step(lm).eval(), args).export(path)


if __name__ == "__main__":
    child(*sys.argv[1:4])
