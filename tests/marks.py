"""Parameter lists whose other values run in `make test` only (marked slow)."""

import pytest


def fast_only(values, fast):
    """`values` as pytest parameters, those not in `fast` marked slow.

    `make check` then runs one value of each kind (`fast`), and `make test`
    runs them all.
    """
    unknown = set(fast) - set(values)
    if unknown:
        raise ValueError(f"`fast` must be among `values`. Received: {sorted(unknown)}")
    return [
        value if value in fast else pytest.param(value, marks=pytest.mark.slow)
        for value in values
    ]
