"""Packed rows for the tests: one row of three documents, and its check."""

import numpy as np

#: (start, length) of three documents in a row of 14; each starts at a
#: multiple of the block-local models' window.
DOCUMENTS = ((0, 4), (4, 3), (8, 5))
WINDOW = 4


def packed_row(documents=DOCUMENTS, length=14, seed=0, vocab=30):
    ids = np.random.default_rng(seed).integers(1, vocab, (1, length)).astype("int32")
    segments = np.zeros((1, length), "int32")
    for segment, (start, size) in enumerate(documents, start=1):
        segments[0, start : start + size] = segment
    return ids, segments


def assert_each_document_reads_as_alone(model, documents=DOCUMENTS, vocab=30):
    """The documents of one packed row against each alone.

    Alone: each document from position 0 in a row of its own, the rest of
    the row padding (segment 0, which no document reads), all in one call.
    """
    ids, segments = packed_row(documents, vocab=vocab)
    packed = model({"token_ids": ids, "segment_ids": segments}).numpy()
    assert np.isfinite(packed).all()  # the padding slots too
    longest = max(size for _, size in documents)
    alone_ids = np.zeros((len(documents), longest), "int32")
    alone_segments = np.zeros_like(alone_ids)
    for row, (start, size) in enumerate(documents):
        alone_ids[row, :size] = ids[0, start : start + size]
        alone_segments[row, :size] = 1
    alone = model({"token_ids": alone_ids, "segment_ids": alone_segments}).numpy()
    for row, (start, size) in enumerate(documents):
        np.testing.assert_allclose(
            packed[0, start : start + size], alone[row, :size], atol=2e-5
        )
