"""The compiled decoding steps of `CausalLM.generate` (with and without cache)."""

import numpy as np
import tensorflow as tf

from keras_posenc._backend import compiled, to_numpy, xp


def compile_steps(model, batch_size, total_length, use_cache, jit_compile):
    """`(prefill, step)` tf.functions of `model` for one batch and total length."""
    if use_cache:
        shapes = model.cache_shapes(batch_size, total_length)
        cache_spec = [tf.TensorSpec(shape, xp.float32) for shape in shapes]

        def run(tokens, cache, index):
            # Float32 caches between steps, the compute dtype inside (mixed
            # precision computes in float16 / bfloat16).
            inside = [xp.cast(c, model.compute_dtype) for c in cache]
            logits, inside = model.call_with_cache(tokens, inside, index)
            cache = [xp.cast(c, xp.float32) for c in inside]
            return xp.cast(logits[:, -1], xp.float32), cache

        prefill = compiled(
            run,
            [
                tf.TensorSpec((batch_size, None), xp.int32),
                cache_spec,
                tf.TensorSpec((), xp.int32),
            ],
            jit_compile,
            model.variables,
        )
        step = compiled(
            run,
            [
                tf.TensorSpec((batch_size, 1), xp.int32),
                cache_spec,
                tf.TensorSpec((), xp.int32),
            ],
            jit_compile,
            model.variables,
        )
    else:
        prefill = None
        step = compiled(
            lambda tokens: model.logits(tokens),
            [tf.TensorSpec((batch_size, total_length), xp.int32)],
            jit_compile,
            model.variables,
        )
    return prefill, step


def decoding_steps(model, batch, total, use_cache, jit_compile):
    """NumPy `(prefill, step)` callables of `generation.generate_tokens`."""
    if not use_cache:
        return _full_steps(model, batch, total, jit_compile)
    run_prefill, run_step = model.compiled_steps(batch, total, True, jit_compile)
    state = {"cache": model.empty_cache(batch, total)}

    def prefill(tokens):
        logits, state["cache"] = run_prefill(
            xp.constant(tokens), state["cache"], xp.constant(0)
        )
        return to_numpy(logits)

    def step(tokens, index):
        logits, state["cache"] = run_step(
            xp.constant(tokens), state["cache"], xp.constant(index, xp.int32)
        )
        return to_numpy(logits)

    return prefill, step


def _full_steps(model, batch, total, jit_compile):
    _, full = model.compiled_steps(batch, total, False, jit_compile)
    buffer = np.zeros((batch, total), np.int32)

    def prefill(tokens):
        buffer[:, : tokens.shape[1]] = tokens
        return to_numpy(full(buffer))[:, tokens.shape[1] - 1]

    def step(tokens, index):
        buffer[:, index] = tokens[:, 0]  # later slots are never read
        return to_numpy(full(buffer))[:, index]

    return prefill, step
