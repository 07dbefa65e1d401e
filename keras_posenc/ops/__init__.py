"""Pure tensor functions: no Keras state, float32 position math.

Written with `xp` (keras_posenc/_backend.py): TensorFlow's own functions on
TensorFlow, `keras.ops` on JAX and PyTorch.

`keras_posenc.ops` gathers the position functions (`positions`), the
attention plumbing (`attention`: masks, head layout) and the block-local
attention functions (`blocks`). Shape letters: see docs/glossary.md.
"""

from keras_posenc.ops import (
    activations,
    blocks,
    cache,
    contextual,
    forgetting,
    kernels,
    lsh,
    quantization,
    rotary,
    segments,
)
from keras_posenc.ops._toeplitz import toeplitz
from keras_posenc.ops.attention import (
    FLOAT_MASK_VALUE,
    MASK_PENALTY,
    band_mask,
    bounded_masking,
    causal_mask,
    combine_masks,
    heads_first,
    mask_value,
    merge_heads,
    split_heads,
)
from keras_posenc.ops.positions import (
    alibi_bias,
    alibi_slopes,
    clipped_relative_index,
    clipped_table_mean,
    dense_relative_table,
    grid_coordinates,
    position_range,
    relative_positions,
    sinusoid,
    t5_relative_position_bucket,
)

__all__ = [
    "quantization",
    "activations",
    "FLOAT_MASK_VALUE",
    "MASK_PENALTY",
    "alibi_bias",
    "alibi_slopes",
    "band_mask",
    "blocks",
    "bounded_masking",
    "cache",
    "causal_mask",
    "clipped_relative_index",
    "clipped_table_mean",
    "combine_masks",
    "contextual",
    "forgetting",
    "dense_relative_table",
    "grid_coordinates",
    "heads_first",
    "kernels",
    "lsh",
    "mask_value",
    "merge_heads",
    "position_range",
    "relative_positions",
    "rotary",
    "segments",
    "sinusoid",
    "split_heads",
    "t5_relative_position_bucket",
    "toeplitz",
]
