"""The forgetting gate's decay bias (FoX): running sums of log-gates.

Pure float32 functions. `D[i, j] = sum_{l=j+1..i} log f_l = c_i - c_j` with
`c` the running sum of the log-gates `log f` `(B, T, N)`; a decoding step
needs no cumulative sum over the history, only the running value of the
previous position (`step_sums`).
"""

import functools

import tensorflow as tf

from keras_posenc._backend import IS_TENSORFLOW, xp
from keras_posenc.ops._gradient import registered_gradient
from keras_posenc.ops.blocks import block_positions, to_band, to_blocks
from keras_posenc.ops.cache import rolling_positions, write_rows


def decay_bias(log_forward, log_backward=None, floor=None, fused=False):
    """`(B, N, T, T)`: `c_i - c_j` for keys `j <= i` (0 after the query).

    With `log_backward` (bidirectional) keys after the query get
    `sum_{l=i..j-1} log b_l`, the mirror image over a second gate. With
    `floor`, the bias is `max(bias, floor)`, its gradient passed straight
    through (in attention a floored pair's gradient is 0 either way: its
    softmax weight is 0).

    The pairs' gradient is written out (`_pair_bias`): the running sums'
    gradients are the row and column sums of the upstream gradient on each
    side of the diagonal (`_triangle_sums`: two passes over it, on blocks),
    where TensorFlow's own would make a select and a broadcast subtraction's
    two reductions per side (a training step of a 2-layer `fox` classifier
    at B=16, N=4, T=512: 2.0x -> 1.4x `none`, `benchmarks/results/speed_steps.md`;
    with TensorFlow's gradient of the floor, 1.55x).

    With `fused=True` the pairs run as one function compiled by XLA (inside
    a plain graph too): one pass over `(B, N, T, T)` where TensorFlow's
    kernels make four (two subtractions, the select, the floor). The layer's
    training path (`ForgettingGate`): 1.44x -> 1.26-1.28x `none`, measured as
    above (`benchmarks/results/speed_steps.md`: 1.31x). The gradient stays
    TensorFlow's reductions (compiled too it was no faster), and exports
    trace without it: a converter gets the plain ops.
    """
    c = xp.transpose(xp.cumsum(log_forward, axis=1), [0, 2, 1])  # (B, N, T): c_t
    if log_backward is None:
        e = None
    else:  # exclusive running sum: e_t = sum_{l < t} log b_l
        e = xp.transpose(xp.cumsum(log_backward, axis=1, exclusive=True), [0, 2, 1])
    return _pair_bias(c, e, floor, fused)


def _lower(length):
    """`(T, T)` boolean: `j <= i`."""
    rows = xp.range(length)
    return rows[None, :] <= rows[:, None]


def _pairs(c, e, floor):
    """`_pair_bias`'s values, without its gradient."""
    before = c[:, :, :, None] - c[:, :, None, :]  # (B, N, T, T): c_i - c_j
    at_or_before = _lower(xp.shape(c)[-1])
    if e is None:
        bias = xp.where(at_or_before, before, xp.zeros_like(before))
    else:
        after = e[:, :, None, :] - e[:, :, :, None]  # e_j - e_i
        bias = xp.where(at_or_before, before, after)
    return bias if floor is None else xp.maximum(bias, floor)


@functools.cache
def _compiled_pairs(floor):
    """`_pairs` as one XLA-compiled function, one per floor: made once, so an
    eager caller compiles once per shape, not at every call (on JAX and
    PyTorch, `_pairs` as written: Keras compiles the whole step there)."""
    if not IS_TENSORFLOW:
        return functools.partial(_pairs, floor=floor)
    return tf.function(
        functools.partial(_pairs, floor=floor), jit_compile=True, autograph=False
    )


@tf.autograph.experimental.do_not_convert
def _pair_bias(c, e, floor, fused=False):
    """`where(j <= i, c_i - c_j, e_j - e_i)` `(B, N, T, T)` (0 after `i` without `e`).

    At least `floor` (unless None); the floor passes its gradient through.
    `fused`: the pairs compiled by XLA as one function.

    The gradient reads nothing from the forward pass (its mask comes from
    the upstream gradient's shape): a SavedModel of a graph holding it
    saves its gradient too, which a closure over a forward tensor forbids.
    """

    pairs = _compiled_pairs(floor) if fused else functools.partial(_pairs, floor=floor)

    if e is None:
        return _one_sided(lambda c: pairs(c, None), c)
    return _two_sided(pairs, c, e)


#: Rows and columns of the square blocks `_triangle_sums` reduces at once.
PAIR_BLOCK = 32


def _triangle_sums(upstream):
    """`(B, N, T, T)` -> `(B, N, T)` each: the row and column sums of its lower
    triangle (`j <= i`), and of the whole.

    Two passes over `upstream`, where masking it first would make four and a
    write: on blocks of `PAIR_BLOCK` rows and columns (zero-padded to a
    multiple of it), every block off the diagonal lies wholly on one side, so
    its row and column sums go whole to one triangle; only the diagonal
    blocks (one in `T / PAIR_BLOCK`) are masked. The gradient of a fox
    attention layer at B=16, N=4, T=512: 15.2 -> 4.6 ms here
    (`docs/measurements.md`).
    """
    block = PAIR_BLOCK
    length = upstream.shape[-1]
    if length is None or length % block:
        length = xp.shape(upstream)[-1]
        pad = -length % block
        upstream = xp.pad(upstream, [[0, 0], [0, 0], [0, pad], [0, pad]])
    padded = xp.shape(upstream)[-1]
    blocks = padded // block
    grid = xp.reshape(upstream, [-1, blocks, block, blocks, block])  # M, I, i, J, j
    block_rows = xp.reduce_sum(grid, axis=-1)  # (M, I, i, J): row sums per block
    block_columns = xp.reduce_sum(grid, axis=2)  # (M, I, J, j): column sums
    index = xp.range(blocks)
    diagonal = xp.gather(  # (M, I, i, j): the blocks (I, I)
        grid,
        xp.broadcast_to(index, [xp.shape(grid)[0], blocks]),
        axis=3,
        batch_dims=2,
    )
    diagonal = xp.linalg.band_part(diagonal, -1, 0)
    earlier = xp.cast(index[None, :] < index[:, None], upstream.dtype)  # (I, J): J < I
    lower_rows = xp.einsum("mirj,ij->mir", block_rows, earlier)
    lower_columns = xp.einsum("mijc,ij->mjc", block_columns, earlier)
    sums = (
        lower_rows + xp.reduce_sum(diagonal, axis=-1),
        lower_columns + xp.reduce_sum(diagonal, axis=-2),
        xp.reduce_sum(block_rows, axis=-1),
        xp.reduce_sum(block_columns, axis=1),
    )
    shape = xp.shape(upstream)[:-1]
    return [xp.reshape(part, shape)[..., :length] for part in sums]


def _pairs_gradient(upstream, two_sided):
    """`decay_bias`'s gradient into `c` (and `e` if `two_sided`)."""
    lower_rows, lower_columns, rows, columns = _triangle_sums(upstream)
    d_c = lower_rows - lower_columns  # sums over j <= i per i, over i >= j per j
    if not two_sided:
        return [d_c]
    return [d_c, (columns - lower_columns) - (rows - lower_rows)]  # j > i, i < j


_one_sided = registered_gradient("KerasPosencDecayBias")(
    functools.partial(_pairs_gradient, two_sided=False)
)
_two_sided = registered_gradient("KerasPosencTwoSidedDecayBias")(
    functools.partial(_pairs_gradient, two_sided=True)
)


def decay_band(log_forward, log_backward, window):
    """`decay_bias` on the band of block-local attention `(B, N*nb, W, 3W)`.

    The same values as `decay_bias` at each block's queries and band keys
    (`ops.blocks`: blocks of `window` queries, a band of 3W keys), without
    the `(T, T)` matrix; slots outside the sequence hold values the band's
    mask removes.
    """
    length = xp.shape(log_forward)[1]
    query_pos, key_pos = block_positions(length, window)  # (nb, W), (nb, 3W)
    at_or_before = key_pos[:, None, :] <= query_pos[:, :, None]  # (nb, W, 3W)
    heads = log_forward.shape[-1]

    def blocked(values):  # (B, T, N) -> queries (B, N*nb, W, 1), keys (.., 3W, 1)
        values = xp.transpose(values, [0, 2, 1])[:, :, :, None]  # (B, N, T, 1)
        return to_blocks(values, window), to_band(values, window)

    c_q, c_k = blocked(xp.cumsum(log_forward, axis=1))
    before = c_q - xp.transpose(c_k, [0, 1, 3, 2])  # (B, N*nb, W, 3W): c_i - c_j
    if log_backward is None:
        after = xp.zeros_like(before)
    else:
        e_q, e_k = blocked(xp.cumsum(log_backward, axis=1, exclusive=True))
        after = xp.transpose(e_k, [0, 1, 3, 2]) - e_q  # e_j - e_i
    # (N*nb, W, 3W): a rank below the bias's keeps TFLite's SELECT_V2 (TFLM
    # has no SELECT, which equal shapes would convert to).
    side = xp.tile(at_or_before, [heads, 1, 1])
    return xp.where(side, before, after)


def step_sums(log_forward, sums, index):
    """Running sums `(B, T, N)` of new tokens at `index ...` and the updated state.

    `sums` `(B, S_max, N)` holds `c_j` of every position written so far; the
    new tokens continue from `c_{index-1}` (0 at the start) and are written
    at `index`.
    """
    index = xp.cast(index, xp.int32)
    previous = xp.gather(sums, xp.maximum(index - 1, 0), axis=1)  # (B, N)
    previous = previous * xp.cast(index > 0, previous.dtype)
    running = previous[:, None, :] + xp.cumsum(log_forward, axis=1)  # (B, T, N)
    return running, write_rows(sums, running, index)


def step_bias(running, sums):
    """`(B, N, T, S_max)`: `c_i - c_j` of new tokens against every cached slot.

    Slots after a query (not yet written, or later new tokens) hold no
    meaningful value: the caller masks them.
    """
    c_i = xp.transpose(running, [0, 2, 1])[:, :, :, None]  # (B, N, T, 1)
    c_j = xp.transpose(sums, [0, 2, 1])[:, :, None, :]  # (B, N, 1, S_max)
    return c_i - c_j


def rolling_bias(log_forward, gates, index, sink_tokens):
    """Bias `(B, N, T, S)` of new tokens over a rolling cache, and the state.

    The rolling form of the decay (attention sinks, `rolling_positions`):
    `gates` `(B, S, N)` holds each slot's own log-gate `log f` (not a running
    sum), the new tokens' are written at their slot, and the gates are summed
    in the cache's order: `D[i, j]` is the sum of `log f_l` over the cached
    tokens `l` placed after `j`, up to the query `i`, the decay over the text
    the cache holds (an evicted token's gate drops out, as its distance
    does for the positions inside the cache). Sums of at most `S` terms: no
    running value grows with the stream.
    """
    slots = gates.shape[1]
    slot, q_pos, k_pos, mask = rolling_positions(
        index, xp.shape(log_forward)[1], sink_tokens, slots
    )
    gates = write_rows(gates, log_forward, slot)
    written = mask[-1]  # (S,): the slots holding a token (the last query sees all)
    placed = k_pos[None, :] <= k_pos[:, None]  # (S, S): slot l at or before slot s
    placed = xp.cast(xp.logical_and(placed, written[None, :]), gates.dtype)
    seen = k_pos[None, :] <= q_pos[:, None]  # (T, S): slot l at or before query t
    seen = xp.cast(xp.logical_and(seen, written[None, :]), gates.dtype)
    c_keys = xp.einsum("bln,sl->bns", gates, placed)  # (B, N, S)
    c_queries = xp.einsum("bln,tl->bnt", gates, seen)  # (B, N, T)
    return c_queries[:, :, :, None] - c_keys[:, :, None, :], gates
