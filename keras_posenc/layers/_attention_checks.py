"""Argument checks of the attention layers, before any work."""

from keras_posenc import _checks


def check_heads(name, producer, num_heads):
    """A bias producer must make one bias per attention head."""
    heads = getattr(producer, "num_heads", num_heads)
    if heads != num_heads:
        _checks.fail(
            name,
            f"a producer of num_heads={num_heads} heads",
            f"{type(producer).__name__}(num_heads={heads})",
        )


def check_call(window, query, key, value, **call_arguments):
    """Errors for calls the layer cannot honour, before any work."""
    for name, tensor in (("query", query), ("value", value), ("key", key)):
        if tensor.shape.rank not in (None, 3):
            raise ValueError(
                f"`{name}` must have rank 3, (B, L, D): attention never folds "
                f"other axes into the batch. Received: {name}.shape={tensor.shape}"
            )
    s_v, s_k = value.shape[1], key.shape[1]
    if s_v is not None and s_k is not None and s_v != s_k:
        raise ValueError(
            "`key` and `value` must have the same length. Received: "
            f"key.shape={key.shape}, value.shape={value.shape}"
        )
    if call_arguments["cache"] is not None:
        check_cache(query, **call_arguments)
        return
    if call_arguments["cache_update_index"] is not None:
        raise ValueError(
            "`cache_update_index` goes with `cache`. Received: cache=None, "
            f"cache_update_index={call_arguments['cache_update_index']!r}"
        )
    if window is None:
        return
    t, s = query.shape[1], key.shape[1]
    if t is not None and s is not None and t != s:
        raise ValueError(
            "`attention_window` needs self-attention (equal query and key "
            f"lengths). Received: query.shape={query.shape}, key.shape={key.shape}"
        )
    if call_arguments["return_attention_scores"]:
        raise ValueError(
            "`return_attention_scores` needs the dense (T, S) weights, which "
            "local attention never builds. Received: return_attention_scores="
            f"True with attention_window={window}"
        )
    for name in ("attention_mask", "attention_bias", "positions", "key_positions"):
        if call_arguments[name] is not None:
            raise ValueError(
                f"`{name}` must be None with attention_window={window} (local "
                "attention builds its own band; use query/key masks and "
                f"start_index). Received: a {name} tensor"
            )


def check_cache(query, cache, cache_update_index, heads, **call_arguments):
    """Cached decoding is self-attention of new tokens at the cache's positions."""
    if cache_update_index is None:
        raise ValueError(
            "`cache_update_index` must be given with `cache` (the position of "
            "the first new token). Received: cache_update_index=None"
        )
    num_heads, key_dim, value_dim = heads
    expected = (2, None, num_heads, key_dim)
    if cache.shape.rank != 5 or any(
        want not in (None, got) for want, got in zip(expected, cache.shape[1:])
    ):
        raise ValueError(
            f"`cache` must have shape (B, 2, S_max, {num_heads}, {key_dim}). "
            f"Received: cache.shape={cache.shape}"
        )
    if value_dim not in (None, key_dim):
        raise ValueError(
            "`value_dim` must equal key_dim to keep keys and values in one cache. "
            f"Received: value_dim={value_dim}, key_dim={key_dim}"
        )
    if not call_arguments["self_attention"]:
        raise ValueError(
            "`value` and `key` must be None with `cache`: cached decoding is "
            "self-attention of the new tokens. Received: a value or key tensor"
        )
    for name in ("positions", "key_positions"):
        if call_arguments[name] is not None:
            raise ValueError(
                f"`{name}` must be None with `cache` (positions are "
                f"cache_update_index + t). Received: a {name} tensor"
            )
    if call_arguments["return_attention_scores"]:
        raise ValueError(
            "`return_attention_scores` must be False with `cache`. "
            "Received: return_attention_scores=True"
        )
