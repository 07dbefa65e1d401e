"""A Llama-shaped decoder, ours against keras-hub's `LlamaCausalLM` (`decoders`).

One child process per Keras 3 backend (TensorFlow, JAX, PyTorch), ours and
keras-hub's in the same process and with the same weights: keras-hub builds
the model (D=256, 4 layers, 8 heads, 2 key/value heads, SwiGLU of width
512, vocabulary 512) and `models.from_keras_hub` imports it, so both compute
the same function (the table gives the largest logit difference). Measured:

- the training step: `train_on_batch` with a cross-entropy loss, B=8, T=128,
  Adam, as Keras compiles on the backend;
- greedy generation, tokens/s: 16 prompt tokens then to 128, batch 1 and 8,
  each with its backend's best compile (TensorFlow: XLA; JAX: `jax.jit`;
  PyTorch: eager, both).

Each cell is the median of interleaved rounds after a warm-up call.
`python -m benchmarks --only decoders`.
"""

import json
import sys

import numpy as np

from benchmarks._common import interleaved, per_backend, write

BACKENDS = ("tensorflow", "jax", "torch")
SHAPE = dict(
    vocabulary_size=512,
    num_layers=4,
    num_query_heads=8,
    num_key_value_heads=2,
    hidden_dim=256,
    intermediate_dim=512,
)
BATCH, LENGTH, PROMPT, TOTAL = 8, 128, 16, 128


def run(quick):
    rows = per_backend("benchmarks.decoders", quick, BACKENDS)
    _write(rows.get("training", []), rows.get("generation", []), quick)


def _write(training, generation, quick):
    smoke = " (--quick: a smoke run)" if quick else ""
    rounds = 3 if quick else 7
    shape = (
        "D=256, 4 layers, 8 heads, 2 key/value heads, SwiGLU 512, vocabulary 512: "
        "keras-hub's `LlamaCausalLM`, and ours imported from it "
        "(`models.from_keras_hub`, the same weights)"
    )
    common = [
        shape,
        f"median over {rounds} interleaved rounds in one process per backend after "
        "a warm-up call (the fastest and slowest round in brackets)",
        "`python -m benchmarks --only decoders` (keras-hub: the `bench` extra; JAX "
        "and PyTorch: the `backends` extra)",
    ]
    write(
        "decoders_train",
        f"Llama-shaped training step per backend, ms: ours against keras-hub{smoke}",
        ["backend", "ours ms", "keras-hub ms", "ours / keras-hub", "max |logit diff|"],
        training,
        [f"`train_on_batch`, B={BATCH}, T={LENGTH} (32 with --quick), Adam", *common],
    )
    write(
        "decoders_generate",
        f"Llama-shaped greedy generation per backend, tokens/s: ours against "
        f"keras-hub{smoke}",
        ["backend", "batch", "compiled", "ours", "keras-hub", "ours / keras-hub"],
        generation,
        [f"{PROMPT} prompt tokens then to {TOTAL} (48 with --quick)", *common],
    )


def _timed(runs, rounds):
    for fn in runs.values():
        fn()  # trace and compile
    times = interleaved(runs, rounds)
    return {name: (np.median(t), min(t), max(t)) for name, t in times.items()}


def _models():
    import keras_hub

    from keras_posenc import models
    from keras_posenc.utils import keras

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(**SHAPE)
    hub = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    return hub, models.from_keras_hub(hub), keras


def _training_rows(backend, quick, rounds, hub, ours, keras):
    length = 32 if quick else LENGTH
    rng = np.random.default_rng(0)
    ids = rng.integers(1, SHAPE["vocabulary_size"], (BATCH, length + 1)).astype("int32")
    x, y = ids[:, :-1], ids[:, 1:]
    inputs = {"token_ids": x, "padding_mask": np.ones_like(x, bool)}
    difference = np.abs(
        keras.ops.convert_to_numpy(ours(x)) - keras.ops.convert_to_numpy(hub(inputs))
    ).max()
    for model in (hub, ours):
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    runs = {
        "ours": lambda: ours.train_on_batch(x, y),
        "theirs": lambda: hub.train_on_batch(inputs, y),
    }
    times = _timed(runs, rounds)
    ms = {n: [1000 * t for t in times[n]] for n in times}
    return [
        [backend]
        + [f"{v[0]:.1f} ({v[1]:.1f}-{v[2]:.1f})" for v in ms.values()]
        + [f"{ms['ours'][0] / ms['theirs'][0]:.2f}x", f"{difference:.1e}"]
    ]


def _generation_rows(backend, quick, rounds, hub, ours):
    total = 48 if quick else TOTAL
    new = total - PROMPT
    jit = backend == "tensorflow"  # JAX always compiles; PyTorch runs eagerly
    hub.compile(sampler="greedy")
    rows = []
    for batch in (1, 8):
        prompts = np.random.default_rng(batch).integers(1, 512, (batch, PROMPT))
        padded = np.zeros((batch, total), "int32")
        padded[:, :PROMPT] = prompts
        mask = np.zeros((batch, total), bool)
        mask[:, :PROMPT] = True
        inputs = {"token_ids": padded, "padding_mask": mask}
        runs = {
            "ours": lambda p=prompts: ours.generate(p, new, jit_compile=jit),
            "theirs": lambda i=inputs: hub.generate(i, stop_token_ids=None),
        }
        times = _timed(runs, rounds)
        rate = {n: [batch * new / t for t in times[n]] for n in times}
        compiled = {"tensorflow": "XLA", "jax": "jax.jit", "torch": "eager"}[backend]
        rows.append(
            [backend, batch, compiled]
            + [f"{r[0]:.0f} ({r[2]:.0f}-{r[1]:.0f})" for r in rate.values()]
            + [f"{rate['ours'][0] / rate['theirs'][0]:.2f}x"]
        )
    return rows


def child(backend, quick):
    """Measures on this process's backend; prints the rows as one JSON line."""
    import keras_posenc  # noqa: F401 (first: TensorFlow's start-up lines off)

    rounds = 3 if quick else 7
    hub, ours, keras = _models()
    rows = {
        "training": _training_rows(backend, quick, rounds, hub, ours, keras),
        "generation": _generation_rows(backend, quick, rounds, hub, ours),
    }
    print(json.dumps(rows))


if __name__ == "__main__":
    child(sys.argv[1], "--quick" in sys.argv[2:])
