"""The shared contract of the bias producers: each one's layer checks
(`layer_checks.check_layer`), alone and inside attention, from one table."""

import numpy as np
import pytest
import tensorflow as tf
from layer_checks import check_layer

from keras_posenc import (
    DataAdaptiveBias,
    DynamicPositionBias,
    FireBias,
    KerpleBias,
    RelativeMultiHeadAttention,
    RelativePositionBias,
)

SEEDED = {"initializer": tf.keras.initializers.RandomNormal(seed=1)}
#: `{name: (factory of a 3-head producer, its weight count)}`.
ALONE = {
    "t5": (lambda **kw: RelativePositionBias(3, "t5", 8, 10, **SEEDED, **kw), 1),
    "clipped": (
        lambda **kw: RelativePositionBias(3, "clipped", 8, 10, **SEEDED, **kw),
        1,
    ),
    "alibi": (lambda **kw: RelativePositionBias(3, "alibi", 8, 10, **SEEDED, **kw), 0),
    "dynamic": (lambda **kw: DynamicPositionBias(num_heads=3, **kw), 2 * 3),
    "fire": (lambda **kw: FireBias(num_heads=3, hidden_dim=8, **kw), 2 * 2 + 2),
    "kerple_log": (lambda **kw: KerpleBias(num_heads=3, kernel="log", **kw), 2),
    "kerple_power": (lambda **kw: KerpleBias(num_heads=3, kernel="power", **kw), 2),
    "dape": (
        lambda **kw: DataAdaptiveBias(3, KerpleBias(3), hidden_dim=4, **kw),
        2 + 5,  # the static bias's r1, r2 and the MLP's five
    ),
}
#: `{name: (2-head producer, its weight count, extra check_layer arguments)}`.
IN_ATTENTION = {
    "dape": (
        lambda: DataAdaptiveBias(2, KerpleBias(2, bidirectional=False), hidden_dim=4),
        2 + 5,
        {
            "call_kwargs": {"use_causal_mask": True},
            "padding_invariant": False,  # causal: the padded last token reads all
        },
    ),
    "dynamic": (lambda: DynamicPositionBias(2), 2 * 3, {}),
    "fire": (lambda: FireBias(2, hidden_dim=4), 2 * 2 + 2, {}),
    "kerple": (
        lambda: KerpleBias(2, bidirectional=False),
        2,  # r1, r2
        {
            "call_kwargs": {"use_causal_mask": True},
            "padding_invariant": False,  # causal: the padded last token reads all
        },
    ),
}


@pytest.mark.parametrize("name", sorted(ALONE))
def test_layer_checks(name, tmp_path):
    factory, weights = ALONE[name]
    x = np.random.normal(size=(2, 6, 4)).astype("float32")
    check_layer(
        factory,
        x,
        tmp_path,
        num_weights=weights,
        expected_output_shape=(1, 3, 6, 6),
        fit=False,
        passes_mask=False,
    )


@pytest.mark.parametrize("name", sorted(IN_ATTENTION))
def test_fits_inside_attention(name, tmp_path):
    producer, weights, extra = IN_ATTENTION[name]
    x = np.random.normal(size=(2, 6, 4)).astype("float32")
    check_layer(
        lambda **kw: RelativeMultiHeadAttention(2, 4, position_bias=producer(), **kw),
        [x, x],
        tmp_path,
        num_weights=2 * 4 + weights,  # q, k, v, output Dense + the producer's
        expected_output_shape=(2, 6, 4),
        **extra,
    )
