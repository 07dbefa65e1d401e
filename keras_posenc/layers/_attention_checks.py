"""Call-argument checks of the attention layers, before any work."""


def check_call(window, query, key, value, **call_arguments):
    """Errors for calls the layer cannot honour, before any work."""
    s_v, s_k = value.shape[1], key.shape[1]
    if s_v is not None and s_k is not None and s_v != s_k:
        raise ValueError(
            "`key` and `value` must have the same length. Received: "
            f"key.shape={key.shape}, value.shape={value.shape}"
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
