"""NumPy oracles shared by several test modules, written from the papers."""

import math

import numpy as np


def sinusoid_oracle(positions, width, max_wavelength):
    out = np.zeros((len(positions), width))
    for p_index, p in enumerate(positions):
        for i in range(width):
            angle = p / max_wavelength ** (2 * (i // 2) / width)
            out[p_index, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return out


def t5_bucket_oracle(relative_position, bidirectional, num_buckets, max_distance):
    """Mesh TensorFlow's `_relative_position_bucket`, in NumPy."""
    ret = np.zeros_like(relative_position)
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    safe = np.maximum(n, 1).astype(np.float32)
    large = max_exact + (
        np.log(safe / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(np.int32)
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(is_small, n, large)
