"""Key/value cache of cached decoding, as pure functions.

An attention layer's cache is a pair of tensors, the keys and the values of
positions `0 .. S_max - 1`, each heads-first `(B, N_kv, S_max, H)`: the
layout a batched matmul reads without moving a cached key (and LiteRT-LM's
`kv_cache_k_<i>` / `kv_cache_v_<i>`); new tokens are written at
`cache_update_index` along axis 2. keras-hub's `CachedMultiHeadAttention`
form, one `(B, 2, S_max, N, H)` tensor, converts with `from_stacked` and
`to_stacked`.
"""

import contextlib
import contextvars

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

from keras_posenc._backend import BACKEND, IS_TENSORFLOW, xp
from keras_posenc._compat import dim, rank
from keras_posenc.ops.attention import in_xla

_STATIC = contextvars.ContextVar("keras_posenc_static_decoding", default=False)


@contextlib.contextmanager
def static_decoding():
    """Decoding steps traced inside read positions from constant tables.

    For exports with a static cache length: the bias of every (query, key)
    pair of `0 .. S_max - 1`, the absolute encodings and the rotary cos and
    sin of every position fold into constants and the step gathers the rows
    of its runtime positions, so no logarithm, bucketing, selection, sine or
    exponential runs on the device (microcontrollers lack several of those
    ops at int8).
    """
    token = _STATIC.set(True)
    try:
        yield
    finally:
        _STATIC.reset(token)


def is_static():
    """Whether the caller is traced inside `static_decoding()`."""
    return _STATIC.get()


_BOUND = contextvars.ContextVar("keras_posenc_read_bound", default=None)
_IN_PLACE = contextvars.ContextVar("keras_posenc_in_place_writes", default=False)


@contextlib.contextmanager
def in_place_writes():
    """Plain-graph cache writes traced inside overwrite their operand's buffer.

    For the compiled decoding loop's steps, whose caches are loop variables
    no other tensor reads once a step has written them: TensorFlow's
    functional writes copy the whole cache at every step (a loop variable's
    buffer is never handed on), 0.2 ms of a `(8, 2, 256, 4, 32)` cache's
    step, more than its matmuls. Only where the caller owns every operand's
    buffer: a cache tensor a user passed in would change under them.
    """
    token = _IN_PLACE.set(True)
    try:
        yield
    finally:
        _IN_PLACE.reset(token)


@contextlib.contextmanager
def read_bound(width):
    """Steps traced inside read at most the cache's first `width` slots.

    For XLA, where a slice needs a static size: the compiled decoding loop
    runs its steps in phases, each under the bound of the last position it
    writes, so a step reads the slots written so far (rounded up to the
    phase), not every slot of the cache. `width` a positive int.
    """
    token = _BOUND.set(int(width))
    try:
        yield
    finally:
        _BOUND.reset(token)


def read_reach(index, length, max_length):
    """How many of the `max_length` cache slots a step at `index` reads.

    The slots after the step's last position, `index + length`, are empty or
    in its future: a causal step gives them no weight, so it need not read
    them. `None` (every slot) in an export (`static_decoding()`: the
    exported step keeps one static shape) and under XLA outside
    `read_bound`; under XLA inside it, the bound (a static int, at most
    `max_length`); in a plain graph or eagerly, `index + length` (an int32
    tensor). Reading fewer slots costs less: the products of a step over a
    256-slot cache are most of its time at batch 8.
    """
    if _STATIC.get():
        return None
    if in_xla():
        bound = _BOUND.get()
        if bound is None or (isinstance(max_length, int) and bound >= max_length):
            return None
        return bound
    return xp.cast(index, xp.int32) + length


def position_rows(encode, index, length, max_length):
    """`encode(index, length)`: the `(..., T, D)` encoding of T tokens at `index`.

    `encode(start, count)` returns the encoding of positions `start ...`.
    Inside `static_decoding()` the encoding of all `max_length` positions is
    a constant and the rows of the runtime positions are gathered from it.
    """
    if not _STATIC.get():
        return encode(index, length)
    rows = xp.range(length) + xp.cast(index, xp.int32)
    return xp.gather(encode(0, max_length), rows, axis=-2)


def _stub(slots):
    """A `(1, slots, 1)` stand-in of the keys: bias producers read its length."""
    return xp.zeros(xp.stack([1, slots, 1]) if xp.is_tensor(slots) else [1, slots, 1])


def cached_bias(position_bias, query, slots, index):
    """Float32 bias `(1 or B, N, T, slots)` of queries at `index ...` vs the cache.

    `slots` (an int, or an int32 tensor of the slots a step reads) keys at
    `0 .. slots - 1`. Inside `static_decoding()` the bias is a constant the
    step gathers from: for a producer that reads `j - i` alone
    (`translation_invariant`), its `2 S_max - 1` distinct distances
    `(1, N, 2 S_max - 1)` (O(S): ALiBi, T5, clipped and the 1-D dynamic
    bias), otherwise every `(S_max, S_max)` pair.
    """
    if not _STATIC.get():
        bias = position_bias(query, _stub(slots), start_index=index)
        return xp.cast(bias, xp.float32)
    rows = xp.range(xp.shape(query)[1]) + xp.cast(index, xp.int32)  # (T,)
    if getattr(position_bias, "translation_invariant", False):
        # One query at S_max - 1 against 2 S_max - 1 keys: distances
        # -(S_max - 1) .. S_max - 1, no runtime input (a constant).
        table = position_bias(_stub(1), _stub(2 * slots - 1), start_index=slots - 1)
        table = xp.cast(table[:, :, 0], xp.float32)  # (1, N, 2S-1)
        after = xp.range(2 * slots - 1) > slots - 1  # keys after the query
        table = xp.where(after, xp.zeros_like(table), table)
        columns = xp.range(slots)[None, :] - rows[:, None] + (slots - 1)  # (T, S)
        return xp.gather(table, columns, axis=2)
    grid = position_bias(_stub(slots), _stub(slots))  # (1, N, S, S), a constant
    grid = xp.cast(grid, xp.float32) * _lower_triangle(slots)  # keys j <= i
    return xp.gather(grid, rows, axis=2)


def _lower_triangle(slots):
    """`(S, S)` float32 ones where the key is at or before the query, else 0.

    A NumPy constant for a static `slots`, so the converter folds the
    masked table (`band_part` would leave float NEG, SELECT and ZEROS_LIKE
    ops in an int8 step, which TFLM cannot run).
    """
    if isinstance(slots, int):
        return xp.constant(np.tril(np.ones((slots, slots), np.float32)))
    return xp.linalg.band_part(xp.ones((slots, slots), xp.float32), -1, 0)


def rolling_bias(position_bias, query, slots, query_positions, key_positions):
    """Float32 bias `(1 or B, N, T, S)` at the in-cache positions of a rolling cache.

    Inside `static_decoding()` the bias is a constant the step gathers from,
    as `cached_bias`: the `2 S - 1` distances of a translation-invariant
    producer at `key - query` place, otherwise the `(S, S)` grid's rows and
    columns of the runtime places (integers in `0 .. S - 1`).
    """
    if not _STATIC.get():
        bias = position_bias(
            query,
            _stub(slots),
            positions=xp.cast(query_positions, xp.float32),
            key_positions=xp.cast(key_positions, xp.float32),
        )
        return xp.cast(bias, xp.float32)
    rows, columns = query_positions, key_positions  # int32 (T,), (S,)
    if getattr(position_bias, "translation_invariant", False):
        table = position_bias(_stub(1), _stub(2 * slots - 1), start_index=slots - 1)
        table = table[:, :, 0]  # (1, N, 2S-1)
        distances = columns[None, :] - rows[:, None] + (slots - 1)  # (T, S)
        return xp.gather(xp.cast(table, xp.float32), distances, axis=2)
    grid = xp.cast(position_bias(_stub(slots), _stub(slots)), xp.float32)
    return xp.gather(xp.gather(grid, rows, axis=2), columns, axis=3)


def update_cache(cache, key, value, index, rounding=None, reach=None):
    """Writes heads-last key/value heads `(B, T, N_kv, H)` into `cache` at `index`.

    `cache` is the pair `(keys, values)`, each `(B, N_kv, S_max, H)`; the
    new heads move to that layout (T tokens: a small transpose) and are
    written along axis 2, so no cached slot moves. `rounding`, when given,
    is a pair of functions putting the old cache, the new heads and the
    updated cache on the int8 key and value caches' grids (quantization-aware
    models: every tensor of a write has its cache's range). `reach`
    (`read_reach`), when given: only the first `reach` slots are read.

    Returns:
        `(keys, values, cache)`: the cached keys and values `(B, N_kv, S_max
        or reach, H)` and the updated pair.
    """
    index = xp.cast(index, xp.int32)
    rounding = rounding or (lambda x: x, lambda x: x)
    updated = []
    for buffer, new, rounded in zip(cache, (key, value), rounding):
        new = xp.transpose(rounded(xp.cast(new, buffer.dtype)), [0, 2, 1, 3])
        updated.append(rounded(update_slice(rounded(buffer), new, index, axis=2)))
    if reach is not None:  # a slice of each: no copy of the slots past it
        return updated[0][:, :, :reach], updated[1][:, :, :reach], tuple(updated)
    return updated[0], updated[1], tuple(updated)


def from_stacked(cache):
    """keras-hub's `(B, 2, S, N, H)` cache as the pair `(B, N, S, H)` each."""
    return tuple(xp.transpose(cache[:, i], [0, 2, 1, 3]) for i in (0, 1))


def to_stacked(pair):
    """The pair `(B, N, S, H)` each as keras-hub's `(B, 2, S, N, H)` cache."""
    return xp.stack([xp.transpose(c, [0, 2, 1, 3]) for c in pair], axis=1)


def write_rows(buffer, rows, index):
    """`buffer (B, S_max, ...)` with `rows (B, T, ...)` written at position `index`."""
    return update_slice(buffer, xp.cast(rows, buffer.dtype), index, axis=1)


def update_slice(operand, update, index, axis):
    """`operand` with `update` written from `index` along `axis` (0 elsewhere).

    XLA and exports (`static_decoding()`, which TFLite reads as
    DYNAMIC_UPDATE_SLICE) take `dynamic_update_slice`. A plain graph takes
    a scatter of the rows `operand[:, ..., index + t]`: TensorFlow's kernel
    of XLA's op costs ~55 us a call even on a `(1, 256)` tensor, more than
    the decoding step's matmuls; inside `in_place_writes()`, a write into
    `operand`'s own buffer (the scatter copies all of `operand`; on PyTorch,
    whose `slice_update` clones its operand, a copy into a view of it).
    """
    if _IN_PLACE.get() and BACKEND == "torch":  # eager, under no_grad
        count = update.shape[axis]
        operand.narrow(axis, int(index), count).copy_(update.to(operand.dtype))
        return operand
    index = xp.cast(index, xp.int32)
    if _STATIC.get() or in_xla():
        start = [0] * axis + [index] + [0] * (rank(operand) - axis - 1)
        if not IS_TENSORFLOW:
            return xp.ops.slice_update(operand, start, xp.cast(update, operand.dtype))
        return dynamic_update_slice(operand, update, start)
    if _IN_PLACE.get():
        return _write_in_place(operand, update, index, axis)
    shape = xp.shape(update)
    ranges = [xp.range(shape[i]) for i in range(axis + 1)]
    ranges[axis] = ranges[axis] + index
    where = xp.stack(xp.meshgrid(*ranges, indexing="ij"), axis=-1)  # (..., axis+1)
    return xp.tensor_scatter_nd_update(operand, where, update)


def _write_in_place(operand, update, index, axis):
    """`update_slice` on `operand`'s own buffer (`in_place_writes()`).

    `operand` seen as rows `(outer * S, inner)` around `axis` (a reshape
    shares the buffer); TensorFlow's InplaceUpdate writes the `outer * T`
    rows of `update` into it and returns the same buffer.
    """
    shape = xp.shape(operand)
    count = xp.shape(update)[axis]
    inner = xp.reduce_prod(shape[axis + 1 :])
    outer = xp.range(xp.reduce_prod(shape[:axis]))[:, None] * shape[axis]
    rows = xp.reshape(outer + index + xp.range(count)[None, :], [-1])
    written = tf.raw_ops.InplaceUpdate(
        x=xp.reshape(operand, [-1, inner]),
        i=rows,
        v=xp.reshape(xp.cast(update, operand.dtype), [-1, inner]),
    )
    return xp.ensure_shape(xp.reshape(written, shape), operand.shape)


def causal_window(state, inputs, index, kernel_size, rounding=None):
    """Inputs at `index - kernel_size + 1 ...` for a causal convolution, and the state.

    `state (B, S_max, D)` holds the inputs by position; `inputs (B, T, D)` are
    written at `index`, and the window `(B, T + kernel_size - 1, D)` reads
    zeros before position 0. `rounding(x)`, when given, puts the old state,
    the inputs and the updated state on the int8 state's grid, as
    `update_cache` does. Returns `(window, updated state)`.
    """
    rounded = rounding or (lambda x: x)
    state = rounded(write_rows(rounded(state), rounded(inputs), index))
    first = xp.cast(index, xp.int32) - (kernel_size - 1)
    where = xp.range(xp.shape(inputs)[1] + kernel_size - 1) + first
    window = xp.gather(state, xp.maximum(where, 0), axis=1)
    seen = (where >= 0)[None, :, None]
    if rounding is not None:  # a select keeps the state's int8 range
        return xp.where(seen, window, xp.zeros((), window.dtype)), state
    # A product by 0 or 1: calibrated int8 exports quantize it (not a select).
    return window * xp.cast(seen, window.dtype), state


def cache_mask(index, query_length, max_length, window=None):
    """Boolean `(T, S_max)`: query `index + t` sees the cached keys `j <= index + t`.

    Causal over the cache (slots after the query are empty or in its future);
    with `window`, also only the keys of block-local attention's band.
    """
    query = xp.range(query_length) + xp.cast(index, xp.int32)  # (T,)
    keys = xp.range(max_length)  # (S_max,)
    mask = keys[None, :] <= query[:, None]
    if window is not None:  # a key's block is at most the query's (causal)
        # Positions are >= 0, so a truncating division is the floor: TFLM has
        # int32 DIV, not FLOOR_DIV (nor an int32 ABS).
        blocks = [xp.truncatediv(p, window) for p in (keys, query)]
        near = blocks[1][:, None] - blocks[0][None, :] <= 1
        mask = xp.logical_and(mask, near)
    return mask


def rolling_positions(index, length, sink_tokens, slots):
    """Where tokens at `index ...` go in a rolling cache, and its positions.

    A rolling cache (attention sinks, Xiao et al. 2023, "Efficient Streaming
    Language Models with Attention Sinks") of `slots` = `sink_tokens + W`
    holds the first `sink_tokens` tokens and the last `W`: position `p` is
    written at slot `p` until the cache is full, then at `sink + (p - sink)
    mod W`, over the oldest. Positions are the tokens' places inside the
    cache, not in the text: the sinks `0 .. sink - 1`, then the window from
    oldest to newest, the newest query at `slots - 1` once full. `length`
    tokens arrive at once only while the cache fills (`index + length <=
    slots`); after that one at a time.

    Returns:
        `(slot, query_positions (T,), key_positions (S,), mask (T, S))`: the
        slot of the first new token, the in-cache positions of the queries and
        of every slot (all int32: an export gathers table rows at them), and
        True where a query sees a slot.
    """
    index = xp.cast(index, xp.int32)
    window = slots - sink_tokens
    # Integer ops a microcontroller runs (no SELECT, FLOOR_MOD or FLOOR_DIV
    # on int32 in TFLM): min/max, and a remainder of non-negative numbers.
    past = xp.maximum(index, sink_tokens) - sink_tokens
    slot = xp.minimum(index, sink_tokens + _remainder(past, window))
    newest = xp.minimum(index + length - 1, slots - 1)  # the last query's place
    # A window slot's age: how many tokens after its own the newest one came.
    ring = xp.range(sink_tokens, slots)
    age = _remainder(slot + length - 1 - ring + window, window)
    key_positions = xp.concat(
        [xp.range(sink_tokens), xp.maximum(newest - age, 0)], axis=0
    )  # (S,): unwritten slots (masked) clamp to 0
    fresh = xp.range(length) + index  # the text's positions of the new tokens
    query_positions = xp.minimum(fresh, slots - 1)
    mask = xp.range(slots)[None, :] <= fresh[:, None]  # written slots, causal
    return slot, query_positions, key_positions, mask


def pick_rolling_logits(logits, slot, sink_tokens):
    """Each slot's logit `(B, N, T, S)` from three per query `(B, N, 3T, S)`.

    Rows `t`, `T + t` and `2T + t` are query `t` rotated at its in-cache
    place, at its slot `c = slot + t` and at `c + W` (a rolling export's
    `_slot_rotation`, over keys rotated at their slots): a sink reads the
    first, a window slot `j <= c` the second and `j > c` (written a lap
    earlier) the third. Integer min/max and one GATHER (what TFLM runs).
    """
    shape = xp.shape(logits)
    length, slots = dim(logits, 2) // 3, logits.shape[-1]
    t, j = np.indices((length, slots), dtype=np.int32)  # (T, S) each
    # The flat index of row (choice * T + t), column j, where choice is
    # window * (1 + later): `later` (j > c) adds one block of T rows.
    step = (j >= sink_tokens).astype(np.int32) * length * slots
    later = xp.minimum(xp.maximum((j - t) - xp.cast(slot, xp.int32), 0), 1)
    rows = (t * slots + j + step) + step * later  # (T, S) int32
    flat = xp.reshape(logits, [shape[0], shape[1], 3 * length * slots])
    return xp.gather(flat, rows, axis=2)  # (B, N, T, S)


def _remainder(x, divisor):
    """`x mod divisor` for int32 `x >= 0` and a positive Python int `divisor`."""
    return x - divisor * xp.truncatediv(x, divisor)
