"""The argument checks of `keras_posenc.models.build_encoder`."""

from keras_posenc import _checks
from keras_posenc.methods import METHODS, SHARED_BIAS_METHODS


def check_encoder_arguments(
    position,
    vocab_size,
    input_dim,
    sequence_length,
    hidden_dim,
    num_layers,
    num_heads,
    dropout,
    max_length,
    grid_shape,
    attention_window,
    share_position_bias,
    **others,
):
    """`(method, hidden_dim, num_layers, num_heads, sequence_length, dropout,
    max_length)` checked, or a `ValueError`/`TypeError` naming the argument."""
    method = METHODS[_checks.choice("position", position, tuple(METHODS))]
    if (vocab_size is None) == (input_dim is None):
        _checks.fail(
            "vocab_size",
            "given, or input_dim given, but not both",
            vocab_size,
            fix=f"Received input_dim={input_dim!r} too",
        )
    hidden_dim = _checks.positive_int("hidden_dim", hidden_dim)
    num_layers = _checks.positive_int("num_layers", num_layers)
    num_heads = _checks.positive_int("num_heads", num_heads)
    if hidden_dim % num_heads:
        _checks.fail("hidden_dim", f"divisible by num_heads={num_heads}", hidden_dim)
    sequence_length = _checks.positive_int("sequence_length", sequence_length, True)
    dropout = _checks.rate("dropout", dropout)
    max_length = _checks.positive_int("max_length", max_length)
    _checks.positive_int("attention_window", attention_window, allow_none=True)
    if grid_shape is not None and not method.takes_grid:
        grid_methods = [n for n, m in METHODS.items() if m.takes_grid]
        _checks.fail(
            "grid_shape", f"None unless position is in {grid_methods}", grid_shape
        )
    if position == "learned" and sequence_length and sequence_length > max_length:
        _checks.fail(
            "max_length",
            f">= sequence_length={sequence_length} for position='learned'",
            max_length,
            fix="Use a relative method such as position='t5' for long sequences",
        )
    check_share_position_bias(
        share_position_bias, position, method, grid_shape, attention_window
    )
    return (
        method,
        hidden_dim,
        num_layers,
        num_heads,
        sequence_length,
        dropout,
        max_length,
    )


def check_share_position_bias(value, position, method, grid_shape, attention_window):
    """Refuses `share_position_bias=True` where there is no one bias to share."""
    if not _checks.boolean("share_position_bias", value):
        return
    if position not in SHARED_BIAS_METHODS or (
        method.bias_needs_grid and not grid_shape
    ):
        _checks.fail(
            "share_position_bias",
            f"False unless position is in {SHARED_BIAS_METHODS} (with a "
            "grid_shape for those that read a grid)",
            value,
            fix=f"position={position!r} (grid_shape={grid_shape!r}) has no bias "
            "producer to share",
        )
    if attention_window is not None:
        _checks.fail(
            "share_position_bias",
            "False with block-local attention (each block evaluates its own "
            "band of the bias)",
            value,
            fix=f"Received attention_window={attention_window!r}",
        )
