"""QAT: float, post-training int8 and quantization-aware int8, side by side.

Digits, per method (the ones `tflite_export.quantize_aware` covers), 3 seeds:
the float model; post-training int8 of it (calibrated on the training set);
the package's QAT (`quantize_aware(model)`, 5 epochs at a tenth of the
learning rate, converted with no data) in Keras and as int8 in LiteRT and
TFLM; under Keras 2 also TF-MOT's QAT (`engine="tfmot"`, converted with
data). Means with half the range over the seeds; int8 size and TFLM arena of
the package's QAT.

The pydoc byte-level LM (D=64, 2 layers, L=64, 1000 batches), per method:
teacher-forced bits per byte on held-out text of the float model, of its
post-training int8 decode step (LiteRT), and after 200 QAT batches at a
tenth of the learning rate, of the QAT model and its data-free int8 step.

Fidelity (`--only qat_fidelity`), per method: how far a trained QAT token
classifier's int8 model (converted without data) lies from the QAT Keras
model, in output steps, in each int8 runtime (LiteRT's builtin kernels, its
reference kernels, its default XNNPACK delegate, TFLM), and how far the
runtimes lie from each other on the same `.tflite` file.
"""

import numpy as np
import tensorflow as tf

import keras_posenc
import tflite_export
from benchmarks._common import write
from keras_posenc import models
from keras_posenc.data import language_modeling as lm
from keras_posenc.data import recipes, synthetic
from keras_posenc.models.methods import QUANTIZED_METHODS
from tflite_export.verify import run_tflm

keras = tf.keras

#: Digits methods (a QAT model the converter refuses is counted in the table).
METHODS = ("none", "sinusoidal", "learned", "t5", "alibi", "dynamic_bias")
SEEDS = (0, 1, 2)
#: `(float batches, QAT batches)` of the LM, by `quick`.
LM_STEPS = {True: (100, 20), False: (1000, 200)}
#: LM methods: relative, absolute, learned-bias; `rope` for its post-training
#: loss; `xpos`, `gated` and `recursive`, whose rounding is modelled since.
LM_METHODS = (
    "alibi",
    "t5",
    "learned",
    "dynamic_bias",
    "rope",
    "xpos",
    "gated",
    "recursive",
)
#: The methods whose rounding is modelled since the tables above ran (their
#: own run, `--only qat_generators`, the same recipes): the position
#: generators (LM and digits) and the combined input (digits; the LM builder
#: runs it too, but its tables hold the relative methods).
GENERATOR_LM_METHODS = ("hpn", "hybrid")
GENERATOR_METHODS = ("hpn", "hybrid", "combined")
#: The fidelity table's token classifier (as `tests/export/test_export_qat.py`'s).
FIDELITY_MODEL = dict(
    vocab_size=10, sequence_length=16, hidden_dim=32, num_heads=4, num_layers=2
)
#: The int8 runtimes of the fidelity table: LiteRT's op resolvers by name,
#: then TFLM.
RUNTIMES = (
    ("LiteRT builtin", "BUILTIN_WITHOUT_DEFAULT_DELEGATES"),
    ("LiteRT reference", "BUILTIN_REF"),
    ("LiteRT XNNPACK", "AUTO"),
    ("TFLM", None),
)


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    return f"{np.mean(values):.3f} ± {(high - low) / 2:.3f}"


def _one(position, seed, data, epochs, qat_epochs):
    (train_x, train_y), (test_x, test_y) = data
    keras.utils.set_random_seed(seed)
    model = recipes.digits_classifier(position, hidden_dim=32)
    model.fit(train_x, train_y, epochs=epochs, batch_size=32, verbose=0)
    found = {"float": model.evaluate(test_x, test_y, verbose=0)[1]}
    ptq = tflite_export.convert(model, train_x, "int8")
    found["ptq"] = tflite_export.verify(ptq, None, test_x, test_y).accuracy_litert
    qat = recipes.compile_classifier(tflite_export.quantize_aware(model), 2e-4)
    qat.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
    found["qat_keras"] = qat.evaluate(test_x, test_y, verbose=0)[1]
    found.update(qat_litert=None, qat_tflm=None, size=None, arena=None, tfmot=None)
    try:
        qat_bytes = tflite_export.convert(qat, None, "int8")
    except tflite_export.ExportError as error:  # counted, and said in the table
        found["refused"] = str(error).splitlines()[0][:160]
    else:
        report = tflite_export.verify(qat_bytes, None, test_x, test_y)
        found.update(
            qat_litert=report.accuracy_litert,
            qat_tflm=report.accuracy_tflm,
            size=len(qat_bytes),
            arena=report.arena_bytes,
        )
    if not keras_posenc.IS_KERAS_3:
        tfmot = tflite_export.quantize_aware(model, engine="tfmot")
        tfmot = recipes.compile_classifier(tfmot, 2e-4)
        tfmot.fit(train_x, train_y, epochs=qat_epochs, batch_size=32, verbose=0)
        tfmot_bytes = tflite_export.convert(tfmot, train_x, "int8")
        found["tfmot"] = tflite_export.verify(
            tfmot_bytes, None, test_x, test_y
        ).accuracy_litert
    return found


def _lm_one(position, seed, data, quick):
    train_ids, validation_ids = data
    length = 32 if quick else 64
    steps, qat_steps = LM_STEPS[quick]
    model, _ = lm.train(position, train_ids, length, steps, seed=seed)
    text = lm.windows(validation_ids, length)[0][: 8 if quick else 32]
    calibration = lm.windows(train_ids, length, 8, seed)[0]
    ptq = tflite_export.convert_causal_lm(model, calibration, max_length=length)
    report = tflite_export.verify_causal_lm(ptq, model, text)
    found = {"float": report.bits_per_token_keras, "ptq": report.bits_per_token_litert}
    found.update(qat_keras=None, qat_litert=None, agreement=None)
    if position not in QUANTIZED_METHODS:
        return found
    qat = tflite_export.quantize_aware(model)
    qat.compile(
        keras.optimizers.Adam(3e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = lm.windows(train_ids, length, qat_steps * 32, seed + 100)
    qat.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    qat_bytes = tflite_export.convert_causal_lm(qat, None, max_length=length)
    report = tflite_export.verify_causal_lm(qat_bytes, qat, text)
    found.update(
        qat_keras=report.bits_per_token_keras, qat_litert=report.bits_per_token_litert
    )
    # Greedy generation through the int8 cache: TFLM against the QAT model.
    prompt, new = [list(validation_ids[:32])], 32 if quick else 256
    micro = tflite_export.convert_causal_lm(
        qat, None, max_length=32 + new, target="tflm"
    )
    want = qat.generate(prompt, new)[0, 32:]
    got = tflite_export.generate_tflite(micro, prompt, new, runtime="tflm")[0, 32:]
    found["agreement"] = float(np.mean(want == got))
    return found


def _bits(values):
    values = [v for v in values if v is not None]
    if not values:
        return "not modelled"
    return f"{np.mean(values):.3f} ± {np.ptp(values) / 2:.3f}"


def _lm_run(quick, seeds, methods=LM_METHODS, name="qat_lm"):
    steps, qat_steps = LM_STEPS[quick]
    data = lm.pydoc_bytes()
    rows = []
    for position in methods:
        runs = []
        for seed in seeds:  # each run printed as it ends (a run is minutes)
            runs.append(_lm_one(position, seed, data, quick))
            print(f"qat_lm {position} seed {seed}: {runs[-1]}", flush=True)
        column = {key: [run[key] for run in runs] for key in runs[0]}
        loss = [
            (q / f - 1.0) * 100 if q is not None else None
            for q, f in zip(column["qat_litert"], column["float"])
        ]
        ptq_loss = [(p / f - 1.0) * 100 for p, f in zip(column["ptq"], column["float"])]
        rows.append(
            [
                position,
                _bits(column["float"]),
                _bits(column["ptq"]),
                f"{np.mean(ptq_loss):+.1f}%",
                _bits(column["qat_keras"]),
                _bits(column["qat_litert"]),
                "n/a" if loss[0] is None else f"{np.mean(loss):+.1f}%",
                _bits(column["agreement"]),
            ]
        )
    keras_name = "keras3" if keras_posenc.IS_KERAS_3 else "keras2"
    write(
        f"{name}_{keras_name}" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "Quantization-aware training of the pydoc byte-level LM: bits per byte "
        f"(seeds {list(seeds)})",
        [
            "position",
            "float",
            "post-training int8 (LiteRT)",
            "PTQ vs float",
            "QAT, Keras",
            "QAT int8, LiteRT (no data)",
            "QAT int8 vs float",
            "greedy tokens, TFLM = QAT Keras",
        ],
        rows,
        [
            "teacher-forced bits per byte of held-out windows through the int8 "
            "decode step (LiteRT), against the float model on the same windows",
            "greedy tokens: the share of new tokens (256 after a 32-byte prompt) "
            "that int8 TFLM, its cache int8 throughout, generates as the QAT "
            "Keras model does",
            f"QAT: {qat_steps} batches at 3e-4 after the {steps} float batches "
            "(the float column is the model before them)",
        ],
    )


def run(quick):
    """Both parts (`python -m benchmarks --only qat`)."""
    run_lm(quick)
    run_digits(quick)


def run_lm(quick):
    """The LM part alone (`--only qat_lm`; about 6 CPU minutes a run here)."""
    if quick:  # a relative method and RoPE (its post-training loss)
        _lm_run(quick, SEEDS[:1], ("alibi", "rope"))
    else:
        _lm_run(quick, SEEDS)


def run_digits(quick):
    """The digits part alone (`--only qat_digits`; about 2 CPU minutes a run)."""
    _digits_run(quick, SEEDS[:1] if quick else SEEDS)


def run_generators(quick):
    """Both parts for `GENERATOR_LM_METHODS` / `GENERATOR_METHODS` alone
    (`--only qat_generators`; `qat_lm_generators_*.md`, `qat_generators_*.md`)."""
    seeds = SEEDS[:1] if quick else SEEDS
    _lm_run(quick, seeds, GENERATOR_LM_METHODS, "qat_lm_generators")
    _digits_run(quick, seeds, GENERATOR_METHODS, "qat_generators")


def _digits_run(quick, seeds, methods=METHODS, name="qat"):
    data = recipes.digits_data()
    epochs, qat_epochs = (3, 1) if quick else (25, 5)
    rows, notes = [], []
    for position in methods:
        runs = [_one(position, seed, data, epochs, qat_epochs) for seed in seeds]
        refused = [run.pop("refused") for run in runs if "refused" in run]
        column = {key: [run[key] for run in runs] for key in runs[0]}
        sizes = [size for size in column["size"] if size is not None]
        arenas = [arena for arena in column["arena"] if arena is not None]
        if refused:
            notes.append(
                f"{position}: the converter refused {len(refused)} of "
                f"{len(runs)} trained QAT models: {refused[0]}"
            )
        rows.append(
            [
                position,
                _spread(column["float"]),
                _spread(column["ptq"]),
                _spread(column["qat_keras"]),
                _spread(column["qat_litert"]),
                _spread(column["qat_tflm"]),
                _spread(column["tfmot"])
                if not keras_posenc.IS_KERAS_3
                else "Keras 2 only",
                int(np.mean(sizes)) if sizes else "n/a",
                arenas[0] if arenas else "n/a",
            ]
        )
    keras_name = "keras3" if keras_posenc.IS_KERAS_3 else "keras2"
    write(
        f"{name}_{keras_name}" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "Quantization-aware training on digits (D=32, 2 layers, "
        f"{epochs} float epochs, {qat_epochs} QAT epochs, seeds {list(seeds)})",
        [
            "position",
            "float",
            "post-training int8 (LiteRT)",
            "QAT, Keras",
            "QAT int8, LiteRT",
            "QAT int8, TFLM",
            "TF-MOT QAT int8, LiteRT",
            "QAT int8 bytes",
            "TFLM arena",
        ],
        rows,
        [
            "mean ± half the range over the seeds; accuracy on the 360 held-out "
            "images (one image is 0.0028)",
            "run it in both modes: `python -m benchmarks --only qat` and "
            "`TF_USE_LEGACY_KERAS=1 python -m benchmarks --only qat`",
            "n/a: no seed's QAT model converted (the reasons follow)",
            *notes,
        ],
    )


def run_fidelity(quick):
    """The int8 model against its QAT model and the runtimes against each
    other (`--only qat_fidelity`; `qat_fidelity_*.md`; ~45 s a method here)."""
    methods = ("none", "t5") if quick else QUANTIZED_METHODS
    rows = [_fidelity_row(position, quick) for position in methods]
    keras_name = "keras3" if keras_posenc.IS_KERAS_3 else "keras2"
    names = [name for name, _ in RUNTIMES]
    write(
        f"qat_fidelity_{keras_name}" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + "QAT int8 against its QAT Keras model, and int8 runtimes against each "
        "other: largest |difference| in output steps (mean)",
        ["position", *(f"QAT Keras vs {name}" for name in names)]
        + ["largest gap between two runtimes", "accuracy QAT Keras / int8 TFLM"],
        rows,
        [
            "a 2-layer token classifier (D=32, 4 heads, T=16) of the "
            "`relative_offset` lookup (10 classes), 5 float epochs and 1 QAT "
            "epoch (seed 0), converted without data; 64 held-out rows, 10 240 "
            "logits; a step is the int8 output's scale",
            "the runtimes run one `.tflite` file: LiteRT with its builtin "
            "(optimized) kernels, as `tflite_export.verify` runs it, with its "
            "reference kernels, with its default XNNPACK delegate; TFLM",
            "the largest gap between two runtimes is the most any single "
            "reference could be within of both: a QAT model one step from "
            "every runtime would need them within two steps of each other",
            "accuracy (per token, chance 0.1) says how far each model trained "
            "in its 6 epochs",
        ],
    )


def _fidelity_row(position, quick):
    keras.utils.set_random_seed(0)
    x, y = synthetic.make_task("relative_offset", 640, 16, seed=0)
    test_x, test_y = synthetic.make_task("relative_offset", 64, 16, seed=1)
    classifier = models.build_token_classifier(10, position=position, **FIDELITY_MODEL)
    model = recipes.compile_classifier(classifier, 3e-3)
    model.fit(x, y, epochs=2 if quick else 5, batch_size=64, verbose=0)
    qat = recipes.compile_classifier(tflite_export.quantize_aware(model), 5e-4)
    qat.fit(x, y, epochs=1, batch_size=64, verbose=0)
    model_bytes = tflite_export.convert(qat, None, mode="int8")
    static = tflite_export.static_model(qat, (16,), "int32")
    reference = np.asarray(static.predict(test_x, verbose=0))
    outputs, scale, zero = _int8_outputs(model_bytes, test_x)
    cells = []
    for name, _ in RUNTIMES:
        steps = np.abs((outputs[name] - zero) * scale - reference) / scale
        cells.append(f"{np.max(steps):.0f} ({np.mean(steps):.2f})")
    gaps = [
        np.max(np.abs(outputs[a] - outputs[b]))
        for i, (a, _) in enumerate(RUNTIMES)
        for b, _ in RUNTIMES[i + 1 :]
    ]
    accuracy = np.mean(np.argmax(reference, -1) == test_y)
    int8 = np.mean(np.argmax(outputs["TFLM"], -1) == test_y)
    print(f"qat_fidelity {position}: {cells} runtimes {max(gaps)}", flush=True)
    return [position, *cells, int(max(gaps)), f"{accuracy:.3f} / {int8:.3f}"]


def _int8_outputs(model_bytes, x):
    """`({runtime: int8 outputs as int64}, output scale, zero point)`."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    outputs = {}
    for name, resolver in RUNTIMES:
        if resolver is None:
            continue
        interpreter = Interpreter(
            model_content=model_bytes,
            experimental_op_resolver_type=getattr(OpResolverType, resolver),
        )
        interpreter.allocate_tensors()
        inp = interpreter.get_input_details()[0]
        out = interpreter.get_output_details()[0]
        rows = []
        for example in x:
            interpreter.set_tensor(inp["index"], example[None].astype(inp["dtype"]))
            interpreter.invoke()
            rows.append(interpreter.get_tensor(out["index"])[0])
        outputs[name] = np.stack(rows).astype(np.int64)
    raw, info = run_tflm(model_bytes, x.astype(inp["dtype"]))
    if raw is None:
        raise RuntimeError(f"TFLM did not run the model: {info['error']}")
    outputs["TFLM"] = np.asarray(raw).astype(np.int64)
    scale, zero = out["quantization"]
    return outputs, scale, zero
