"""Resolving the `start_index` / `positions` call arguments (shared by layers)."""

import numpy as np

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import dim, rank
from keras_posenc.ops import position_range


def resolve_positions(inputs, start_index=0, positions=None, ranks=(1, 2)):
    """Float32 positions of the tokens of `inputs` `(B, L, ...)`.

    Explicit `positions` (`(L,)`, `(B, L)`, or with a trailing coordinate
    axis where `ranks` allows it) win; otherwise `start_index, ...,
    start_index + L - 1`, shape `(L,)`.
    """
    if positions is None:
        return position_range(dim(inputs, 1), start_index)
    positions = xp.cast(positions, xp.float32)
    if rank(positions) not in (None,) + tuple(ranks):
        shapes = {1: "(T,)", 2: "(B, T)", 3: "(B, T, C)"}
        expected = " or ".join(shapes[rank] for rank in ranks)
        raise ValueError(
            f"`positions` must have shape {expected}. "
            f"Received: positions.shape={positions.shape}"
        )
    return positions


def to_coordinates(positions, coordinate_dim=1, grid_shape=None, name="positions"):
    """`(..., L, C)` coordinates of resolved positions `(..., L[, C])`.

    With `grid_shape`, positions are flat indices of a row-major grid; with
    one coordinate they gain a trailing axis; otherwise they must already end
    in `coordinate_dim`.
    """
    if grid_shape:
        check_on_grid(positions, grid_shape, name)
        return ops.grid_coordinates(positions, grid_shape)
    if coordinate_dim == 1:
        return positions[..., None]
    if rank(positions) == 1:
        _checks.fail(
            name,
            f"given as (T, C) coordinates for coordinate_dim={coordinate_dim}",
            None,
        )
    if positions.shape[-1] != coordinate_dim:
        raise ValueError(
            f"`{name}` must end in coordinate_dim={coordinate_dim}. "
            f"Received: {name}.shape={positions.shape}"
        )
    return positions


def check_on_grid(positions, grid_shape, name="positions"):
    """Flat indices must lie on the grid (else they get invented coordinates).

    Checked whenever the indices are known before running: eager calls, and
    graphs whose positions are constants.
    """
    cells = int(np.prod(grid_shape))
    known = xp.get_static_value(positions)
    if known is None or np.size(known) == 0:
        return
    low, high = float(np.min(known)), float(np.max(known))
    if low < 0 or high >= cells:
        _checks.fail(
            name,
            f"flat indices in [0, {cells}) for grid_shape={grid_shape}",
            f"indices from {low:g} to {high:g}",
            fix="Tokens past the grid would get invented coordinates; "
            "use a larger grid_shape",
        )
