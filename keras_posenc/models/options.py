"""The builders' two option dicts, one per concern, and the old keywords.

`position_options` holds the method's layers' options and the stack's
`POSITION_KEYS`; `attention_options` the `ATTENTION_KEYS`. `grouped_options`
folds the keywords they replace (`max_length=`, `attention_window=`, ...)
into them, for `TransformerStack`, the encoder builders and `CausalLM` alike.
"""

from keras_posenc import _checks
from keras_posenc.layers.relative_multi_head_attention import ATTENTION_KEYS

#: `max_length` when neither `position_options` nor the old keyword sets it.
DEFAULT_MAX_LENGTH = 512
#: The stack's own keys of `position_options` (the rest go to the method's layers).
POSITION_KEYS = ("max_length", "grid_shape", "share_position_bias")
#: The keys of `attention_options` (the attention layer's): the pattern, LSH's
#: hashing, grouped-query attention's `num_key_value_heads`.
ATTENTION_KEYS = ATTENTION_KEYS


def grouped_options(position_options, attention_options, keywords):
    """`(position_options, attention_options)` as new dicts, the old keywords
    (`max_length=`, `attention_window=`, ...) folded into their home.

    An unknown keyword is a `TypeError`; a key given both ways a `ValueError`.
    """
    for name, value in (
        ("position_options", position_options),
        ("attention_options", attention_options),
    ):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"`{name}` must be a dict or None. Received: {value!r}")
    homes = (
        (dict(position_options or {}), POSITION_KEYS, "position_options"),
        (dict(attention_options or {}), ATTENTION_KEYS, "attention_options"),
    )
    for key, value in keywords.items():
        home = next((h for h in homes if key in h[1]), None)
        if home is None:
            raise TypeError(
                f"Unexpected keyword argument {key!r}: the builders take "
                f"{list(POSITION_KEYS)} in position_options and "
                f"{list(ATTENTION_KEYS)} in attention_options"
            )
        if key in home[0]:
            _checks.fail(key, f"given once (also in {home[2]})", value)
        home[0][key] = value
    return homes[0][0], homes[1][0]
