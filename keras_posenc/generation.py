"""Token generation shared by Keras models and TFLite interpreters.

`generate_tokens` runs the decoding loop on two callables, `prefill` and
`step`, so the Keras model (with or without its KV cache) and the exported
LiteRT / TFLM models decode with one loop and one set of samplers.
"""

import numbers

import numpy as np

from keras_posenc import _checks, samplers

#: The samplers `generate` takes by name (`keras_posenc.samplers.SAMPLERS`);
#: a `keras_posenc.samplers.Sampler` instance is taken too.
SAMPLERS = tuple(samplers.SAMPLERS)
#: The smallest `temperature`: below it the scaled logits overflow float64
#: (use `sampler="greedy"` for the limit of a temperature going to 0).
MIN_TEMPERATURE = samplers.MIN_TEMPERATURE


def check_prompts(prompt_ids, pad_token_id=0):
    """`(prompts (B, P) int32, lengths (B,))` from a 2-D array or a list of lists.

    Rows of a list may differ in length (they are right-padded with
    `pad_token_id`); every prompt has at least one token.
    """
    rows = prompt_ids
    if hasattr(rows, "numpy"):
        rows = rows.numpy()
    if isinstance(rows, np.ndarray):
        if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
            _checks.fail(
                "prompt_ids",
                "integer token ids (B, P) or a list of token lists",
                f"an array of shape {rows.shape} and dtype {rows.dtype}",
            )
        rows = rows.tolist()
    if not isinstance(rows, (list, tuple)) or not rows:
        _checks.fail("prompt_ids", "a non-empty batch of prompts", prompt_ids)
    if not all(isinstance(row, (list, tuple, np.ndarray)) for row in rows):
        _checks.fail("prompt_ids", "a list of token lists", prompt_ids, error=TypeError)
    for row in rows:
        for token in row:
            if not _is_int(token):
                _checks.fail(
                    "prompt_ids",
                    "integer token ids (a float id is never truncated)",
                    token,
                    error=TypeError,
                )
    pad_token_id = _integer("pad_token_id", pad_token_id)
    lengths = np.array([len(row) for row in rows], dtype=np.int32)
    if lengths.min() < 1:
        _checks.fail("prompt_ids", "prompts of at least one token", lengths.tolist())
    prompts = np.full((len(rows), lengths.max()), pad_token_id, dtype=np.int32)
    for b, row in enumerate(rows):
        prompts[b, : len(row)] = row
    return prompts, lengths


def check_vocabulary(prompts, lengths, vocab_size, name="prompt_ids"):
    """Every real token (not padding) of argument `name` is an id in `[0, V)`."""
    real = np.arange(prompts.shape[1])[None, :] < lengths[:, None]
    bad = real & ((prompts < 0) | (prompts >= vocab_size))
    if bad.any():
        row, column = np.argwhere(bad)[0]
        _checks.fail(
            name,
            f"token ids in [0, vocab_size={vocab_size})",
            int(prompts[row, column]),
            fix=f"Found at row {row}, position {column}",
        )


def sampling_options(
    max_new_tokens,
    sampler="greedy",
    temperature=1.0,
    top_k=50,
    top_p=0.9,
    seed=None,
    stop_token_ids=None,
    pad_token_id=0,
):
    """The checked decoding arguments of `generate`, as `generate_tokens` takes them.

    A plain dict of Python values (JSON-serialisable, but for a `Sampler`
    instance, which `samplers.serialize` turns into JSON for a child process;
    NumPy scalars are accepted wherever Python numbers are), so one set of
    arguments is validated once and passed on whole, to a Keras loop or to an
    interpreter's.
    """
    max_new_tokens = _checks.positive_int("max_new_tokens", max_new_tokens)
    if not isinstance(sampler, samplers.Sampler):
        _checks.choice("sampler", sampler, SAMPLERS)
    temperature = samplers.check_temperature(temperature)
    top_k = _checks.positive_int("top_k", top_k)
    top_p = samplers.check_top_p(top_p)
    if seed is not None:
        seed = _checks.positive_int("seed", seed, minimum=0)
    return dict(
        max_new_tokens=max_new_tokens,
        sampler=sampler,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_token_ids=_stop_tokens(stop_token_ids),
        pad_token_id=_integer("pad_token_id", pad_token_id),
    )


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(name, value):
    if not _is_int(value):
        _checks.fail(name, "an integer", value, error=TypeError)
    return int(value)


def _stop_tokens(value):
    """None, one id, or ids in a list, tuple or 1-D array -> a list of ints."""
    if value is None:
        return []
    if _is_int(value):
        return [int(value)]
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else value
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        _checks.fail(
            "stop_token_ids",
            "None, a token id, or a list of integer token ids",
            value,
            error=TypeError,
        )
    return [int(v) for v in value]


def sample(logits, sampler, temperature, top_k, top_p, rng):
    """Next tokens `(B,)` from float logits `(B, V)` (NumPy).

    `sampler` is a name, a `Sampler` or `samplers.serialize`'s dict; `rng` a
    NumPy `Generator` for every row, or a list of one per row.
    """
    return samplers.get(sampler, temperature, top_k, top_p)(logits, rng)


def generate_tokens(
    prefill,
    step,
    prompts,
    lengths,
    max_new_tokens,
    sampler="greedy",
    temperature=1.0,
    top_k=50,
    top_p=0.9,
    seed=None,
    stop_token_ids=None,
    pad_token_id=0,
    rows=None,
):
    """The decoding loop: `(B, P + max_new_tokens)` prompts and new tokens.

    `prefill(tokens (B, T))` returns the logits `(B, V)` of the last of the
    `T` tokens at positions `0 .. T-1`; `step(tokens (B, 1), t)` those of one
    token at position `t`. Each row continues right after its own prompt;
    slots past its `max_new_tokens` new tokens or its stop token hold
    `pad_token_id` (any integer, -1 included: a finished row feeds the model
    token 0, whose logits are never read). Each row samples from its own
    random stream, seeded by `(seed, row)` with `rows` the rows' indices in
    the caller's batch (default `0 .. B-1`), and draws only when it takes a
    new token, so a row's tokens do not depend on the batch it is decoded in
    (nor on the other prompts' lengths) and equal prompts still draw
    different samples.
    """
    batch, prompt_length = prompts.shape
    total = prompt_length + max_new_tokens
    out = np.full((batch, total), pad_token_id, dtype=np.int32)
    out[:, :prompt_length] = prompts
    stops = np.array(sorted(set(stop_token_ids or ())), dtype=np.int32)
    rows = range(batch) if rows is None else rows
    rngs = [np.random.default_rng(None if seed is None else [seed, r]) for r in rows]
    end = lengths + max_new_tokens  # first slot after each row's new tokens
    done = np.zeros(batch, dtype=bool)
    start = int(lengths.min())
    chooser = samplers.get(sampler, temperature, top_k, top_p)
    logits = prefill(out[:, :start])
    for t in range(start, total):
        prompted = t < lengths
        active = ~prompted & ~done & (t < end)
        # Only rows that take a new token draw: a row's stream then does not
        # depend on the other prompts' lengths (it equals decoding it alone).
        chosen = np.zeros(batch, dtype=np.int32)
        drawing = np.flatnonzero(active)
        if drawing.size:
            picked = [rngs[i] for i in drawing]
            chosen[drawing] = chooser(np.asarray(logits)[drawing], picked)
        out[:, t] = np.where(
            prompted, out[:, t], np.where(active, chosen, pad_token_id)
        )
        done |= active & np.isin(chosen, stops)
        if np.all(done | (t + 1 >= end)) or t + 1 == total:
            break
        fed = np.where(prompted | active, out[:, t], 0)  # finished rows: id 0
        logits = step(fed[:, None].astype(np.int32), t)
    return out
