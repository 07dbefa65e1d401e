"""A byte-level LM in LiteRT-LM, the package's loops and keras-hub (`litertlm`).

The model: a `rope` causal LM (D=64, 2 layers, 4 heads; 258 ids: 256 bytes,
`<bos>` 256, `<eos>` 257) trained for one short epoch on the pydoc text
(`keras_posenc.data.language_modeling`), exported by
`tflite_export.convert_litert_lm` in each mode (context 256, prefill
signatures 16 and 128). Rates, one process, after a warm-up call of each:

- the engine (`litert_lm.Engine`, CPU, 1 and 2 threads): its own benchmark
  record of a 100-byte prompt's prefill and 100 decoded tokens;
- `generate_tflite` on `convert_causal_lm`'s float32 LiteRT export (the
  package's Python loop over the interpreter), the package's Keras
  `generate` (one compiled loop), and keras-hub's `GPT2CausalLM` of the
  same shape (random weights, `preprocessor=None`, greedy): prefill rate
  = prompt / time of one new token; decode rate = 99 / (time of 100 new
  tokens - time of one), medians of 5;
- per mode: the `.litertlm` size and the greedy agreement of the engine's
  text with Keras' (the share of 100 new bytes equal at their place, over
  4 prompts).
"""

import pathlib
import tempfile

import numpy as np
import tensorflow as tf

from benchmarks import generate, peers
from benchmarks._common import median_seconds, write
from keras_posenc.data.language_modeling import pydoc_bytes
from keras_posenc.models import build_causal_lm

WIDTH, LAYERS, HEADS, VOCAB = 64, 2, 4, 258
BOS, EOS = 256, 257
CONTEXT, PREFILLS = 256, (16, 128)
PROMPTS = [
    "The class statement defines",
    "Return the value of",
    "If the object",
    "A list comprehension",
]
NEW = 100


def trained(quick):
    tf.keras.utils.set_random_seed(0)
    model = build_causal_lm(
        VOCAB, hidden_dim=WIDTH, num_layers=LAYERS, num_heads=HEADS, position="rope"
    )
    text, _ = pydoc_bytes()
    count = 500 if quick else 6000
    windows = text[: count * 65].reshape(count, 65)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(3e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(windows[:, :-1], windows[:, 1:], batch_size=32, verbose=0)
    return model, windows[:8]


def _prompt(length):
    text, _ = pydoc_bytes()
    return [BOS, *text[1000 : 1000 + length - 1].tolist()]


def _rates(run_for, prompt_length):
    """(prefill, decode) tokens/s of `run_for(new_tokens)`."""
    one = median_seconds(lambda: run_for(1), warmup=1)
    many = median_seconds(lambda: run_for(NEW), warmup=1)
    decode = (NEW - 1) / (many - one) if many > one else float("nan")
    return prompt_length / one, decode


def _engine_rates(litert_lm, path, threads, prompt):
    backend = litert_lm.Backend.CPU(thread_count=threads)
    engine = litert_lm.Engine(str(path), backend=backend, enable_benchmark=True)
    text = bytes(prompt[1:]).decode("utf-8", "replace")
    infos = []
    for _ in range(4):  # the first is the warm-up
        session = engine.create_session(
            apply_prompt_template=False,
            sampler_config=litert_lm.SamplerConfig(top_k=1),
            max_output_tokens=NEW,
        )
        session.run_prefill([text])
        session.run_decode()
        infos.append(session.get_benchmark_info())
        session.close()
    engine.close()
    prefill = np.median([i.last_prefill_tokens_per_second for i in infos[1:]])
    decode = np.median([i.last_decode_tokens_per_second for i in infos[1:]])
    return float(prefill), float(decode)


def _agreement(litert_lm, path, model):
    """Share of new bytes equal to Keras' greedy bytes at their place."""
    engine = litert_lm.Engine(str(path), backend=litert_lm.Backend.CPU())
    same = total = 0
    for text in PROMPTS:
        ids = [BOS, *text.encode()]
        want = model.generate([ids], max_new_tokens=NEW)[0][len(ids) :]
        session = engine.create_session(
            apply_prompt_template=False,
            sampler_config=litert_lm.SamplerConfig(top_k=1),
            max_output_tokens=NEW,
        )
        session.run_prefill([text])
        got = session.run_decode().texts[0].encode()
        session.close()
        same += sum(a == b for a, b in zip(got, want.tolist()))
        total += len(want)
    engine.close()
    return same / total


def run(quick):
    try:
        import litert_lm
    except ImportError:
        print("litertlm: skipped, it needs the litertlm extra (litert-lm-api)")
        return
    import tflite_export

    model, ids = trained(quick)
    prompt = _prompt(100)
    rows, sizes, agreement = [], {}, {}
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for mode in tflite_export.LITERT_LM_MODES:
            paths[mode] = tflite_export.convert_litert_lm(
                model,
                pathlib.Path(folder) / f"{mode}.litertlm",
                start_token=BOS,
                stop_tokens=(EOS,),
                max_num_tokens=CONTEXT,
                prefill_lengths=PREFILLS,
                mode=mode,
                calibration_ids=ids if mode == "int8_float_io" else None,
            )
            sizes[mode] = paths[mode].stat().st_size
            agreement[mode] = _agreement(litert_lm, paths[mode], model)
            for threads in (1, 2):
                prefill, decode = _engine_rates(litert_lm, paths[mode], threads, prompt)
                rows.append(
                    [
                        f"LiteRT-LM engine, {mode}",
                        threads,
                        f"{prefill:.0f}",
                        f"{decode:.0f}",
                    ]
                )
                print(rows[-1], flush=True)
    lite = tflite_export.convert_causal_lm(
        model, ids, mode="float32", max_length=CONTEXT
    )
    rates = _rates(
        lambda n: tflite_export.generate_tflite(lite, [prompt], n), len(prompt)
    )
    rows.append(
        [
            "generate_tflite (float32 LiteRT, Python loop)",
            1,
            *(f"{r:.0f}" for r in rates),
        ]
    )
    rates = _rates(lambda n: model.generate([prompt], max_new_tokens=n), len(prompt))
    rows.append(
        ["Keras `generate` (one compiled loop)", "-", *(f"{r:.0f}" for r in rates)]
    )
    if peers.available():
        peer = generate.gpt2(VOCAB, WIDTH, LAYERS, HEADS, CONTEXT)
        padded = np.zeros((1, CONTEXT), "int32")
        padded[0, : len(prompt)] = prompt

        def theirs(n):
            width = len(prompt) + n
            mask = np.zeros((1, width), bool)
            mask[0, : len(prompt)] = True
            inputs = {"token_ids": padded[:, :width], "padding_mask": mask}
            return peer.generate(inputs, stop_token_ids=None)

        rates = _rates(theirs, len(prompt))
        rows.append(
            ["keras-hub GPT2CausalLM (same shape)", "-", *(f"{r:.0f}" for r in rates)]
        )
    for row in rows:
        print(row)
    notes = [
        "file size: "
        + ", ".join(f"{mode} {size / 1024:.0f} KiB" for mode, size in sizes.items()),
        "greedy agreement of the engine's text with Keras' (100 new bytes, 4 "
        "prompts): "
        + ", ".join(f"{mode} {share:.0%}" for mode, share in agreement.items()),
        f"prompt {len(prompt)} tokens; decode {NEW} new tokens; engine rates are "
        "its own benchmark record (median of 3 sessions after a warm-up), the "
        "others wall-clock medians of 5",
        "`python -m benchmarks --only litertlm` (the litertlm extra; keras-hub: "
        "the bench extra, Keras 3)",
    ]
    write(
        "litertlm" + ("_quick" if quick else ""),
        ("SMOKE RUN: " if quick else "")
        + f"A byte-level rope LM (D={WIDTH}, {LAYERS} layers, {HEADS} heads, "
        f"{VOCAB} ids) in LiteRT-LM and beside it, tokens/s",
        ["runner", "threads", "prefill tokens/s", "decode tokens/s"],
        rows,
        notes,
    )
