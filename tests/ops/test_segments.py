"""`ops.segments` against loops written from the definition."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_posenc import ops


def oracle(row):
    """Runs, in-run positions and run lengths of one row, token by token."""
    runs, positions = [], []
    for t, value in enumerate(row):
        new = t == 0 or value != row[t - 1]
        runs.append(0 if t == 0 else runs[-1] + new)
        positions.append(0 if new else positions[-1] + 1)
    lengths = [runs.count(r) for r in runs]
    return runs, positions, lengths


rows = st.lists(
    st.lists(st.integers(0, 3), min_size=6, max_size=6), min_size=1, max_size=3
)


@settings(max_examples=40, deadline=None)
@given(rows)
def test_runs_positions_and_lengths_follow_the_ids_token_by_token(ids):
    ids = np.array(ids, np.int32)
    expected = [oracle(list(row)) for row in ids]
    for got, index in (
        (ops.segments.runs(ids), 0),
        (ops.segments.positions(ids), 1),
        (ops.segments.lengths(ids), 2),
    ):
        np.testing.assert_array_equal(got.numpy(), [e[index] for e in expected])


@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 3])
def test_a_shifted_neighbour_of_another_run_reads_zero(offset):
    ids = np.array([[1, 1, 1, 2, 2, 0, 3]], np.int32)
    x = np.arange(1, 8, dtype=np.float32).reshape(1, 7, 1) * [1.0, -1.0]
    runs = ops.segments.runs(ids)
    got = ops.segments.shift_within(tf.constant(x), runs, offset).numpy()
    expected = np.zeros_like(x)
    run = runs.numpy()[0]
    for t in range(7):
        s = t + offset
        if 0 <= s < 7 and run[s] == run[t]:
            expected[0, t] = x[0, s]
    np.testing.assert_array_equal(got, expected)


def test_positions_compile_under_xla():
    ids = tf.constant([[5, 5, 7, 7, 7, 0], [1, 2, 3, 3, 3, 3]])
    compiled = tf.function(ops.segments.positions, jit_compile=True)
    np.testing.assert_array_equal(compiled(ids), ops.segments.positions(ids))


def test_clipped_table_mean_at_run_positions_is_each_run_alone():
    """`positions` and per-token key counts: each token as in its run alone."""
    table = tf.constant(np.random.default_rng(0).normal(size=(7, 3)), tf.float32)
    ids = tf.constant([[1, 1, 1, 1, 2, 2, 2, 3, 3, 0]])
    positions, lengths = ops.segments.positions(ids), ops.segments.lengths(ids)
    for causal in (False, True):
        got = ops.clipped_table_mean(
            table, 10, lengths, causal=causal, positions=positions
        ).numpy()[0]
        start = 0
        for n in (4, 3, 2, 1):
            alone = ops.clipped_table_mean(table, n, n, causal=causal).numpy()
            np.testing.assert_allclose(got[start : start + n], alone, atol=1e-6)
            start += n
