"""An LM's memory on a microcontroller: key heads, K/V caches, 4 bits (`lm_memory`).

The README's pydoc LM shape (byte-level `alibi`, D=64, 2 layers, 4 heads,
V=256) trained for one epoch on 4,096 windows of 64 bytes, for
`num_key_value_heads` 4 (multi-head), 2 and 1, each with 3 seeds. Each
model's int8 TFLM decode step (`convert_causal_lm(target="tflm")`, keys and
values in their own int8 caches) at S=128 and 512, with int8 and 4-bit
(`mode="int4"`) kernels: flash (the `.tflite`), the smallest TFLM arena that
allocates (`verify_causal_lm`), the caches' bytes (`device_contract`) and
teacher-forced bits per byte on held-out text, against float Keras; and the
same for the model fine-tuned quantization-aware with 8- and 4-bit kernels.
"""

import numpy as np
import tensorflow as tf

import tflite_export
from benchmarks._common import summary, write
from keras_posenc import RelativeMultiHeadAttention
from keras_posenc.data import language_modeling as lm
from keras_posenc.models import build_causal_lm
from keras_posenc.utils import nested_layers

WIDTH, LAYERS, HEADS = 64, 2, 4
KEY_HEADS = (4, 2, 1)
LENGTHS = (128, 512)
MODES = ("int8", "int4")


def trained(kv_heads, seed, quick):
    tf.keras.utils.set_random_seed(seed)
    model = build_causal_lm(
        lm.VOCAB_SIZE,
        hidden_dim=WIDTH,
        num_layers=LAYERS,
        num_heads=HEADS,
        position="alibi",
        num_key_value_heads=kv_heads,
    )
    train, _ = lm.pydoc_bytes()
    x, y = lm.windows(train, length=64, count=512 if quick else 4096, seed=seed)
    model.compile(
        tf.keras.optimizers.Adam(3e-3),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    return model, x[:8]


def equalized(model):
    """A copy of `model` whose key and value heads have equal kernel norms.

    Head equalization, data-free: key head j's kernel and bias times
    `a_j = mean norm / norm_j`, its query heads' times `1 / a_j` (the logits
    are unchanged); value head j's times `b_j`, the output projection's rows
    of the query heads reading it times `1 / b_j` (the output is unchanged).
    Heads of different magnitude then share one per-tensor cache range
    better. The float function is the model's (checked).
    """
    copy = type(model).from_config(model.get_config())
    sample = np.zeros((1, 8), "int32")
    copy(sample)
    copy.set_weights(model.get_weights())
    for layer in nested_layers(copy):
        if not isinstance(layer, RelativeMultiHeadAttention):
            continue
        heads, kv_heads = layer.num_heads, layer.num_key_value_heads
        size = layer.key_dim
        group = heads // kv_heads
        for dense, answer in (
            (layer.key_dense, layer.query_dense),
            (layer.value_dense, layer.output_dense),
        ):
            kernel = dense.kernel.numpy().reshape(-1, kv_heads, size)
            norms = np.linalg.norm(kernel, axis=(0, 2))
            factor = norms.mean() / np.maximum(norms, 1e-12)  # (kv_heads,)
            dense.kernel.assign(
                (kernel * factor[None, :, None]).reshape(-1, kv_heads * size)
            )
            dense.bias.assign(
                (dense.bias.numpy().reshape(kv_heads, size) * factor[:, None]).reshape(
                    -1
                )
            )
            undo = np.repeat(1.0 / factor, group)  # (heads,): per query head
            if answer is layer.query_dense:
                q = answer.kernel.numpy().reshape(-1, heads, size)
                answer.kernel.assign(
                    (q * undo[None, :, None]).reshape(-1, heads * size)
                )
                b = answer.bias.numpy().reshape(heads, size) * undo[:, None]
                answer.bias.assign(b.reshape(-1))
            else:  # the output projection's rows, head by head
                o = answer.kernel.numpy().reshape(heads, size, -1)
                answer.kernel.assign(
                    (o * undo[:, None, None]).reshape(heads * size, -1)
                )
    np.testing.assert_allclose(copy(sample), model(sample), atol=1e-4)
    return copy


def fine_tuned_qat(model, kernel_bits, seed, quick):
    """`quantize_aware(model, kernel_bits)` trained one epoch on 1,024 more
    windows (other windows than the float model's) at a tenth of its rate."""
    qat = tflite_export.quantize_aware(model, kernel_bits=kernel_bits)
    train, _ = lm.pydoc_bytes()
    x, y = lm.windows(train, length=64, count=128 if quick else 1024, seed=seed + 100)
    qat.compile(
        tf.keras.optimizers.Adam(3e-4),
        tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    qat.fit(x, y, batch_size=32, epochs=1, verbose=0)
    return qat


def measure(model, calibration, length, mode, text):
    model_bytes = tflite_export.convert_causal_lm(
        model, calibration, mode=mode, max_length=length, target="tflm"
    )
    report = tflite_export.verify_causal_lm(model_bytes, model, text)
    contract = tflite_export.device_contract(model_bytes)
    return {
        "flash": len(model_bytes),
        "arena": report.arena_bytes,
        "cache": contract.cache_bytes,
        "keras": report.bits_per_token_keras,
        "tflm": report.bits_per_token_litert,
    }


def run(quick):
    seeds = (0,) if quick else (0, 1, 2)
    lengths = LENGTHS[:1] if quick else LENGTHS
    _, held = lm.pydoc_bytes()
    text = held[: 4 * 64].reshape(4, 64)
    cells = {}
    for kv_heads in KEY_HEADS:
        for seed in seeds:
            model, calibration = trained(kv_heads, seed, quick)
            variants = {  # mode -> (model, calibration: None for trained ranges)
                **{mode: (model, calibration) for mode in MODES},
                "int8, equalized": (equalized(model), calibration),
                "int8, QAT": (fine_tuned_qat(model, 8, seed, quick), None),
                "int4, QAT": (fine_tuned_qat(model, 4, seed, quick), None),
            }
            for length in lengths:
                for mode, used in variants.items():
                    kernels = mode.split(",")[0]
                    found = measure(*used, length, kernels, text)
                    cells.setdefault((kv_heads, length, mode), []).append(found)
                    print(kv_heads, seed, length, mode, found, flush=True)
    rows = []
    for (kv_heads, length, mode), runs in cells.items():
        base = cells[(HEADS, length, "int8")]

        def mean(key, runs=runs):
            return float(np.mean([r[key] for r in runs]))

        def ratio(key, runs=runs, base=base):
            return mean(key, runs) / float(np.mean([r[key] for r in base]))

        excess = [r["tflm"] / r["keras"] - 1 for r in runs]
        rows.append(
            [
                kv_heads,
                length,
                mode,
                f"{mean('flash'):,.0f} ({ratio('flash'):.2f}x)",
                f"{mean('arena'):,.0f} ({ratio('arena'):.2f}x)",
                f"{mean('cache'):,.0f} ({ratio('cache'):.2f}x)",
                summary([r["keras"] for r in runs]),
                summary([r["tflm"] for r in runs]),
                summary([100 * e for e in excess]) + "%",
            ]
        )
    write(
        "lm_memory" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + f"An int8 TFLM decode step of the pydoc LM (alibi, D={WIDTH}, "
        f"{LAYERS} layers, {HEADS} query heads): key heads, cache length, "
        "kernel bits",
        [
            "key heads",
            "S",
            "kernels",
            "flash bytes (vs 4 heads, int8)",
            "TFLM arena bytes (vs 4 heads, int8)",
            "cache bytes (vs 4 heads, int8)",
            "bits/byte, float Keras",
            "bits/byte, int8 TFLM step",
            "TFLM over Keras",
        ],
        rows,
        [
            f"{len(seeds)} seed(s): means (and ± half the spread) over seeds; "
            "bits per byte teacher-forced on 4 held-out rows of 64 bytes",
            "keys and values are separate int8 caches with their own ranges "
            "(calibrated on 8 training windows); `int8, equalized`: the same "
            "model with its key and value heads' kernel norms equalized (folded "
            "into the query and output projections, the float function "
            "unchanged: `equalized` in this file), a data-free try",
            "`int8, QAT` and `int4, QAT`: `quantize_aware(model, kernel_bits=8 "
            "or 4)` fine-tuned one epoch on 1,024 other windows at a tenth of "
            "the rate, converted without data (its float Keras column is the "
            "QAT model's own; the fine-tuning trains it further, so compare "
            "`int4, QAT` with `int8, QAT`)",
            "int4: FULLY_CONNECTED kernels at 4 bits, one scale per kernel "
            "(TFLM refuses per-channel INT4: `docs/edge.md`); activations int8",
            "`python -m benchmarks --only lm_memory`",
        ],
    )
