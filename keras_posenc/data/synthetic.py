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


#: The sentence end of `sentence_task` (words are `2 .. vocab_size - 1`).
MARKER = 1


def sentence_task(
    num_examples, length, min_words=1, max_words=4, vocab_size=10, seed=0
):
    """A position defined by content: the first word of the previous sentence.

    Sentences of `min_words .. max_words` random words, each ended by
    `MARKER`, fill `length` tokens. At every token the label is the first
    word of the sentence before the token's own (a marker belongs to the
    sentence it ends), 0 while there is none: "one sentence back" is a fixed
    count of markers, not a fixed distance, so a model that counts tokens
    must infer the distance from the content (CoPE's setting, Golovneva et
    al. 2024). Longer sentences at test time (`min_words`, `max_words`) move
    every answer further away without changing the rule.

    Returns:
        `(tokens, labels)`, int32 arrays `(N, T)`; labels lie in
        `[0, vocab_size)`.
    """
    if not 1 <= min_words <= max_words:
        raise ValueError(
            "`min_words` must be >= 1 and <= max_words. Received: "
            f"min_words={min_words}, max_words={max_words}"
        )
    if vocab_size < 3:
        raise ValueError(f"`vocab_size` must be >= 3. Received: {vocab_size}")
    rng = np.random.default_rng(seed)
    tokens = np.zeros((num_examples, length), "int32")
    labels = np.zeros((num_examples, length), "int32")
    for row in range(num_examples):
        t, previous_first = 0, 0
        while t < length:
            words = rng.integers(2, vocab_size, rng.integers(min_words, max_words + 1))
            sentence = list(words) + [MARKER]
            for token in sentence[: length - t]:
                tokens[row, t], labels[row, t] = token, previous_first
                t += 1
            previous_first = int(words[0])
    return tokens, labels


def retrieval_task(
    num_examples, length, num_pairs=4, num_keys=8, num_values=8, filler=16, seed=0
):
    """Long-range retrieval: a key stated early, its value asked for at the end.

    `num_pairs` pair tokens of distinct keys (each pair one token,
    `key, value`) stand at random places in the first eighth of the
    sequence, random filler tokens everywhere else, and the last token asks
    for one of those keys: the answer is that pair's value. Which pair is
    asked is content, not distance, and at length T the pair is ~7T/8 tokens
    back, far outside any block-local band. Token ids: fillers `1 ..
    filler`, the pair of key k and value v `filler + 1 + k * num_values + v`,
    the question for key k `filler + 1 + num_keys * num_values + k`;
    `retrieval_vocab_size(...)` is their count plus 1.

    Returns:
        `(tokens, answers)`: int32 `(N, T)` and the values `(N,)` in
        `[0, num_values)`.
    """
    if not 1 <= num_pairs <= num_keys:
        raise ValueError(
            "`num_pairs` must be >= 1 and <= num_keys. Received: "
            f"num_pairs={num_pairs}, num_keys={num_keys}"
        )
    if length // 8 < num_pairs:
        raise ValueError(
            f"`length` must hold num_pairs={num_pairs} pairs in its first eighth. "
            f"Received: length={length}"
        )
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, filler + 1, size=(num_examples, length)).astype("int32")
    answers = np.zeros(num_examples, "int32")
    pairs_base, questions_base = filler + 1, filler + 1 + num_keys * num_values
    for row in range(num_examples):
        keys = rng.choice(num_keys, num_pairs, replace=False)
        values = rng.integers(0, num_values, num_pairs)
        places = rng.choice(length // 8, num_pairs, replace=False)
        tokens[row, places] = pairs_base + keys * num_values + values
        asked = rng.integers(num_pairs)
        tokens[row, -1] = questions_base + keys[asked]
        answers[row] = values[asked]
    return tokens, answers


def retrieval_vocab_size(num_keys=8, num_values=8, filler=16):
    """The vocabulary size of `retrieval_task` (ids 0 .. size - 1, 0 unused)."""
    return filler + 1 + num_keys * num_values + num_keys


def counting_sequences(num_examples, length, vocab_size=24, seed=0):
    """Token sequences that count: `x_t = 1 + (a + b t) mod (vocab_size - 1)`.

    Each row draws its start `a` and its stride `b` in `1 .. 3`; after two
    tokens every next one has one right answer, so a causal LM trained on
    them predicts with confident logits (no near ties for int8 rounding to
    flip). Ids lie in `[1, vocab_size)`.

    Returns:
        int32 `(N, length)`.
    """
    if vocab_size < 5:
        raise ValueError(
            f"`vocab_size` must be >= 5. Received: vocab_size={vocab_size}"
        )
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab_size - 1, (num_examples, 1))
    stride = rng.integers(1, 4, (num_examples, 1))
    steps = np.arange(length)[None, :]
    return (1 + (start + stride * steps) % (vocab_size - 1)).astype("int32")
