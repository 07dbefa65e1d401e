"""The builders' two option dicts, each the one form of its options.

`position_options` holds the method's layers' options and the stack's
`POSITION_KEYS`; `attention_options` the LSH concern (`ATTENTION_KEYS`, as
the attention layer takes it). `attention_window` and `num_key_value_heads`
are keywords of their own, in the builders as in the attention layer.
"""

from keras_posenc import _checks
from keras_posenc.layers.relative_multi_head_attention import (
    ATTENTION_KEYS,
    lsh_options,
)

#: `max_length` when `position_options` does not set it.
DEFAULT_MAX_LENGTH = 512
#: The stack's own keys of `position_options` (the rest go to the method's layers).
POSITION_KEYS = ("max_length", "grid_shape", "share_position_bias")
#: The keys of `attention_options`: the attention type and LSH's hashing.
ATTENTION_KEYS = ATTENTION_KEYS


def checked_options(position_options, attention_options):
    """`(position_options, attention_options)` as new dicts, or the error:
    each a dict or None, `attention_options`' keys among `ATTENTION_KEYS`."""
    if position_options is not None and not isinstance(position_options, dict):
        _checks.fail(
            "position_options", "a dict or None", position_options, error=TypeError
        )
    return dict(position_options or {}), lsh_options(attention_options)
