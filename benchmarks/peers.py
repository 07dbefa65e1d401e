"""The peers' attention layers doing our layers' work, side by side (`speed`).

keras-hub (the `bench` extra, Keras 3 only) is the reference users know:
`PAIRS[method](heads, key_dim, width, use_bias)` builds `(ours, theirs)`, two
layers called as `layer(x, x)` that compute the same function once
`copy_weights(ours, theirs)` gives ours the peer's weights
(`tests/test_peers.py` holds them equal):

- `none`: our layer without a position producer; Keras' `MultiHeadAttention`.
- `t5`: our layer with the T5 bias (32 buckets, distance 128, both
  directions); keras-hub's `T5MultiHeadAttention`, which owns its bias and
  has no projection biases (so only `use_bias=False`) and no `1/sqrt(H)` on
  the queries (folded into our query kernel by `copy_weights`).
- `alibi`: causal attention, ours with the causal ALiBi bias; keras-hub's
  `AlibiBias` added to `CachedMultiHeadAttention`'s logits (as keras-hub's
  Bloom attention does) under the same causal mask. keras-hub's bias is
  `m (j - S + 1)` per key, ours `-m |i - j|`: equal up to a per-row
  constant, which the softmax removes.
- `rope`: keras-hub's `RotaryEmbedding` on `CachedMultiHeadAttention`'s
  projected queries and keys (halves paired, base 10000), ours likewise.
"""

import numpy as np
import tensorflow as tf

from keras_posenc import (
    IS_KERAS_3,
    RelativeMultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
)

keras = tf.keras
#: What the peers need, for a message when it is missing.
NEEDS = (
    "keras-hub under Keras 3 (pip install -e '.[bench]', without TF_USE_LEGACY_KERAS)"
)


def available():
    """Whether keras-hub can run here (it needs Keras 3)."""
    if not IS_KERAS_3:
        return False
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        return False
    return True


class CausalCall(keras.layers.Layer):
    """An attention layer called causally as `layer(x, x)`: ours with
    `use_causal_mask=True`, keras-hub's (`mask=False`) with a lower-triangular
    `attention_mask`."""

    def __init__(self, attention, flag=True, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention
        self.flag = flag

    def call(self, query, value):
        if self.flag:
            return self.attention(query, value, use_causal_mask=True)
        length = tf.shape(query)[1]
        causal = tf.linalg.band_part(tf.ones((length, length), tf.bool), -1, 0)
        return self.attention(query, value, attention_mask=causal[None])


def _hub_layers():
    """keras-hub's classes, imported on first use (Keras 3 only)."""
    if not available():
        raise RuntimeError(f"the peer layers need {NEEDS}")
    import keras_hub
    from keras import ops
    from keras_hub.src.models.t5.t5_multi_head_attention import (
        T5MultiHeadAttention,
    )

    class HubT5(keras.layers.Layer):
        """keras-hub's T5 attention with its own bias, as `layer(x, x)`."""

        def __init__(self, heads, key_dim, width, **kwargs):
            super().__init__(**kwargs)
            self.attention = T5MultiHeadAttention(
                is_decoder=False,
                hidden_dim=width,
                key_value_dim=key_dim,
                num_heads=heads,
                dropout=0.0,
                use_relative_attention_bias=True,
            )

        def call(self, query, value):
            return self.attention(query)[0]

    class HubAlibi(keras_hub.layers.CachedMultiHeadAttention):
        """`CachedMultiHeadAttention` with `AlibiBias` on its logits, causal."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._alibi = keras_hub.layers.AlibiBias()

        def _compute_attention(
            self, query, key, value, attention_mask=None, training=None, **_
        ):
            query = ops.multiply(
                query, ops.cast(self._inverse_sqrt_key_dim, query.dtype)
            )
            scores = ops.einsum(self._dot_product_equation, key, query)
            scores = self._alibi(scores)
            weights = self._masked_softmax(scores, attention_mask)
            output = ops.einsum(self._combine_equation, weights, value)
            return output, weights

    class HubRotary(keras_hub.layers.CachedMultiHeadAttention):
        """`CachedMultiHeadAttention` with `RotaryEmbedding` on queries and keys."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._rotary = keras_hub.layers.RotaryEmbedding()

        def _compute_attention(self, query, key, value, **kwargs):
            query, key = self._rotary(query), self._rotary(key)
            return super()._compute_attention(query, key, value, **kwargs)

    return HubT5, HubAlibi, HubRotary


def pair(method, heads, key_dim, width, use_bias):
    """`(ours, theirs)` for `method` (a key of `METHODS`), unbuilt."""
    if method not in METHODS:
        raise ValueError(
            f"`method` must be one of {tuple(METHODS)}. Received: {method!r}"
        )
    hub_t5, hub_alibi, hub_rotary = _hub_layers()
    mine = dict(num_heads=heads, key_dim=key_dim, use_bias=use_bias)
    theirs = dict(num_heads=heads, key_dim=key_dim, use_bias=use_bias)
    if method == "none":
        return (
            RelativeMultiHeadAttention(**mine),
            keras.layers.MultiHeadAttention(**theirs),
        )
    if method == "t5":
        if use_bias:
            raise ValueError("keras-hub's T5 attention has no projection biases")
        bias = RelativePositionBias(heads, "t5", num_buckets=32, max_distance=128)
        return (
            RelativeMultiHeadAttention(position_bias=bias, **mine),
            hub_t5(heads, key_dim, width),
        )
    if method == "alibi":
        bias = RelativePositionBias(heads, "alibi", bidirectional=False)
        ours = CausalCall(RelativeMultiHeadAttention(position_bias=bias, **mine))
        return ours, CausalCall(hub_alibi(**theirs), flag=False)
    ours = RelativeMultiHeadAttention(rotary=RotaryEmbedding(), **mine)  # rope
    return ours, hub_rotary(**theirs)


#: The methods with a peer, and whether the peer has projection biases.
METHODS = {"none": True, "t5": False, "alibi": True, "rope": True}
#: Each method's peer, as the tables name it.
PEER_NAMES = {
    "none": "keras MultiHeadAttention",
    "t5": "keras-hub T5MultiHeadAttention",
    "alibi": "keras-hub AlibiBias + CachedMultiHeadAttention",
    "rope": "keras-hub RotaryEmbedding + CachedMultiHeadAttention",
}


def copy_weights(ours, theirs):
    """Gives `ours` the weights of `theirs` (both built): the same function."""
    mine = ours.attention if isinstance(ours, CausalCall) else ours
    theirs = theirs.attention if isinstance(theirs, CausalCall) else theirs
    if isinstance(theirs, keras.layers.MultiHeadAttention):  # and subclasses
        parts = [
            theirs.query_dense,
            theirs.key_dense,
            theirs.value_dense,
            theirs.output_dense,
        ]
        query_scale = 1.0
    else:  # keras-hub's T5: Dense projections, no 1/sqrt(H) on the queries
        hub = theirs.attention  # the wrapped T5MultiHeadAttention
        parts = [
            hub.query_projector,
            hub.key_projector,
            hub.value_projector,
            hub.output_projector,
        ]
        query_scale = float(np.sqrt(mine.key_dim))
        mine.position_bias.table.assign(hub.relative_attention_bias)
    own_parts = [mine.query_dense, mine.key_dense, mine.value_dense, mine.output_dense]
    for index, (own, peer) in enumerate(zip(own_parts, parts)):
        scale = query_scale if index == 0 else 1.0
        for own_weight, weight in zip(own.weights, peer.weights):  # kernel, bias
            own_weight.assign(np.reshape(weight.numpy(), own_weight.shape) * scale)
