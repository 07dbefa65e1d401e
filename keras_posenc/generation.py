"""Token generation shared by Keras models and TFLite interpreters.

`generate_tokens` runs the decoding loop on two callables, `prefill` and
`step`, so the Keras model (with or without its KV cache) and the exported
LiteRT / TFLM models decode with one loop and one set of samplers.
"""

import numpy as np

from keras_posenc import _checks

#: The samplers `generate` takes.
SAMPLERS = ("greedy", "top_k", "top_p")


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
    lengths = np.array([len(row) for row in rows], dtype=np.int32)
    if lengths.min() < 1:
        _checks.fail("prompt_ids", "prompts of at least one token", lengths.tolist())
    prompts = np.full((len(rows), lengths.max()), pad_token_id, dtype=np.int32)
    for b, row in enumerate(rows):
        prompts[b, : len(row)] = row
    return prompts, lengths


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

    A plain dict (JSON-serialisable), so one set of arguments is validated
    once and passed on whole, to a Keras loop or to an interpreter's.
    """
    _checks.positive_int("max_new_tokens", max_new_tokens)
    _checks.choice("sampler", sampler, SAMPLERS)
    _checks.positive_float("temperature", temperature)
    _checks.positive_int("top_k", top_k)
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        _checks.fail("top_p", "a float in (0, 1]", top_p, error=TypeError)
    if not 0.0 < top_p <= 1.0:
        _checks.fail("top_p", "a float in (0, 1]", top_p)
    return dict(
        max_new_tokens=max_new_tokens,
        sampler=sampler,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_token_ids=[int(token) for token in stop_token_ids or ()],
        pad_token_id=pad_token_id,
    )


def sample(logits, sampler, temperature, top_k, top_p, rng):
    """Next tokens `(B,)` from float logits `(B, V)` (NumPy)."""
    logits = np.asarray(logits, dtype=np.float64)
    if sampler == "greedy":
        return np.argmax(logits, axis=-1).astype(np.int32)
    logits = logits / temperature
    order = np.argsort(-logits, axis=-1, kind="stable")  # best first
    ranked = np.take_along_axis(logits, order, axis=-1)
    probs = np.exp(ranked - ranked[:, :1])
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampler == "top_k":
        keep = np.arange(probs.shape[-1])[None, :] < top_k
    else:  # the smallest head of the ranking whose mass reaches top_p
        keep = np.cumsum(probs, axis=-1) - probs < top_p
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum(axis=-1, keepdims=True)
    picks = [rng.choice(len(row), p=row) for row in probs]
    return order[np.arange(len(picks)), picks].astype(np.int32)


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
):
    """The decoding loop: `(B, P + max_new_tokens)` prompts and new tokens.

    `prefill(tokens (B, T))` returns the logits `(B, V)` of the last of the
    `T` tokens at positions `0 .. T-1`; `step(tokens (B, 1), t)` those of one
    token at position `t`. Each row continues right after its own prompt;
    slots past its `max_new_tokens` new tokens or its stop token hold
    `pad_token_id`.
    """
    batch, prompt_length = prompts.shape
    total = prompt_length + max_new_tokens
    out = np.full((batch, total), pad_token_id, dtype=np.int32)
    out[:, :prompt_length] = prompts
    stops = np.array(sorted(set(stop_token_ids or ())), dtype=np.int32)
    rng = np.random.default_rng(seed)
    end = lengths + max_new_tokens  # first slot after each row's new tokens
    done = np.zeros(batch, dtype=bool)
    start = int(lengths.min())
    logits = prefill(out[:, :start])
    for t in range(start, total):
        chosen = sample(logits, sampler, temperature, top_k, top_p, rng)
        prompted = t < lengths
        active = ~prompted & ~done & (t < end)
        out[:, t] = np.where(
            prompted, out[:, t], np.where(active, chosen, pad_token_id)
        )
        done |= active & np.isin(chosen, stops)
        if np.all(done | (t + 1 >= end)) or t + 1 == total:
            break
        logits = step(out[:, t : t + 1], t)
    return out
