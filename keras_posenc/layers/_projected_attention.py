"""The attention computation shared by attention layers: dense, block-local, cached."""

import tensorflow as tf

from keras_posenc import ops
from keras_posenc._compat import dim
from keras_posenc.layers._projections import Projections


class ProjectedAttention(Projections):
    """Attention (dense, block-local, cached) for a subclass that stores the
    arguments of `RelativeMultiHeadAttention` and a `_dropout_layer`."""

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
        logits = tf.matmul(query, key, transpose_b=True)
        weights = self._weights(logits, bias, mask)
        dropped = self._dropout_layer(weights, training=training)
        return tf.matmul(dropped, value), weights

    def heads_attention(self, q, k, v, bias=None, mask=None, training=None):
        """Heads-last `(B, T, N, H)` in, context `(B, T, N, Hv)` and weights out.

        Einsums on the projections' own layout unless a subclass overrides
        `compute_attention`, which then gets heads-first `(B, N, T, H)`.
        """
        if type(self).compute_attention is not ProjectedAttention.compute_attention:
            swap = ops.attention.swap_heads
            context, weights = self.compute_attention(
                swap(q), swap(k), swap(v), bias, mask, training
            )
            return swap(context), weights
        weights = self._weights(tf.einsum("btnh,bsnh->bnts", q, k), bias, mask)
        dropped = self._dropout_layer(weights, training=training)
        return tf.einsum("bnts,bsnh->btnh", dropped, v), weights

    def _weights(self, logits, bias, mask):
        """Float32 softmax of `logits + bias` over the keys, masked."""
        logits = tf.cast(logits, tf.float32)
        if bias is not None:
            logits += bias
        if mask is not None:
            logits = tf.where(mask, logits, ops.mask_value())
        return tf.cast(tf.nn.softmax(logits, axis=-1), self.compute_dtype)

    def rotate(
        self,
        q,
        k,
        query,
        key,
        start_index=0,
        positions=None,
        key_positions=None,
        max_length=None,
    ):
        """`rotary` applied to heads-last `(B, T|S, N, H)` at their true positions.

        Scales the queries by 1/sqrt(H) when `project` left it to the rotation.
        `max_length` is the cache length S_max of a decoding step: inside
        `ops.cache.static_decoding()`, the cos and sin of every cached
        position then fold into a constant and the step gathers the rows of
        its runtime positions (no SIN, COS or EXP on the device) when the
        rotary layer is `position_only`.
        """
        q_pos = self.rotary.resolve(query, start_index, positions)  # (..., T, C)
        k_pos = self.rotary.resolve(key, 0, key_positions)  # (..., S, C)
        length = None  # one current length for both sides keeps q.k relative
        if ops.rotary.ROPE_TYPES[self.rotary.rope_type].length_dependent:
            length = tf.maximum(tf.reduce_max(q_pos), tf.reduce_max(k_pos)) + 1.0
        tabulate = max_length is not None and ops.cache.is_static()
        tabulate = tabulate and self.rotary.position_only and q_pos.shape.rank == 2
        rotated = []
        for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key")):
            if tabulate:  # (T, 1) positions: rows of a constant table
                every = ops.position_range(max_length)[:, None]  # (S_max, 1)
                table = self.rotary.cos_sin(every, side)
                cos, sin = (tf.gather(t, tf.cast(where[:, 0], tf.int32)) for t in table)
            else:
                cos, sin = self.rotary.cos_sin(where, side, length)
            if side == "query" and self._scale_in_rotation():
                cos, sin = cos * self.query_scale, sin * self.query_scale
            if not self.rotary.learned_frequencies:  # (..., L, r/2): one per head
                cos, sin = cos[..., None, :], sin[..., None, :]
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
        """Heads-last context `(B, T, N, Hv)` and weights (None when block-local).

        `inputs` are the `(query, key)` tensors the bias reads, `heads` the
        projected heads-last `(q, k, v)`, `masks` the query, value and key Keras masks,
        `where` the `start_index` / `positions` / `key_positions` arguments.
        """
        query, key = inputs
        query_mask, value_mask, key_mask = masks
        keys = ops.combine_masks(1, 1, value_mask=value_mask, key_mask=key_mask)
        if keys is not None:  # masked values never reach an output, even NaN
            keys = keys[:, 0]  # (B, S)
            real = keys[:, :, None, None]
            heads = (*heads[:2], tf.where(real, heads[2], tf.zeros_like(heads[2])))
        if self.attention_window is not None:
            swap = ops.attention.swap_heads  # the band folds heads-first tensors
            context = self.local_context(
                inputs,
                [swap(x) for x in heads],
                keys,
                query_mask,
                causal,
                training,
                where["start_index"],
            )
            return swap(context), None
        bias = None
        if self.position_bias is not None:
            bias = tf.cast(self.position_bias(query, key, **where), tf.float32)
        bias = _plus(bias, attention_bias)  # (B or 1, N, T, S)
        mask = ops.combine_masks(
            dim(query, 1), dim(key, 1), *masks, attention_mask, causal
        )  # (B, T, S)
        mask = None if mask is None else mask[:, None]  # (B, 1, T, S)
        return self.heads_attention(*heads, bias, mask, training)

    def decode(self, query, cache, index, attention_mask=None, attention_bias=None):
        """Cached self-attention of new tokens `(B, T, D)` at `index`.

        Keys and values of the new tokens go into `cache` (rotated at their
        true positions first); the queries attend causally over the cache,
        with the position bias evaluated at positions `index + t` against
        the cached positions `0 .. S_max - 1`. Returns `(output, cache)`.
        """
        length, max_length = dim(query, 1), dim(cache, 2)  # T, S_max
        q, k, v = self.project(query, query, query)  # (B, T, N, H)
        if self.rotary is not None:
            where = ops.position_range(length, index)  # (T,)
            q, k = self.rotate(
                q,
                k,
                query,
                query,
                positions=where,
                key_positions=where,
                max_length=max_length,
            )
        keys, values, cache = ops.cache.update_cache(cache, k, v, index)
        bias = None
        if self.position_bias is not None:
            bias = ops.cache.cached_bias(self.position_bias, query, keys, index)
        bias = _plus(bias, attention_bias)  # (B or 1, N, T, S_max)
        mask = ops.cache.cache_mask(index, length, max_length, self.attention_window)
        mask = mask[None, None]  # (1, 1, T, S_max)
        if attention_mask is not None:
            mask = tf.logical_and(mask, tf.cast(attention_mask, bool)[:, None])
        context, _ = self.heads_attention(q, keys, values, bias, mask)
        return self.merge(context), cache

    def local_context(
        self, inputs, heads, key_mask, query_mask, causal, training, start_index=0
    ):
        """Block-local context `(B, N, T, Hv)`: the band, then `compute_attention`.

        `inputs` are the `(query, key)` tensors the position bias reads,
        `heads` the projected `(q, k, v)`; the bias of every band comes from
        `_band_bias`.
        """
        q, k, v = heads
        window, length = self.attention_window, dim(q, 2)
        query_pos, key_pos = ops.blocks.block_positions(length, window)
        bias = None
        if self.position_bias is not None:
            bias = self._band_bias(inputs, query_pos, key_pos, length, start_index)
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

    def _band_bias(self, inputs, query_pos, key_pos, length, start_index):
        """The bias of every block's band `(1, N*nb, W, 3W)`, float32.

        A translation-invariant producer sees the same distances `-(2W-1) ..
        2W-1` in every band: it is evaluated once, `(1, N, W, 3W)`, and
        repeated over the blocks (slots outside the sequence are masked).
        Otherwise each block is evaluated at its true positions.
        """
        producer, window = self.position_bias, self.attention_window
        if getattr(producer, "translation_invariant", False):
            stubs = [tf.zeros([1, size, 1]) for size in (window, 3 * window)]
            bias = tf.cast(producer(*stubs, start_index=window), tf.float32)
            heads, blocks = bias.shape[1], tf.shape(query_pos)[0]
            shape = [1, heads, blocks, window, 3 * window]
            bias = tf.broadcast_to(bias[:, :, None], shape)  # (1, N, nb, W, 3W)
            return tf.reshape(bias, [1, -1, window, 3 * window])
        # True positions; slots past the sequence (masked) borrow its ends.
        last, offset = length - 1, tf.cast(start_index, query_pos.dtype)
        q_at, k_at = (
            tf.clip_by_value(p, 0, last) + offset for p in (query_pos, key_pos)
        )
        bias = producer(*inputs, positions=q_at, key_positions=k_at)
        return ops.blocks.fold_bias(tf.cast(bias, tf.float32))  # (1, N*nb, W, 3W)


def _plus(bias, attention_bias):
    """The float32 sum of two optional biases (None when both are None)."""
    if attention_bias is None:
        return bias
    extra = tf.cast(attention_bias, tf.float32)
    return extra if bias is None else bias + extra
