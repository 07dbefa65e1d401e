"""Packed rows: several documents in one row, told apart by segment ids.

A row `(T,)` of segment ids holds its documents as contiguous runs of one
id; a new run starts wherever the id changes (`[1, 1, 2, 2, 1]` holds three
documents) and id 0 marks padding (a run of its own, attending only to
itself). Inside a packed row every position restarts at 0 in each run and
attention stays inside its run, so each document gets the outputs it gets
alone. Integer functions, `O(B T)` except the `(B, T, T)` mask.
"""

import tensorflow as tf


def runs(segment_ids):
    """int32 `(B, T)`: the index of each token's run in its row (0, 1, ...)."""
    ids = tf.convert_to_tensor(segment_ids)
    changed = tf.not_equal(ids[:, 1:], ids[:, :-1])  # (B, T - 1)
    first = tf.ones_like(ids[:, :1], tf.int32)
    starts = tf.concat([first, tf.cast(changed, tf.int32)], 1)  # (B, T)
    return tf.cumsum(starts, axis=1) - 1


def positions(segment_ids):
    """int32 `(B, T)`: each token's position inside its run, from 0."""
    run = runs(segment_ids)
    length = tf.shape(run)[1]
    index = tf.broadcast_to(tf.range(length)[None], tf.shape(run))  # (B, T)
    flat = _flat(run, length)
    count = tf.shape(run)[0] * length
    first = tf.math.unsorted_segment_min(index, flat, count)  # start of each run
    return index - tf.gather(first, flat)


def lengths(segment_ids, mask=None):
    """int32 `(B, T)`: the length of each token's run (its real tokens, with
    a boolean `mask` `(B, T)`; at least 1)."""
    run = runs(segment_ids)
    length = tf.shape(run)[1]
    flat = _flat(run, length)
    count = tf.shape(run)[0] * length
    real = tf.ones_like(run) if mask is None else tf.cast(mask, tf.int32)
    sizes = tf.maximum(tf.math.unsorted_segment_sum(real, flat, count), 1)
    return tf.gather(sizes, flat)


def same_run(query_runs, key_runs):
    """Boolean `(B, T, S)`: query and key lie in the same run."""
    return tf.equal(query_runs[:, :, None], key_runs[:, None, :])


def shift_within(x, run, offset):
    """`x[:, t + offset]` `(B, T, ...)` where that token is in `t`'s run, else 0.

    A convolution tap over packed rows: `run` `(B, T)` from `runs`; a
    neighbour past either end of the row or in another run reads as zero,
    as past the end of a document alone.
    """
    if offset == 0:
        return x
    width = abs(offset)
    length = tf.shape(x)[1]
    rank = x.shape.rank
    padding = [[0, 0], [width, width]] + [[0, 0]] * (rank - 2)
    shifted = tf.pad(x, padding)[:, width + offset : width + offset + length]
    other = tf.pad(run, [[0, 0], [width, width]], constant_values=-1)
    other = other[:, width + offset : width + offset + length]  # (B, T)
    trailing = tf.concat([tf.shape(run), [1] * (rank - 2)], 0)  # (B, T, 1, ...)
    same = tf.reshape(tf.equal(other, run), trailing)
    return tf.where(same, shifted, tf.zeros_like(shifted))


def _flat(run, length):
    """Run indices made unique across rows: `b * T + run`."""
    rows = tf.range(tf.shape(run)[0])[:, None] * length  # (B, 1)
    return run + rows
