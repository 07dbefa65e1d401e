"""Greedy generation against keras-hub's `GPT2CausalLM` of the same shape (`generate`).

Both models: width 128, 2 layers, 4 heads, feed-forward width 256 (ours is
`2 x width`), a 256-token vocabulary, learned positions, total length 256
(16 prompt tokens + 240 new). keras-hub's model is built from its config
with `preprocessor=None` (random weights, no download) and generates to the
end of its padded width with `stop_token_ids=None`; ours generates 240 new
tokens. Both compiled once and warmed up; then the rounds interleave ours
and theirs in one process, per batch size and compile mode, and each cell is
the median over the rounds. Also our step-by-step loop (`compiled_loop=False`,
one compiled step per token from Python), the loop the exports decode with.
"""

import time

import numpy as np
import tensorflow as tf

from benchmarks import peers
from benchmarks._common import interleaved, write
from keras_posenc.models import build_causal_lm

WIDTH, LAYERS, HEADS, VOCAB = 128, 2, 4, 256
PROMPT, TOTAL = 16, 256


def ours():
    tf.keras.utils.set_random_seed(0)
    return build_causal_lm(
        VOCAB,
        hidden_dim=WIDTH,
        num_layers=LAYERS,
        num_heads=HEADS,
        position="learned",
        position_options={"max_length": TOTAL},
    )


def theirs(jit_compile):
    return gpt2(VOCAB, WIDTH, LAYERS, HEADS, TOTAL, jit_compile)


def gpt2(vocab, width, layers, heads, length, jit_compile=False):
    """keras-hub's greedy `GPT2CausalLM` of a shape (random weights, seeded)."""
    import keras_hub

    tf.keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=width,
        intermediate_dim=2 * width,
        dropout=0.0,
        max_sequence_length=length,
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="greedy", jit_compile=jit_compile)
    return model


def run(quick):
    if not peers.available():
        print(f"generate: skipped, it needs {peers.NEEDS}")
        return
    rounds = 3 if quick else 7
    total = 64 if quick else TOTAL
    new = total - PROMPT
    model = ours()
    rows = []
    for batch in (1, 8):
        prompts = np.random.default_rng(batch).integers(1, VOCAB, (batch, PROMPT))
        padded = np.zeros((batch, TOTAL), "int32")
        padded[:, :PROMPT] = prompts
        mask = np.zeros((batch, TOTAL), bool)
        mask[:, :PROMPT] = True
        inputs = {"token_ids": padded[:, :total], "padding_mask": mask[:, :total]}
        for jit in (False, True):
            times, first = _rounds(
                model, theirs(jit), prompts, inputs, new, jit, rounds
            )
            rate = {n: batch * new / np.median(t) for n, t in times.items()}
            names = list(times)
            spread = {
                n: (batch * new / max(t), batch * new / min(t))
                for n, t in times.items()
            }
            rows.append(
                [
                    batch,
                    "XLA" if jit else "graph",
                    *(
                        f"{rate[n]:.0f} ({spread[n][0]:.0f}-{spread[n][1]:.0f})"
                        for n in names
                    ),
                    f"{rate['ours'] / rate['keras-hub']:.2f}x",
                    f"{first['ours']:.2f} / {first['keras-hub']:.2f}",
                    f"{first['ours, new max_new_tokens']:.3f} / "
                    f"{np.median(times['ours']):.3f}",
                ]
            )
            print(rows[-1], flush=True)
    write(
        "generate",
        f"Greedy generation, tokens/s: {new} new tokens after a {PROMPT}-token "
        f"prompt, D={WIDTH}, {LAYERS} layers, {HEADS} heads, vocabulary {VOCAB}",
        [
            "batch",
            "compiled",
            "ours (one compiled loop)",
            "ours (step loop)",
            "keras-hub GPT2CausalLM",
            "ours / keras-hub",
            "first call s, ours / keras-hub",
            "ours: new max_new_tokens / repeated call, s",
        ],
        rows,
        [
            f"median over {rounds} interleaved rounds in one process after "
            "warm-up (the slowest and fastest round in brackets)",
            "keras-hub prefills the whole padded width and restacks every "
            "layer's cache at each step; ours prefills the prompt, writes "
            "each step's keys and values in place and reads the slots up to "
            "the step's position (under XLA, up to the end of its phase: "
            "phases of at least 256 slots, so here one; one `tf.while_loop`)",
            "first call: the call that traces (and compiles); a new "
            "`max_new_tokens` (7 fewer) right after it reuses our trace (one "
            "per batch size and prompt bucket: the loop is as wide as the "
            "model's cache)",
            "`python -m benchmarks --only generate` (keras-hub: the `bench` "
            "extra, Keras 3)",
        ],
    )


def _rounds(model, peer, prompts, inputs, new, jit, rounds):
    """Seconds per call of each generator, `rounds` interleaved rounds."""
    runs = {
        "ours": lambda: model.generate(prompts, new, jit_compile=jit),
        "ours, step loop": lambda: model.generate(
            prompts, new, jit_compile=jit, compiled_loop=False
        ),
        "keras-hub": lambda: peer.generate(inputs, stop_token_ids=None),
    }
    first = {}
    for name, fn in runs.items():
        start = time.perf_counter()
        fn()  # trace and compile
        first[name] = time.perf_counter() - start
    start = time.perf_counter()  # a new length: the same trace (ours)
    model.generate(prompts, new - 7, jit_compile=jit)
    first["ours, new max_new_tokens"] = time.perf_counter() - start
    generated = runs["keras-hub"]()["token_ids"]
    assert (generated[:, PROMPT:] != 0).any(), "keras-hub generated nothing"
    return interleaved(runs, rounds), first
