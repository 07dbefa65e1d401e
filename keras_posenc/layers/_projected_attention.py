"""Projections and the attention computation shared by attention layers."""

import math

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    keras,
)

#: The public names of the projections, as in `keras.layers.MultiHeadAttention`.
PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")


class ProjectedAttention(keras.layers.Layer):
    """Projections and attention (dense, block-local, cached) for a subclass
    that stores the arguments of `RelativeMultiHeadAttention` and a
    `_dropout_layer`; the projections are exposed under Keras' names."""

    def build(self, query_shape, value_shape=None, key_shape=None):
        width = _checks.known_width(query_shape, "query")
        heads_v = self.num_heads * (self.value_dim or self.key_dim)
        self._query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self._key_dense = self._dense(self.num_heads * self.key_dim, "key")
        self._value_dense = self._dense(heads_v, "value")
        self._output_dense = self._dense(self.output_dim or width, "attention_output")
        build_sublayer(self._query_dense, query_shape)
        if value_shape is None and IS_KERAS_3:
            value_shape = query_shape  # Keras 3 passes it unless self-attention
        # Keras 2 passes only the query shape: key/value build on first call.
        if value_shape is not None:
            build_sublayer(self._value_dense, value_shape)
            key_shape = key_shape if key_shape is not None else value_shape
            build_sublayer(self._key_dense, key_shape)
        build_sublayer(self._output_dense, tuple(query_shape[:-1]) + (heads_v,))
        if self.position_bias is not None and not self.position_bias.built:
            build_sublayer(self.position_bias, query_shape)
        if self.rotary is not None and not self.rotary.built:
            heads_shape = (None, None, self.num_heads, self.key_dim)
            build_sublayer(self.rotary, heads_shape)  # (B, T, N, H)
        self.built = True

    def compute_output_spec(
        self, query, value=None, key=None, return_attention_scores=False, **kwargs
    ):
        # Keras 3 only: the symbolic output, including the optional scores.
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        keys = (query if value is None else value).shape[1]
        scores_shape = (query.shape[0], self.num_heads, query.shape[1], keys)
        return output, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def __dir__(self):
        # tf_keras' saver walks dir() in reverse order, so it would store the
        # projections under these public names; files have always stored them
        # under the private ones (Keras 3 walks in order and sees those first).
        names = super().__dir__()
        if IS_KERAS_3:
            return names
        return [name for name in names if name not in PROJECTIONS]

    @property
    def query_dense(self):
        """The query projection (a Dense layer), once built."""
        return getattr(self, "_query_dense", None)

    @property
    def key_dense(self):
        """The key projection (a Dense layer), once built."""
        return getattr(self, "_key_dense", None)

    @property
    def value_dense(self):
        """The value projection (a Dense layer), once built."""
        return getattr(self, "_value_dense", None)

    @property
    def output_dense(self):
        """The output projection (a Dense layer), once built."""
        return getattr(self, "_output_dense", None)

    def project(self, query, key, value):
        """Query, key, value heads `(B, N, T|S, H)`; queries scaled by 1/sqrt(H)."""
        q = ops.split_heads(self._query_dense(query), self.num_heads)
        k = ops.split_heads(self._key_dense(key), self.num_heads)
        v = ops.split_heads(self._value_dense(value), self.num_heads)
        return q * tf.cast(1.0 / math.sqrt(self.key_dim), q.dtype), k, v

    def compute_attention(self, query, key, value, bias=None, mask=None, training=None):
        """Logits -> weights -> context: the one override point.

        Args:
            query: `(..., T, H)` scaled query heads.
            key: `(..., S, H)` key heads.
            value: `(..., S, Hv)` value heads.
            bias: float32 tensor broadcastable to `(..., T, S)`, or None.
            mask: boolean tensor broadcastable to `(..., T, S)`, or None.
            training: bool, whether dropout is active.

        Returns:
            `(context (..., T, Hv), weights (..., T, S))`.
        """
        logits = tf.cast(tf.matmul(query, key, transpose_b=True), tf.float32)
        if bias is not None:
            logits += bias
        if mask is not None:
            logits = tf.where(mask, logits, ops.mask_value())
        weights = tf.cast(tf.nn.softmax(logits, axis=-1), self.compute_dtype)
        dropped = self._dropout_layer(weights, training=training)
        return tf.matmul(dropped, value), weights

    def rotate(
        self, q, k, query, key, start_index=0, positions=None, key_positions=None
    ):
        """`rotary` applied to heads `(B, N, T|S, H)` at their true positions."""
        q_pos = self.rotary.resolve(query, start_index, positions)  # (..., T, C)
        k_pos = self.rotary.resolve(key, 0, key_positions)  # (..., S, C)
        length = None  # one current length for both sides keeps q.k relative
        if ops.rotary.ROPE_TYPES[self.rotary.rope_type].length_dependent:
            length = tf.maximum(tf.reduce_max(q_pos), tf.reduce_max(k_pos)) + 1.0
        rotated = []
        for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key")):
            cos, sin = self.rotary.cos_sin(where, side, length)
            if self.rotary.learned_frequencies:  # (..., L, N, r/2) -> heads first
                swap = tf.experimental.numpy.swapaxes
                cos, sin = swap(cos, -3, -2), swap(sin, -3, -2)
            elif cos.shape.rank == 3:  # per-example positions (B, L, r/2)
                cos, sin = cos[:, None], sin[:, None]
            rotated.append(ops.rotary.rotate(x, cos, sin, self.rotary.interleaved))
        return rotated

    def attend(
        self,
        inputs,
        heads,
        masks,
        causal,
        training,
        where,
        attention_mask=None,
        attention_bias=None,
    ):
        """Context `(B, N, T, Hv)` and weights (None when block-local).

        `inputs` are the `(query, key)` tensors the bias reads, `heads` the
        projected `(q, k, v)`, `masks` the query, value and key Keras masks,
        `where` the `start_index` / `positions` / `key_positions` arguments.
        """
        query, key = inputs
        query_mask, value_mask, key_mask = masks
        keys = ops.combine_masks(1, 1, value_mask=value_mask, key_mask=key_mask)
        if keys is not None:  # masked values never reach an output, even NaN
            v = tf.where(tf.expand_dims(keys, -1), heads[2], tf.zeros_like(heads[2]))
            heads = (heads[0], heads[1], v)
        if self.attention_window is not None:
            keys = None if keys is None else keys[:, 0]  # (B, S)
            context = self.local_context(
                inputs, heads, keys, query_mask, causal, training, where["start_index"]
            )
            return context, None
        bias = None
        if self.position_bias is not None:
            bias = tf.cast(self.position_bias(query, key, **where), tf.float32)
        if attention_bias is not None:
            extra = tf.cast(attention_bias, tf.float32)
            bias = extra if bias is None else bias + extra  # (B or 1, N, T, S)
        mask = ops.combine_masks(
            dim(query, 1), dim(key, 1), *masks, attention_mask, causal
        )  # (B, T, S)
        mask = None if mask is None else mask[:, None]  # (B, 1, T, S)
        return self.compute_attention(*heads, bias, mask, training)

    def decode(self, query, cache, index, attention_mask=None, training=None):
        """Cached self-attention of new tokens `(B, T, D)` at `index`.

        Keys and values of the new tokens go into `cache` (rotated at their
        true positions first); the queries attend causally over the cache,
        with the position bias evaluated at positions `index + t` against
        the cached positions `0 .. S_max - 1`. Returns `(output, cache)`.
        """
        length, max_length = dim(query, 1), dim(cache, 2)  # T, S_max
        q, k, v = self.project(query, query, query)  # (B, N, T, H)
        if self.rotary is not None:
            where = ops.position_range(length, index)  # (T,)
            q, k = self.rotate(q, k, query, query, positions=where, key_positions=where)
        keys, values, cache = ops.cache.update_cache(cache, k, v, index)
        bias = None
        if self.position_bias is not None:
            cached = cache[:, 0]  # (B, S_max, N, H): the keys, by position
            bias = ops.cache.cached_bias(self.position_bias, query, cached, index)
        mask = ops.cache.cache_mask(index, length, max_length, self.attention_window)
        mask = mask[None, None]  # (1, 1, T, S_max)
        if attention_mask is not None:
            mask = tf.logical_and(mask, tf.cast(attention_mask, bool)[:, None])
        context, _ = self.compute_attention(q, keys, values, bias, mask, training)
        return self._output_dense(ops.merge_heads(context)), cache

    def local_context(
        self, inputs, heads, key_mask, query_mask, causal, training, start_index=0
    ):
        """Block-local context `(B, N, T, Hv)`: the band, then `compute_attention`.

        `inputs` are the `(query, key)` tensors the position bias reads,
        `heads` the projected `(q, k, v)`; the bias is evaluated at each
        block's true query and key positions, `(nb, N, W, 3W)`.
        """
        q, k, v = heads
        window, length = self.attention_window, dim(q, 2)
        query_pos, key_pos = ops.blocks.block_positions(length, window)
        bias = None
        if self.position_bias is not None:
            # True positions; slots past the sequence (masked) borrow its ends.
            last, offset = length - 1, tf.cast(start_index, query_pos.dtype)
            q_at, k_at = (
                tf.clip_by_value(p, 0, last) + offset for p in (query_pos, key_pos)
            )
            bias = self.position_bias(*inputs, positions=q_at, key_positions=k_at)
            bias = ops.blocks.fold_bias(tf.cast(bias, tf.float32))  # (1, N*nb, W, 3W)
        allowed = ops.blocks.band_allowed(
            query_pos, key_pos, length, self.num_heads, key_mask, query_mask, causal
        )  # (B or 1, N*nb, W, 3W)
        context, _ = self.compute_attention(
            ops.blocks.to_blocks(q, window),
            ops.blocks.to_band(k, window),
            ops.blocks.to_band(v, window),
            bias,
            allowed,
            training,
        )
        return ops.blocks.from_blocks(context, self.num_heads, length)

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
