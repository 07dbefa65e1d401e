"""The byte-level language-model experiment on Python's own documentation.

Shared by `examples/char_lm_pydoc.py` and `benchmarks/lm.py`: the text of
`pydoc_data.topics` (it ships with Python) as UTF-8 bytes, a causal LM
trained on windows of length L, and bits per byte at longer lengths (the
experiment of Press et al., 2022, figure 1: how each position method
extrapolates past its training length). Documents of different lengths
train in packed rows (`pack`, for `build_causal_lm(packed=True)`) or one
per padded row (`pad`).
"""

import math
import time

import numpy as np

from keras_posenc import _checks, models
from keras_posenc._compat import keras

#: Byte-level vocabulary: every UTF-8 byte value.
VOCAB_SIZE = 256


def pydoc_bytes(validation_fraction=0.1):
    """`(train, validation)` int32 byte ids of the pydoc topics, split by position.

    The topics are joined in sorted order; the last `validation_fraction`
    of the bytes is held out, so no validation text is seen in training.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
    split = int(len(ids) * (1.0 - validation_fraction))
    return ids[:split], ids[split:]


def pydoc_documents():
    """Short documents: the paragraphs of the pydoc topics, as int32 byte ids.

    Topics in sorted order, each split at its blank lines (2,608 paragraphs
    of 20 to 860 bytes for 10% to 99% of them, median 114): documents of
    many lengths, as packing meets them.
    """
    from pydoc_data.topics import topics

    return [
        np.frombuffer(paragraph.encode("utf-8"), np.uint8).astype(np.int32)
        for name in sorted(topics)
        for paragraph in topics[name].split("\n\n")
        if paragraph.strip()
    ]


def pack(documents, sequence_length, align=1):
    """Documents packed into rows for a `packed=True` model, with their labels.

    First fit in document order: each document goes to the first row with
    room for it after the row's last document (at the next multiple of
    `align`: block-local attention with window W sees each document exactly
    as alone when `align=W`), else to a new row; one longer than
    `sequence_length` is cut into pieces of `sequence_length` (each a
    document of its own, from position 0). Each document gets its own
    segment id within its row (1, 2, ... in order of arrival); slots no
    document fills hold token 0 in segment 0 (padding).

    Args:
        documents: iterable of 1-D integer arrays of token ids.
        sequence_length: int, the row length T.
        align: int, documents start at multiples of `align`. Defaults to `1`.

    Returns:
        `(inputs, labels, sample_weight)`: `inputs` the dict
        `{"token_ids": (R, T), "segment_ids": (R, T)}` int32, `labels`
        `(R, T)` the next token of the same document, `sample_weight`
        `(R, T)` float32, 1 where a label is a next token of the same
        document, else 0 (each document's last token, padding). Pass them
        to `model.fit(inputs, labels, sample_weight=sample_weight)`.
    """
    length = _checks.positive_int("sequence_length", sequence_length)
    align = _checks.positive_int("align", align)
    pieces = _pieces(documents, length)
    rows, used = [], np.zeros(len(pieces), np.int64)  # at most one row each
    for piece in pieces:
        starts = -(-used[: len(rows)] // align) * align
        room = np.flatnonzero(starts + len(piece) <= length)
        if len(room):
            r = int(room[0])
            rows[r].append((int(starts[r]), piece))
        else:
            r = len(rows)
            rows.append([(0, piece)])
        used[r] = rows[r][-1][0] + len(piece)
    tokens = np.zeros((len(rows), length), np.int32)
    segments = np.zeros_like(tokens)
    labels = np.zeros_like(tokens)
    weights = np.zeros(tokens.shape, np.float32)
    for r, row in enumerate(rows):
        for segment, (start, piece) in enumerate(row, start=1):
            end = start + len(piece)
            tokens[r, start:end] = piece
            segments[r, start:end] = segment
            labels[r, start : end - 1] = piece[1:]
            weights[r, start : end - 1] = 1.0
    return {"token_ids": tokens, "segment_ids": segments}, labels, weights


def pad(documents, sequence_length):
    """Documents one per row, padded to `sequence_length`: `pack`'s baseline.

    The same pieces as `pack` (documents longer than `sequence_length` cut
    alike), each in a row of its own from position 0, for an unpacked model.

    Returns:
        `(token_ids, labels, sample_weight)`, each `(R, T)`: token ids
        int32 (0 after the document), the next token of the document, and
        1.0 where a label is one (0 at the last token and the padding).
    """
    length = _checks.positive_int("sequence_length", sequence_length)
    pieces = _pieces(documents, length)
    tokens = np.zeros((len(pieces), length), np.int32)
    labels = np.zeros_like(tokens)
    weights = np.zeros(tokens.shape, np.float32)
    for r, piece in enumerate(pieces):
        tokens[r, : len(piece)] = piece
        labels[r, : len(piece) - 1] = piece[1:]
        weights[r, : len(piece) - 1] = 1.0
    return tokens, labels, weights


def _pieces(documents, length):
    """Non-empty documents cut into pieces of at most `length` tokens."""
    if isinstance(documents, np.ndarray) and documents.dtype != object:
        _checks.fail(
            "documents",
            "a list of 1-D token-id arrays (one per document)",
            f"one array of shape {documents.shape}",
            error=TypeError,
        )
    pieces = []
    for index, document in enumerate(documents):
        document = np.asarray(document)
        if document.ndim != 1 or not np.issubdtype(document.dtype, np.integer):
            _checks.fail(
                "documents",
                "1-D integer token-id arrays",
                f"document {index} of shape {document.shape}, dtype {document.dtype}",
                error=TypeError,
            )
        pieces.extend(
            document[s : s + length].astype(np.int32)
            for s in range(0, len(document), length)
        )
    if not pieces:
        _checks.fail("documents", "at least one non-empty document", documents)
    return pieces


def windows(ids, length, count=None, seed=0):
    """`(inputs, targets)` of shape `(N, length)`: next-byte prediction windows.

    Without `count`, non-overlapping windows cover `ids` in order; with it,
    `count` windows start at random offsets (seeded).
    """
    length = _checks.positive_int("length", length)
    if len(ids) < length + 1:
        _checks.fail("length", f"below the text length {len(ids)}", length)
    if count is None:
        starts = np.arange(0, len(ids) - length - 1, length)
    else:
        starts = np.random.default_rng(seed).integers(0, len(ids) - length - 1, count)
    rows = np.stack([ids[s : s + length + 1] for s in starts])
    return rows[:, :-1], rows[:, 1:]


def train(position, train_ids, length, steps, batch_size=32, seed=0, **model_kwargs):
    """A causal LM trained for `steps` batches of random windows of `length`.

    Returns:
        `(model, seconds spent in fit)`.
    """
    keras.utils.set_random_seed(seed)
    options = dict(hidden_dim=64, num_layers=2, num_heads=4)
    options.update(model_kwargs)
    position_options = {"max_length": 8 * length}  # reads 8x its training length
    position_options.update(model_kwargs.get("position_options") or {})
    options["position_options"] = position_options
    model = models.build_causal_lm(VOCAB_SIZE, position=position, **options)
    model.compile(
        keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(3e-3, steps)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = windows(train_ids, length, steps * batch_size, seed)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    return model, time.perf_counter() - start


def bits_per_byte(model, ids, length, max_windows=64):
    """Mean next-byte cross-entropy in bits over non-overlapping windows of `length`."""
    x, y = windows(ids, length)
    x, y = x[:max_windows], y[:max_windows]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    total = 0.0
    for start in range(0, len(x), 8):
        logits = model(x[start : start + 8], training=False)
        total += float(loss(y[start : start + 8], logits)) * len(x[start : start + 8])
    return total / len(x) / math.log(2.0)


def tokens_per_second(model, prompt, new_tokens, use_cache, repeats=2):
    """Greedy `generate` speed: new tokens per second (best of `repeats`, warmed)."""
    model.generate(prompt, new_tokens, use_cache=use_cache)  # traces the steps
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(prompt, new_tokens, use_cache=use_cache)
        best = min(best, time.perf_counter() - start)
    return new_tokens * len(prompt) / best


def text_of(ids):
    """Text of byte ids (invalid UTF-8 sequences replaced)."""
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
