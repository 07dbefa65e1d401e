"""Ours against keras-hub on each Keras 3 backend, side by side (`backends`).

One child process per backend (`KERAS_BACKEND`: tensorflow, jax, torch), so
each measures on its own backend, ours and keras-hub's in the same process:

- greedy generation: our `CausalLM.generate` (its compiled loop) against
  keras-hub's `GPT2CausalLM` of the same shape (`benchmarks/generate.py`:
  D=128, 2 layers, 4 heads, vocabulary 256, learned positions, 16 prompt
  tokens, then to 256), batch 1 and 8, each with its backend's best compile
  (TensorFlow: XLA, `jit_compile=True`; JAX: `jax.jit`; PyTorch: eager);
- the attention's training step: `model.train_on_batch` of a model holding
  one attention layer, ours and keras-hub's doing the same work
  (`benchmarks/peers.py`: no positions, T5, rotary), B=8, T=256, D=128, 4
  heads, compiled as Keras compiles on the backend (`jit_compile="auto"`).

Each cell is the median of interleaved rounds after a warm-up call.
`python -m benchmarks --only backends`.
"""

import json
import sys

import numpy as np

from benchmarks._common import interleaved, per_backend, write

BACKENDS = ("tensorflow", "jax", "torch")
PROMPT, TOTAL = 16, 256
BATCH, LENGTH, WIDTH, HEADS = 8, 256, 128, 4
METHODS = ("none", "t5", "rope")


def run(quick):
    rows = per_backend("benchmarks.backends", quick, BACKENDS)
    _write(rows.get("generation", []), rows.get("training", []), quick)


def _write(generation, training, quick):
    smoke = " (--quick: a smoke run)" if quick else ""
    rounds = 3 if quick else 7
    common = [
        f"median over {rounds} interleaved rounds in one process per backend after "
        "a warm-up call (the slowest and fastest round in brackets)",
        "`python -m benchmarks --only backends` (keras-hub: the `bench` extra; JAX "
        "and PyTorch: the `backends` extra)",
    ]
    write(
        "backends_generate",
        f"Greedy generation per backend, tokens/s: ours against keras-hub's "
        f"GPT2CausalLM{smoke}",
        ["backend", "batch", "compiled", "ours", "keras-hub", "ours / keras-hub"],
        generation,
        [
            "the shapes of `benchmarks/generate.py`: D=128, 2 layers, 4 heads, "
            f"vocabulary 256, {PROMPT} prompt tokens then to {TOTAL} (64 with --quick)",
            "PyTorch: both eager (Keras compiles only its own train and predict "
            "steps there)",
            *common,
        ],
    )
    write(
        "backends_train",
        f"Attention training step per backend, ms: ours against keras-hub's layer "
        f"doing the same work{smoke}",
        ["backend", "method", "peer", "ours ms", "peer ms", "ours / peer"],
        training,
        [
            f"`train_on_batch` of one attention layer and an MSE loss, B={BATCH}, "
            f"T={LENGTH} (64 with --quick), D={WIDTH}, {HEADS} heads; the pairs of "
            "`benchmarks/peers.py`",
            *common,
        ],
    )


def _timed(runs, rounds):
    """`{name: (median, slowest, fastest)}` seconds of each call, interleaved."""
    for fn in runs.values():
        fn()  # trace and compile
    times = interleaved(runs, rounds)
    return {name: (np.median(t), max(t), min(t)) for name, t in times.items()}


def _generation_rows(backend, quick, rounds):
    from benchmarks.generate import gpt2
    from keras_posenc.models import build_causal_lm
    from keras_posenc.utils import keras

    total = 64 if quick else TOTAL
    new = total - PROMPT
    jit = backend == "tensorflow"  # JAX always compiles; PyTorch runs eagerly
    keras.utils.set_random_seed(0)
    ours = build_causal_lm(
        256,
        hidden_dim=128,
        num_layers=2,
        num_heads=4,
        position="learned",
        position_options={"max_length": total},
    )
    theirs = gpt2(256, 128, 2, 4, total, jit_compile=jit)
    rows = []
    for batch in (1, 8):
        prompts = np.random.default_rng(batch).integers(1, 256, (batch, PROMPT))
        padded = np.zeros((batch, total), "int32")
        padded[:, :PROMPT] = prompts
        mask = np.zeros((batch, total), bool)
        mask[:, :PROMPT] = True
        inputs = {"token_ids": padded, "padding_mask": mask}
        runs = {
            "ours": lambda p=prompts: ours.generate(p, new, jit_compile=jit),
            "theirs": lambda i=inputs: theirs.generate(i, stop_token_ids=None),
        }
        times = _timed(runs, rounds)
        rate = {n: [batch * new / t for t in times[n]] for n in times}
        compiled = {"tensorflow": "XLA", "jax": "jax.jit", "torch": "eager"}[backend]
        rows.append(
            [backend, batch, compiled]
            + [f"{r[0]:.0f} ({r[1]:.0f}-{r[2]:.0f})" for r in rate.values()]
            + [f"{rate['ours'][0] / rate['theirs'][0]:.2f}x"]
        )
    return rows


def _training_rows(backend, quick, rounds):
    from benchmarks import peers
    from keras_posenc.utils import keras

    length = 64 if quick else LENGTH
    x = np.random.default_rng(0).normal(size=(BATCH, length, WIDTH)).astype("float32")
    rows = []
    for method in METHODS:
        keras.utils.set_random_seed(0)
        layers = peers.pair(method, HEADS, WIDTH // HEADS, WIDTH, peers.METHODS[method])
        models = {}
        for name, layer in zip(("ours", "theirs"), layers):
            inputs = keras.Input((length, WIDTH))
            model = keras.Model(inputs, layer(inputs, inputs))
            model.compile("adam", "mse")
            models[name] = model
        runs = {n: (lambda m=m: m.train_on_batch(x, x)) for n, m in models.items()}
        times = _timed(runs, rounds)
        ms = {n: [1000 * t for t in times[n]] for n in times}
        rows.append(
            [backend, method, peers.PEER_NAMES[method]]
            + [f"{v[0]:.1f} ({v[2]:.1f}-{v[1]:.1f})" for v in ms.values()]
            + [f"{ms['ours'][0] / ms['theirs'][0]:.2f}x"]
        )
    return rows


def child(backend, quick):
    """Measures on this process's backend; prints the rows as one JSON line."""
    import keras_posenc  # noqa: F401 (first: TensorFlow's start-up lines off)

    rounds = 3 if quick else 7
    rows = {
        "generation": _generation_rows(backend, quick, rounds),
        "training": _training_rows(backend, quick, rounds),
    }
    print(json.dumps(rows))


if __name__ == "__main__":
    child(sys.argv[1], "--quick" in sys.argv[2:])
