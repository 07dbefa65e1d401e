"""The compiled decoding loop of `CausalLM.generate`: one `tf.function`.

Prefill of the prompts' common length in one pass, then every step and the
sampler inside one `tf.while_loop` (a graph, or one XLA program with
`jit_compile=True`), the caches loop variables updated in place. It follows
`generation.generate_tokens` token for token: every row continues at its own
true positions (rows with longer prompts read their remaining prompt tokens
in the loop, one step each, as the NumPy loop does), finished rows feed token
0, and a row draws its uniforms in order only when it takes a new token, so
greedy and seeded sampling give the NumPy loop's tokens.

A step reads the cache slots up to its own position (`ops.cache.read_reach`);
under XLA, which slices only to static sizes, the loop runs in phases of the
cache (`phase_widths`), each step reading up to its phase's end.
"""

import numpy as np
import tensorflow as tf

from keras_posenc._backend import FLOAT64, IS_TENSORFLOW, compiled, xp
from keras_posenc.ops.cache import in_place_writes, read_bound, update_slice


def compile_loop(
    model, batch_size, total_length, use_cache, jit_compile, sampler, rolling=None
):
    """`decode(prefix, prompts, lengths, max_new, uniforms, stops, pad)` -> tokens.

    `prefix (B, start)` int32 are the prompts' first `start = min(lengths)`
    tokens, `prompts (B, total_length)` the right-padded prompts, `uniforms
    (B, U)` float64 each row's draws in order (`U >= 1`), `stops (K,)` the
    stop ids; returns `(B, total_length)` int32. `rolling = (sink_tokens,
    slots)` decodes through rolling caches of `slots` positions (then `start`
    is at most `slots`).
    """
    batch, total = batch_size, total_length
    phased = jit_compile and use_cache and rolling is None
    first_logits, next_logits = _logit_steps(model, batch, total, use_cache, rolling)

    def decode(prefix, prompts, lengths, max_new, uniforms, stops, pad):
        start = xp.shape(prefix)[1]
        end = lengths + max_new  # first slot after each row's new tokens
        choose = _chooser(sampler, batch, (lengths, end), uniforms, (stops, pad))
        done = xp.zeros([batch], xp.bool)
        drawn = xp.zeros([batch], xp.int32)
        if first_logits is not None:  # prefill, then token `start` outside the loop
            logits, state = first_logits(prefix)
            out, done, drawn, fed = choose(logits, start, prompts, done, drawn)
            state = _once_read(state, logits)
            first = start + 1
        else:  # one model call per step only: the first one reads the prefix
            # Slots past the prefix are never read by a causal model; they
            # hold token 0 so every id the model embeds is a real one.
            buffer = xp.pad(prefix, [[0, 0], [0, total - start]])
            state = [xp.ensure_shape(buffer, [batch, total])]
            out, fed, first = prompts, prefix[:, -1], start

        def going(t, done):
            return (t < total) & ~xp.reduce_all(done | (t >= end))

        def body(t, out, done, drawn, fed, state):
            shapes = [s.shape for s in state]
            logits, state = next_logits(state, fed, t - 1)
            state = [xp.ensure_shape(s, shape) for s, shape in zip(state, shapes)]
            out, done, drawn, fed = choose(logits, t, out, done, drawn)
            return t + 1, out, done, drawn, fed, state

        carried = (first, out, done, drawn, fed, list(state))
        return _loop_steps(going, body, carried, total if phased else None)

    return compiled(
        decode,
        [
            tf.TensorSpec((batch, None), xp.int32),
            tf.TensorSpec((batch, total), xp.int32),
            tf.TensorSpec((batch,), xp.int32),
            tf.TensorSpec((), xp.int32),
            tf.TensorSpec((batch, None), FLOAT64),
            tf.TensorSpec((None,), xp.int32),
            tf.TensorSpec((), xp.int32),
        ],
        jit_compile,
        model.variables,
    )


def _logit_steps(model, batch, total, use_cache, rolling):
    """`(first_logits, next_logits)`: the prefill (None without a cache: the
    loop's first step reads the prompt's last token) and one step."""
    if not use_cache:

        def next_logits(state, fed, index):
            buffer = _write_column(state[0], fed, index)
            return xp.gather(model.logits(buffer), index, axis=1), [buffer]

        return None, next_logits
    sink, slots = rolling or (None, total)
    shapes = model.cache_shapes(batch, slots)
    dtype = model.compute_dtype

    def first_logits(prefix):
        cache = [xp.zeros(shape, dtype) for shape in shapes]
        logits, cache = model.call_with_cache(prefix, cache, 0, sink_tokens=sink)
        return logits[:, -1], cache

    def next_logits(state, fed, index):
        with in_place_writes():  # the loop owns its caches
            logits, state = model.call_with_cache(
                fed[:, None], state, index, sink_tokens=sink
            )
        return logits[:, -1], state

    return first_logits, next_logits


def _chooser(sampler, batch, rows, uniforms, tokens):
    """`choose(logits, t, out, done, drawn)`: token `t` of every row, as one
    iteration of the NumPy loop (`rows`: the prompts' lengths and each row's
    end; `tokens`: the stop ids and the pad id)."""
    (lengths, end), (stops, pad) = rows, tokens
    last_draw = xp.shape(uniforms)[1] - 1

    def choose(logits, t, out, done, drawn):
        prompted = t < lengths
        active = ~prompted & ~done & (t < end)
        # Row r's next uniform is the value its stream gives next.
        u = xp.gather(uniforms, xp.minimum(drawn, last_draw), batch_dims=1)
        chosen = sampler.compiled_next_tokens(xp.cast(logits, FLOAT64), u)
        chosen = xp.ensure_shape(xp.cast(chosen, xp.int32), [batch])
        given = xp.gather(out, t, axis=1)
        token = xp.where(prompted, given, xp.where(active, chosen, pad))
        out = _write_column(out, token, t)
        done = done | (active & xp.reduce_any(chosen[:, None] == stops, -1))
        drawn = drawn + xp.cast(active, xp.int32)
        fed = xp.where(prompted | active, token, 0)  # finished rows: id 0
        return out, done, drawn, fed

    return choose


def _loop_steps(going, body, carried, phased_total):
    """The tokens `(B, total)` after `body` ran while `going`: one
    `tf.while_loop`, or under XLA (`phased_total`, the loop's width), which
    slices only to static sizes, a loop per phase of the cache, each step
    reading the slots up to its phase's end (the step at `t` writes
    position `t - 1`), not all `total`."""
    if phased_total is None:  # a plain graph's steps read up to their own position
        return xp.while_loop(
            lambda t, out, done, *_: going(t, done),
            body,
            carried,
            parallel_iterations=1,
        )[1]
    for width in phase_widths(phased_total):
        with read_bound(width):
            carried = xp.while_loop(
                lambda t, out, done, *_, width=width: going(t, done) & (t <= width),
                body,
                carried,
                parallel_iterations=1,
            )
    return carried[1]


def next_token_log_probs(logits, targets):
    """`(B, n)` float32 log-softmax of `logits (B, n, V)` at `targets (B, n)`."""
    log_probs = xp.nn.log_softmax(xp.cast(logits, xp.float32), axis=-1)
    return xp.gather(log_probs, targets, batch_dims=2)


def compile_scoring(model, batch_size, length, jit_compile, rolling):
    """`read(prefix, tokens) -> (B, length - 1)` log-probs through a rolling cache.

    `prefix (B, first)` (at most the cache's `slots` and `length - 1`
    tokens) is prefilled in one pass; every later token is read alone
    inside one `tf.while_loop`, at its position in the text, the cache
    rolling over once full.
    """
    sink, slots = rolling
    shapes = model.cache_shapes(batch_size, slots)

    def read(prefix, tokens):
        first = xp.shape(prefix)[1]
        cache = [xp.zeros(shape, model.compute_dtype) for shape in shapes]
        logits, cache = model.call_with_cache(prefix, cache, 0, sink_tokens=sink)
        head = next_token_log_probs(logits, tokens[:, 1 : first + 1])
        scores = xp.pad(head, [[0, 0], [0, length - 1 - first]])
        cache = _once_read(cache, scores)

        def body(t, scores, cache):
            fed = xp.gather(tokens, t, axis=1)[:, None]
            with in_place_writes():  # the loop owns its caches
                logits, cache = model.call_with_cache(fed, cache, t, sink_tokens=sink)
            target = xp.gather(tokens, t + 1, axis=1)[:, None]
            column = next_token_log_probs(logits, target)[:, 0]
            scores = update_slice(scores, column[:, None], t, axis=1)
            cache = [xp.ensure_shape(c, shape) for c, shape in zip(cache, shapes)]
            return t + 1, scores, cache

        loop = xp.while_loop(
            lambda t, *_: t < length - 1,
            body,
            (first, scores, cache),
            parallel_iterations=1,
        )
        return loop[1]

    return compiled(
        read,
        [
            tf.TensorSpec((batch_size, None), xp.int32),
            tf.TensorSpec((batch_size, length), xp.int32),
        ],
        jit_compile,
        model.variables,
    )


def _once_read(caches, result):
    """`caches` entering the loop only once the prefill's `result` exists.

    The loop writes them in place (`in_place_writes`); TensorFlow runs a
    graph's loop as soon as its own inputs are ready, so without this a
    first write could overwrite a cache while the prefill still reads it.
    """
    if not IS_TENSORFLOW:  # JAX and PyTorch order writes by their data
        return list(caches)
    with tf.control_dependencies([result]):
        return [xp.identity(cache) for cache in caches]


#: The smallest loop width and stop list (`capacity`, `stop_list`).
SMALLEST_WIDTH, STOP_SLOTS = 16, 8
#: The widest `max_length` a loop takes whole: past it (an imported model's
#: 8k-128k positions) a cache of every position would make each step read
#: them all, so the loop is the next power of two of the tokens instead.
WHOLE_WIDTH = 1024


def capacity(total, max_length, use_cache, rolling):
    """The compiled loop's width for `total` slots: the model's `max_length`
    when a plain cache holds them and it is at most `WHOLE_WIDTH` (so any
    `max_new_tokens` reuses one trace), else the next power of two (the
    recompute path's buffer, a rolling cache's output, a long-context
    model's cache), at least `SMALLEST_WIDTH`."""
    if use_cache and rolling is None and total <= max_length <= WHOLE_WIDTH:
        return max_length
    return max(SMALLEST_WIDTH, 1 << (int(total) - 1).bit_length())


def prefix_length(shortest):
    """The prefill's length: the largest power of two <= the shortest prompt
    (its other tokens go through the loop, as a longer row's do), so prompts
    of lengths in one bucket share a trace."""
    return 1 << (int(shortest).bit_length() - 1)


def stop_list(stop_token_ids):
    """int32 `(K,)` stop ids padded with -1 (never a token) to a multiple of
    `STOP_SLOTS`, so their number does not change the trace."""
    stops = list(stop_token_ids)
    size = max(STOP_SLOTS, -(-len(stops) // STOP_SLOTS) * STOP_SLOTS)
    return np.array(stops + [-1] * (size - len(stops)), np.int32)


#: The fewest cache slots an XLA phase spans (`phase_widths`).
PHASE_SLOTS = 256


def phase_widths(total, phases=4, smallest=None):
    """The read bounds of the compiled loop's XLA phases, ending at `total`.

    At most `phases` equal steps of at least `smallest` slots (multiples of
    8; `PHASE_SLOTS` by default): a phase more is one more copy of the step
    for XLA to compile, which phases narrower than 256 slots do not win back
    in a few hundred steps. `python -m benchmarks --only generate` (a
    256-slot cache, `docs/measurements.md`): the XLA first call at batch 1
    took 2.52 s in 4 phases of 64 and takes 1.20 s in one; the batch-1 rate
    went 13,820 -> 8,991 tokens/s, the batch-8 rate 9,344 -> 19,540 (the
    phases' loops hand the caches on by copying them).
    """
    smallest = PHASE_SLOTS if smallest is None else smallest
    step = max(smallest, -(-total // phases))
    step = -(-step // 8) * 8
    return list(range(step, total, step)) + [total]


def _write_column(tokens, column, index):
    """`tokens (B, S)` with `column (B,)` written at position `index`."""
    return update_slice(tokens, column[:, None], index, axis=1)


def uniforms(seed, rows, count):
    """`(len(rows), count)` float64: row r's first `count` draws of its stream.

    The values `np.random.default_rng([seed, r]).random()` returns in turn
    (fresh entropy per row when `seed` is None), as `generate_tokens` draws.
    """
    return np.stack(
        [
            np.random.default_rng(None if seed is None else [seed, r]).random(count)
            for r in rows
        ]
    )
