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


def lsh_oracle(
    q, k, v, rotations, size, key_mask=None, causal=False, runs=None, bias=None
):
    """LSH attention, one (batch, head, round) at a time, in loops.

    `rotations` `(R, H, K/2)` of the whole length's K; a row hashes on the
    first `K_b / 2` columns, K_b the bucket count of its real tokens alone
    (their chunk count, made even, 2 at least). `bias` `(B, N, T, T)` read at
    each scored pair, `runs` `(B, T)` documents.
    """
    batch, heads, length, _ = q.shape
    real = np.ones((batch, length), bool) if key_mask is None else key_mask
    out = np.zeros(v.shape)
    for b in range(batch):
        chunks = -(-int(real[b].sum()) // size)
        row_buckets = max(chunks + chunks % 2, 2)
        for n in range(heads):
            unit = k[b, n] / np.linalg.norm(k[b, n], axis=-1, keepdims=True)
            contexts, totals = [], []
            for rotation in rotations[:, :, : row_buckets // 2]:
                turned = unit @ rotation
                bucket = np.argmax(np.concatenate([turned, -turned], -1), -1)
                bucket = np.where(real[b], bucket, 2 * rotation.shape[1])
                order = sorted(range(length), key=lambda t: (bucket[t], t))
                context, total = np.zeros(v.shape[2:]), np.zeros(length)
                for place, i in enumerate(order):
                    chunk = place // size
                    first = max(chunk - 1, 0) * size
                    seen = order[first : min((chunk + 1) * size, length)]
                    logits = []
                    for j in seen:
                        value = q[b, n, i] @ unit[j]
                        if bias is not None:
                            value += bias[b, n, i, j]
                        ok = real[b, j] and not (causal and j > i)
                        ok = ok and (runs is None or runs[b, i] == runs[b, j])
                        if j == i:  # Reformer's self mask
                            value = -1e5
                        logits.append(value if ok else -1e9)
                    logits = np.array(logits)
                    top = logits.max()
                    weights = np.exp(logits - top)
                    total[i] = top + np.log(weights.sum())
                    context[i] = (weights / weights.sum()) @ v[b, n, seen]
                contexts.append(context)
                totals.append(total)
            share = np.exp(np.array(totals) - np.max(totals, 0))
            share /= share.sum(0)
            out[b, n] = np.einsum("rt,rth->th", share, np.array(contexts))
    return out
