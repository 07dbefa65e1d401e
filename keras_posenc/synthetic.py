"""Position-sensitive synthetic tasks: per-token labels that only position decides.

Each returns integer tokens `(N, T)` in `[1, vocab_size)` and per-token labels
`(N, T)`; any length works, so a model trained at one length can be tested at
another. Used by the benchmarks and the length-extrapolation example.
"""

import numpy as np

#: Task names accepted by `make_task`.
TASKS = ("relative_offset", "absolute_position", "relative_and_absolute")


def make_task(name, num_examples, length, vocab_size=10, offset=3, seed=0):
    """Tokens and labels of task `name`.

    - `"relative_offset"`: is the token `offset` places to the left a 1?
      (translation invariant: a relative method can solve it at any length)
    - `"absolute_position"`: is this token at an even index?
    - `"relative_and_absolute"`: the relative test, but only at even indices
      (label 2 where the index is odd).

    Returns:
        `(tokens, labels)`, int32 arrays of shape `(N, T)`.
    """
    if name not in TASKS:
        raise ValueError(f"`name` must be one of {TASKS}. Received: name={name!r}")
    if length <= offset:
        raise ValueError(
            f"`length` must exceed offset={offset}. Received: length={length}"
        )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, size=(num_examples, length)).astype("int32")
    looked_up = np.zeros_like(tokens)
    looked_up[:, offset:] = tokens[:, :-offset] == 1
    even = (np.arange(length) % 2 == 0)[None, :].repeat(num_examples, 0)
    if name == "relative_offset":
        labels = looked_up
    elif name == "absolute_position":
        labels = even.astype("int32")
    else:
        labels = np.where(even, looked_up, 2)
    return tokens, labels.astype("int32")


def num_classes(name):
    """The number of label values of task `name`."""
    return 3 if name == "relative_and_absolute" else 2
