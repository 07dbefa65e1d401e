"""The speed benchmark's peers compute what ours compute (`benchmarks/peers.py`).

A timing against a peer means something only if both do the same work: with
the peer's weights copied into ours, the outputs agree to float32 rounding.
"""

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import peers

pytestmark = pytest.mark.skipif(not peers.available(), reason=f"needs {peers.NEEDS}")

CASES = [
    (method, use_bias)
    for method, has_bias in peers.METHODS.items()
    for use_bias in ((False, True) if has_bias else (False,))
]


@pytest.mark.parametrize("method, use_bias", CASES)
def test_ours_with_the_peers_weights_is_the_peer(method, use_bias):
    x = tf.random.stateless_normal(
        (2, 40, 32), seed=(0, 1)
    )  # past 32 buckets' exact range
    ours, theirs = peers.pair(method, 4, 8, 32, use_bias)
    ours(x, x), theirs(x, x)
    assert np.abs(ours(x, x) - theirs(x, x)).max() > 1e-3  # different weights first
    peers.copy_weights(ours, theirs)
    np.testing.assert_allclose(ours(x, x), theirs(x, x), atol=2e-6)


def test_the_t5_peer_has_no_projection_biases_to_time():
    with pytest.raises(ValueError, match="no projection biases"):
        peers.pair("t5", 4, 8, 32, True)


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="`method` must be one of"):
        peers.pair("xpos", 4, 8, 32, False)
