import numpy as np
import pytest

from keras_posenc import ops


def ring_oracle(index, length, sink, slots):
    """A rolling cache simulated token by token: which text position each slot
    holds after tokens 0 .. index + length - 1 were written, then the places
    inside the cache (sinks first, the window oldest to newest)."""
    window, held = slots - sink, [None] * slots
    for p in range(index + length):
        slot = p if p < slots else sink + (p - sink) % window
        held[slot] = p
        if p == index:
            first = slot
    order = sorted(p for p in held if p is not None)
    place = {p: rank for rank, p in enumerate(order)}  # text order = cache order
    new = range(index, index + length)
    keys = [place.get(p, -1) for p in held]
    queries = [place[p] for p in new]
    mask = [[p is not None and p <= q for p in held] for q in new]
    return first, queries, keys, mask


@pytest.mark.parametrize("sink, slots", [(0, 5), (2, 6), (3, 4)])
def test_rolling_positions_match_a_simulated_ring(sink, slots):
    for index in range(4 * slots):
        lengths = range(1, slots - index + 1) if index < slots else (1,)
        for length in lengths:
            slot, q, k, mask = ops.cache.rolling_positions(index, length, sink, slots)
            first, queries, keys, allowed = ring_oracle(index, length, sink, slots)
            assert int(slot) == first
            np.testing.assert_array_equal(q.numpy(), queries)
            seen = np.array(allowed)
            np.testing.assert_array_equal(mask.numpy(), seen)
            written = seen.any(0)  # unwritten slots are masked: any place
            np.testing.assert_array_equal(k.numpy()[written], np.array(keys)[written])


@pytest.mark.parametrize("sink, slots", [(0, 5), (2, 6), (3, 4)])
def test_the_picked_row_turns_each_slot_by_its_in_cache_distance(sink, slots):
    """A rolling export's keys sit rotated at their slots j and each query
    is rotated at its place, its slot c and c + W: the row picked for slot
    j, minus j, is the query's in-cache distance to that key (the ring's
    oracle), for every written slot, every index and every filling length."""
    window = slots - sink
    for index in range(4 * slots):
        lengths = range(1, slots - index + 1) if index < slots else (1,)
        for length in lengths:
            first, queries, keys, allowed = ring_oracle(index, length, sink, slots)
            c = first + np.arange(length)
            rows = np.concatenate([queries, c, c + window])  # each row's angle
            turned = rows[:, None] - np.arange(slots)[None, :]  # (3T, S)
            picked = ops.cache.pick_rolling_logits(
                turned[None, None].astype(np.float32), first, sink
            ).numpy()[0, 0]
            want = np.array(queries)[:, None] - np.array(keys)[None, :]
            seen = np.array(allowed)
            np.testing.assert_array_equal(picked[seen], want[seen])


@pytest.mark.parametrize("axis, count", [(1, 1), (2, 1), (2, 3), (0, 2)])
def test_in_place_writes_put_the_rows_where_a_copy_does(axis, count):
    """`update_slice` inside `in_place_writes()` in a graph loop: each step
    overwrites its rows of the loop's own buffer, as NumPy's assignment."""
    import tensorflow as tf

    shape = [3, 2, 7, 4][: max(axis + 2, 3)]
    steps = shape[axis] // count
    updates = np.random.default_rng(axis).normal(size=[steps] + shape)
    updates = updates.astype("float32")
    reach = [slice(None)] * len(shape)

    @tf.function
    def loop(fresh):
        def body(t, buffer):
            where = list(reach)
            where[axis] = slice(0, count)
            update = tf.gather(updates, t)[tuple(where)]
            with ops.cache.in_place_writes():
                return t + 1, ops.cache.update_slice(buffer, update, t * count, axis)

        return tf.while_loop(lambda t, _: t < steps, body, (0, fresh + 0.0))[1]

    start = np.full(shape, -1.0, "float32")
    want = start.copy()
    for t in range(steps):
        where = list(reach)
        where[axis] = slice(t * count, (t + 1) * count)
        source = list(reach)
        source[axis] = slice(0, count)
        want[tuple(where)] = updates[t][tuple(source)]
    np.testing.assert_array_equal(loop(tf.constant(start)).numpy(), want)
    np.testing.assert_array_equal(loop(tf.constant(start)).numpy(), want)
