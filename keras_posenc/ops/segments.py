"""Packed rows: several documents in one row, told apart by segment ids.

A row `(T,)` of segment ids holds its documents as contiguous runs of one
id; a new run starts wherever the id changes (`[1, 1, 2, 2, 1]` holds three
documents) and id 0 marks padding (a run of its own, attending only to
itself). Inside a packed row every position restarts at 0 in each run and
attention stays inside its run, so each document gets the outputs it gets
alone. Integer functions, `O(B T)` except the `(B, T, T)` mask.
"""

from keras_posenc._backend import xp
from keras_posenc._compat import rank


def runs(segment_ids):
    """int32 `(B, T)`: the index of each token's run in its row (0, 1, ...)."""
    ids = xp.convert_to_tensor(segment_ids)
    changed = xp.not_equal(ids[:, 1:], ids[:, :-1])  # (B, T - 1)
    first = xp.ones_like(ids[:, :1], xp.int32)
    starts = xp.concat([first, xp.cast(changed, xp.int32)], 1)  # (B, T)
    return xp.cumsum(starts, axis=1) - 1


def positions(segment_ids):
    """int32 `(B, T)`: each token's position inside its run, from 0."""
    run = runs(segment_ids)
    length = xp.shape(run)[1]
    index = xp.broadcast_to(xp.range(length)[None], xp.shape(run))  # (B, T)
    flat = _flat(run, length)
    count = xp.shape(run)[0] * length
    first = xp.math.unsorted_segment_min(index, flat, count)  # start of each run
    return index - xp.gather(first, flat)


def lengths(segment_ids, mask=None):
    """int32 `(B, T)`: the length of each token's run (its real tokens, with
    a boolean `mask` `(B, T)`; at least 1)."""
    run = runs(segment_ids)
    length = xp.shape(run)[1]
    flat = _flat(run, length)
    count = xp.shape(run)[0] * length
    real = xp.ones_like(run) if mask is None else xp.cast(mask, xp.int32)
    sizes = xp.maximum(xp.math.unsorted_segment_sum(real, flat, count), 1)
    return xp.gather(sizes, flat)


def same_run(query_runs, key_runs):
    """Boolean `(B, T, S)`: query and key lie in the same run."""
    return xp.equal(query_runs[:, :, None], key_runs[:, None, :])


def shift_within(x, run, offset):
    """`x[:, t + offset]` `(B, T, ...)` where that token is in `t`'s run, else 0.

    A convolution tap over packed rows: `run` `(B, T)` from `runs`; a
    neighbour past either end of the row or in another run reads as zero,
    as past the end of a document alone.
    """
    if offset == 0:
        return x
    width = abs(offset)
    length = xp.shape(x)[1]
    ndim = rank(x)
    padding = [[0, 0], [width, width]] + [[0, 0]] * (ndim - 2)
    shifted = xp.pad(x, padding)[:, width + offset : width + offset + length]
    other = xp.pad(run, [[0, 0], [width, width]], constant_values=-1)
    other = other[:, width + offset : width + offset + length]  # (B, T)
    trailing = xp.concat([xp.shape(run), [1] * (ndim - 2)], 0)  # (B, T, 1, ...)
    same = xp.reshape(xp.equal(other, run), trailing)
    return xp.where(same, shifted, xp.zeros_like(shifted))


def _flat(run, length):
    """Run indices made unique across rows: `b * T + run`."""
    rows = xp.range(xp.shape(run)[0])[:, None] * length  # (B, 1)
    return run + rows
