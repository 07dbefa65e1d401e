"""Packed rows for the tests: one row of three documents, and its check."""

import numpy as np

#: (start, length) of three documents in a row of 14; each starts at a
#: multiple of the block-local models' window.
DOCUMENTS = ((0, 4), (4, 3), (8, 5))
WINDOW = 4


def packed_row(documents=DOCUMENTS, length=14, seed=0):
    ids = np.random.default_rng(seed).integers(1, 30, (1, length)).astype("int32")
    segments = np.zeros((1, length), "int32")
    for segment, (start, size) in enumerate(documents, start=1):
        segments[0, start : start + size] = segment
    return ids, segments


def assert_each_document_reads_as_alone(model, documents=DOCUMENTS):
    """The documents of one packed row against each fed alone."""
    ids, segments = packed_row(documents)
    packed = model({"token_ids": ids, "segment_ids": segments}).numpy()
    assert np.isfinite(packed).all()  # the padding slots too
    for start, size in documents:
        alone = {
            "token_ids": ids[:, start : start + size],
            "segment_ids": np.ones((1, size), "int32"),
        }
        np.testing.assert_allclose(
            packed[:, start : start + size], model(alone).numpy(), atol=2e-5
        )
