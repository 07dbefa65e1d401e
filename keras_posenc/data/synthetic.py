"""Position-sensitive synthetic tasks: per-token labels that only position decides.

Each returns integer tokens `(N, T)` in `[1, vocab_size)` and per-token labels
`(N, T)`; any length works, so a model trained at one length can be tested at
another. Used by the benchmarks and the length-extrapolation example.
"""

import numpy as np

#: Task names accepted by `make_task`.
TASKS = ("relative_offset", "absolute_position", "relative_and_absolute")


def make_task(name, num_examples, length, vocab_size=10, offset=3, seed=0):
    """Tokens and labels of task `name` (lookups, so chance is ~1/vocab_size).

    - `"relative_offset"`: output the token `offset` places to the left (0 in
      the first `offset` places). Translation invariant: a relative method can
      apply it at any length.
    - `"absolute_position"`: output the token at index 1, at every position.
    - `"relative_and_absolute"`: the relative lookup at even indices, the
      token at index 1 at odd ones.

    Returns:
        `(tokens, labels)`, int32 arrays of shape `(N, T)`; labels lie in
        `[0, vocab_size)`.
    """
    if name not in TASKS:
        raise ValueError(f"`name` must be one of {TASKS}. Received: name={name!r}")
    if length <= offset:
        raise ValueError(
            f"`length` must exceed offset={offset}. Received: length={length}"
        )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, size=(num_examples, length)).astype("int32")
    relative = np.zeros_like(tokens)
    relative[:, offset:] = tokens[:, :-offset]
    absolute = np.repeat(tokens[:, 1:2], length, axis=1)
    if name == "relative_offset":
        labels = relative
    elif name == "absolute_position":
        labels = absolute
    else:
        labels = np.where(np.arange(length)[None, :] % 2 == 0, relative, absolute)
    return tokens, labels.astype("int32")
