"""Multi-head attention that adds a position bias to its logits.

One class, `RelativeMultiHeadAttention`: its projections (named as Keras')
and the dense attention path; each other path is a mixin in a module named
for it (`_attention/local.py`, `_attention/lsh.py`, `_attention/packed.py`,
`_attention/cached.py`, `_attention/rotary.py`), its checks in
`_attention/checks.py`; which path takes which argument: `docs/attention.md`.
"""

import math

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    incoming_mask,
    keras,
    register,
    serialize_layer,
)
from keras_posenc.layers._attention.cached import CACHE_POINTS, CachedDecoding, _plus
from keras_posenc.layers._attention.checks import (  # noqa: F401 (re-exported)
    ARGUMENTS,
    ATTENTION_KEYS,
    AttentionChecks,
    check_arguments,
    check_key_value_heads,
    lsh_options,
)
from keras_posenc.layers._attention.local import LocalAttention
from keras_posenc.layers._attention.lsh import (  # noqa: F401 (re-exported)
    ATTENTION_TYPES,
    LSH_OPTIONS,
    LSHAttention,
    check_attention_options,
)
from keras_posenc.layers._attention.packed import PackedAttention, segment_mask
from keras_posenc.layers._attention.rotary import (
    ROTARY_POINTS,
    XPOS_POINT,
    RotaryAttention,
)
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.ops import quantization

#: The call arguments `AttentionChecks._check_call` reads.
CHECKED = (
    "attention_mask",
    "attention_bias",
    "return_attention_scores",
    "positions",
    "key_positions",
    "cache",
    "cache_update_index",
    "sink_tokens",
    "segment_ids",
)
#: The public names of the projections, as in `keras.layers.MultiHeadAttention`.
PROJECTIONS = ("query_dense", "key_dense", "value_dense", "output_dense")
#: The tensors int8 TFLite rounds between the projections (`quantize=True`).
ROUNDING_POINTS = (
    "scaled_query",
    "logits",
    "bias",
    "biased",
    "masked",
    "context",
)


@register
class RelativeMultiHeadAttention(
    CachedDecoding,
    LocalAttention,
    LSHAttention,
    PackedAttention,
    RotaryAttention,
    AttentionChecks,
    keras.layers.Layer,
):
    """Multi-head attention with a position bias: `softmax(QK^T/sqrt(H) + B) V`.

    Queries `(B, T, Dq)`, keys and values `(B, S, Dv)` are projected to N heads
    (`query_dense`, `key_dense`, `value_dense`, `output_dense`, as Keras names
    them); the logits `(B, N, T, S)` get the bias of `position_bias` (any
    producer of the bias contract) and an optional call-time `attention_bias`;
    masked keys get exactly zero weight; softmax runs in float32. Dense,
    block-local (`attention_window`), LSH (`attention_options={"attention_type":
    "lsh"}`) or cached (`cache=`): which arguments each path takes is one table,
    `docs/attention.md`. Built from Dense, transposes and batched matmuls, it
    exports to full-int8 TFLite (but LSH, which sorts). A subclass changes the
    computation by overriding `compute_attention` (`docs/attention.md`).

    Args:
        num_heads: int, the number of heads N.
        key_dim: int, the size H of each query/key head.
        value_dim: int, the size of each value head. Defaults to `None`
            (`key_dim`).
        output_dim: int, the output width. Defaults to `None` (the query's).
        dropout: float, dropout on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        position_bias: a bias producer called as `position_bias(query, key)`,
            or None. Defaults to `None`.
        kernel_initializer: the projection kernels' initializer. Defaults to
            `"glorot_uniform"`.
        bias_initializer: the projection biases' initializer. Defaults to
            `"zeros"`.
        rotary: a `RotaryEmbedding` turning queries and keys at their
            positions, or None. Defaults to `None`.
        quantize: False, True (fake-quantize what int8 TFLite rounds, for
            quantization-aware training) or `"cache"` (also the keys and
            values, as a decoding export's int8 cache). Defaults to `False`.
        contextual_position: a `ContextualPosition` (CoPE), a term computed
            from the scaled queries and the logits. Defaults to `None`.
        attention_window: int or None, block-local attention in blocks of
            W (each sees its block and both neighbours). Defaults to `None`.
        num_key_value_heads: int or None, grouped-query attention's key and
            value heads (a divisor of `num_heads`). Defaults to `None`.
        attention_options: dict of the LSH concern, `attention_type`
            (`"dense"` or `"lsh"`) and LSH's `num_hashes`, `bucket_size`,
            `hash_seed`. Defaults to `None` (dense).
        kernel_bits: int, with `quantize`, the projections' kernel grid: 8,
            or 4 (an int4 LM's). Defaults to `8`.

    Call arguments:
        query: tensor `(B, T, Dq)`.
        value, key: optional `(B, S, Dv)`, `(B, S, Dk)`; default to the query.
        training: bool, whether dropout is active (and ranges learn).
        attention_mask: optional boolean `(B, T, S)`, True where allowed.
        attention_bias: optional bias broadcastable to `(B, N, T, S)`.
        use_causal_mask: bool, mask keys `j > i`.
        return_attention_scores: bool, also return the weights.
        query_mask, value_mask, key_mask: Keras masks, True at real tokens.
        start_index: the first query's position (decoding). Defaults to `0`.
        positions, key_positions: optional explicit positions `(T,)`/`(B, T)`.
        cache, cache_update_index: a `[keys, values]` pair `(B, N, S_max, H)`
            each (or keras-hub's `(B, 2, S_max, N, H)`) and where the new
            tokens go; the call then returns the cache too, in its form.
        sink_tokens: with `cache`, a rolling cache keeping the first tokens.
        segment_ids: optional int `(B, T)`: packed documents, each attending
            only inside itself at positions from 0.

    Returns:
        `(B, T, output_dim)`; with `return_attention_scores` also the
        `(B, N, T, S)` weights; with `cache` also the updated cache.

    Example:
    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> attention = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4,
    ...     position_bias=keras_posenc.RelativePositionBias(num_heads=2))
    >>> x = tf.random.normal((3, 7, 16))
    >>> attention(x, x).shape
    TensorShape([3, 7, 16])

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Kitaev et al., 2020](https://arxiv.org/abs/2001.04451) (LSH)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        position_bias=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        rotary=None,
        quantize=False,
        contextual_position=None,
        attention_window=None,
        num_key_value_heads=None,
        attention_options=None,
        kernel_bits=8,
        **kwargs,
    ):
        given = locals()
        checked = check_arguments(
            type(self).compute_attention
            is not RelativeMultiHeadAttention.compute_attention,
            {name: given[name] for name in ARGUMENTS},
        )
        super().__init__(**kwargs)
        for name, value in checked.items():  # every argument under its own name
            setattr(self, name, value)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.quantize_cache = self.quantize == "cache"
        self.rounding = rounding_points(self, self._rounding_names(), self.quantize)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        width = _checks.known_width(query_shape, "query")
        heads_v = self.num_heads * (self.value_dim or self.key_dim)
        kv_heads = self.num_key_value_heads
        self._query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self._key_dense = None  # LSH: the keys are the queries' projection
        if self.attention_type != "lsh":
            self._key_dense = self._dense(kv_heads * self.key_dim, "key")
        self._value_dense = self._dense(
            kv_heads * (self.value_dim or self.key_dim), "value"
        )
        self._output_dense = self._dense(self.output_dim or width, "attention_output")
        build_sublayer(self._query_dense, query_shape)
        if value_shape is None and IS_KERAS_3:
            value_shape = query_shape  # Keras 3 passes it unless self-attention
        # Keras 2 passes only the query shape: key/value build on first call.
        if value_shape is not None:
            build_sublayer(self._value_dense, value_shape)
            key_shape = key_shape if key_shape is not None else value_shape
            if self._key_dense is not None:
                build_sublayer(self._key_dense, key_shape)
        build_sublayer(self._output_dense, tuple(query_shape[:-1]) + (heads_v,))
        if self.position_bias is not None and not self.position_bias.built:
            build_sublayer(self.position_bias, query_shape)
        if self.rotary is not None and not self.rotary.built:
            heads_shape = (None, None, self.num_heads, self.key_dim)
            build_sublayer(self.rotary, heads_shape)  # (B, T, N, H)
        if self.contextual_position is not None and not self.contextual_position.built:
            heads_shape = (None, None, self.num_heads, self.key_dim)
            build_sublayer(self.contextual_position, heads_shape)
        for point in self.rounding.values():
            build_sublayer(point, ())
        self.built = True

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        start_index=0,
        positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
        sink_tokens=None,
        segment_ids=None,
    ):
        given = {name: v for name, v in locals().items() if name in CHECKED}
        self_attention = value is None and key is None  # Keras 2 converts query only
        value = query if value is None else xp.convert_to_tensor(value)
        key = value if key is None else xp.convert_to_tensor(key)
        self._check_call(query, key, value, self_attention=self_attention, **given)
        where = dict(
            start_index=start_index, positions=positions, key_positions=key_positions
        )
        placed = dict(cache=cache, positions=positions, key_positions=key_positions)
        # (runs, positions) of a packed row, or None
        segments = self._segments(segment_ids, query, key, placed)
        pairs = ((query, query_mask), (value, value_mask), (key, key_mask))
        masks = [incoming_mask(tensor, mask) for tensor, mask in pairs]
        if cache is not None or sink_tokens is not None:
            extra = dict(attention_mask=attention_mask, attention_bias=attention_bias)
            return self._decode_call(
                query, (cache, cache_update_index, sink_tokens), extra
            )
        q, k, v = self._project(query, key, value, training)  # (B, T|S, N, H)
        if self.rotary is not None:
            turned = where  # a packed row turns each run from position 0
            if segments is not None:
                turned = dict(where, positions=segments[1], key_positions=segments[1])
            q, k = self._rotate(q, k, query, key, training=training, **turned)
        k, v = self._round_cache(k, v, training)  # as the cache holds them
        context, weights = self._attend(
            (query, key),
            (q, k, v),
            masks,
            use_causal_mask,
            training,
            where,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            segments=segments,
        )
        output = self._merge(context, training)  # (B, T, Dout)
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "position_bias": serialize_layer(self.position_bias),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "rotary": serialize_layer(self.rotary),
                "quantize": self.quantize,
                "contextual_position": serialize_layer(self.contextual_position),
                "attention_window": self.attention_window,
                "num_key_value_heads": self.num_key_value_heads,
                "attention_options": self.attention_options,
                "kernel_bits": self.kernel_bits,
            }
        )
        return config

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
        """The key projection (a Dense layer), once built; None for LSH (shared QK)."""
        return getattr(self, "_key_dense", None)

    @property
    def value_dense(self):
        """The value projection (a Dense layer), once built."""
        return getattr(self, "_value_dense", None)

    @property
    def output_dense(self):
        """The output projection (a Dense layer), once built."""
        return getattr(self, "_output_dense", None)

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
        r = rounder(self.rounding, training)  # quantize: as int8 TFLite rounds
        logits = r("logits", xp.matmul(query, key, transpose_b=True))
        if self.contextual_position is not None:  # it reads heads-last queries
            queries = ops.attention.swap_heads(query)
            # Block-local, a band's W queries are its keys W .. 2W - 1.
            window = self.attention_window
            offset = {} if window is None else {"query_offset": window}
            term = self.contextual_position(
                queries, logits, mask, training=training, **offset
            )
            bias = _plus(bias, term)
        weights = self._weights(logits, bias, mask, training)
        dropped = self._dropout_layer(weights, training=training)
        return r("context", xp.matmul(dropped, value)), weights

    def _decode_call(self, query, cached, extra):
        """Decoding: self-attention over `cached = (cache, index,
        sink_tokens)`, a full or a rolling cache; `extra` the call's mask
        and bias. Returns `(output, cache)`."""
        cache, index, sink_tokens = cached
        if cache is not None and self.quantize and not self.quantize_cache:
            _checks.fail(
                "cache",
                "None for a layer with quantize=True (decoding needs "
                "quantize='cache': an int8 cache needs its own range)",
                "a cache",
            )
        if sink_tokens is not None:
            self._check_rolling(cache, sink_tokens)
            return self._decode_rolling(query, cache, index, sink_tokens, **extra)
        return self._decode(query, cache, index, **extra)

    def _rounding_names(self):
        """The tensors `quantize` rounds: `ROUNDING_POINTS`, the cache's with
        `"cache"`, the rotation's in place of the scaled queries."""
        points = ROUNDING_POINTS + (CACHE_POINTS if self.quantize_cache else ())
        if self.rotary is not None:  # the rotation scales the queries
            points = ROTARY_POINTS + tuple(p for p in points if p != "scaled_query")
            if self.rotary.xpos_scale_base is not None:
                points += (XPOS_POINT,)
        return points

    def _project(self, query, key, value, training=None):
        """Heads-last query, key, value `(B, T|S, N, H)`; queries scaled by 1/sqrt(H).

        Heads stay where the projection puts them (as in Keras'
        `MultiHeadAttention`); only the logits and the context move them. When
        a rotary layer rotates every feature, `rotate` scales the queries
        (on their cos and sin, `(T, r/2)`, one product fewer per call).
        """
        shared = self._key_dense is None  # LSH: keys are the query heads
        kv_heads = self.num_key_value_heads  # grouped-query: fewer key heads
        q, k, v = (
            None
            if dense is None
            else xp.reshape(dense(x, training=training), [-1, dim(x, 1), heads, size])
            for dense, x, heads, size in (
                (self._query_dense, query, self.num_heads, self.key_dim),
                (self._key_dense, key, kv_heads, self.key_dim),
                (self._value_dense, value, kv_heads, self.value_dim or self.key_dim),
            )
        )
        k = q if shared else k
        q, k = self._normalize_heads(q, k)
        if self._scale_in_rotation():
            return q, k, v
        scaled = q * xp.cast(self._query_scale, q.dtype)
        return rounder(self.rounding, training)("scaled_query", scaled), k, v

    def _normalize_heads(self, q, k):  # a subclass's per-head norms
        return q, k

    @property
    def _query_scale(self):
        """1/sqrt(H), the factor on the queries."""
        return 1.0 / math.sqrt(self.key_dim)

    def _merge(self, context, training=None):
        """Heads-last context `(B, T, N, Hv)` -> the output `(B, T, output_dim)`."""
        shape = [-1, dim(context, 1), context.shape[2] * context.shape[3]]
        rounding = {"training": training} if self.quantize else {}
        return self._output_dense(xp.reshape(context, shape), **rounding)

    def _dense(self, units, name, use_bias=None):
        bits = {"kernel_bits": self.kernel_bits} if self.quantize else {}
        dense = QuantizedDense if self.quantize else keras.layers.Dense
        return dense(
            units,
            **bits,
            use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    @property
    def _custom_attention(self):
        """Whether a subclass overrides `compute_attention` (which then sees
        every cached slot in decoding, as it always has)."""
        return (
            type(self).compute_attention
            is not RelativeMultiHeadAttention.compute_attention
        )

    def _heads_attention(self, q, k, v, bias=None, mask=None, training=None):
        """Heads-last `(B, T, N, H)` in, context `(B, T, N, Hv)` and weights out.

        `head_logits` / `head_context` on the projections' own layout unless a
        subclass overrides `compute_attention`, which then gets heads-first
        `(B, N, T, H)` (a cache's decoding step: `_cached_attention`).
        """
        if self._custom_attention:
            swap = ops.attention.swap_heads
            context, weights = self.compute_attention(
                swap(q), swap(k), swap(v), bias, mask, training
            )
            return swap(context), weights
        r = rounder(self.rounding, training)
        logits = r("logits", ops.attention.head_logits(q, k))
        if self.contextual_position is not None:
            bias = _plus(bias, self.contextual_position(q, logits, mask))
        weights = self._weights(logits, bias, mask, training)
        dropped = self._dropout_layer(weights, training=training)
        return r("context", ops.attention.head_context(dropped, v)), weights

    def _every_query_head(self, x, axis=2):
        """Key or value heads repeated to one per query head (grouped-query
        attention: head n reads `n // G`); as they are without groups."""
        groups = self.num_heads // self.num_key_value_heads
        return x if groups == 1 else xp.repeat(x, groups, axis=axis)

    def _weights(self, logits, bias, mask, training=None, step=False):
        """Float32 softmax of `logits + bias` over the keys, masked.

        `step` (one query in a plain graph): the softmax written out, as
        oneDNN's kernel costs more than its work on one row per head.
        """
        r = rounder(self.rounding, training)
        logits = xp.cast(logits, xp.float32)
        if getattr(self.position_bias, "reads_logits", False) and bias is not None:
            bias = bias + self.position_bias.adapt(logits, bias)  # DAPE: f([A, B])
        if bias is not None:
            logits = r("biased", logits + r("bias", bias))
        if mask is not None:
            if self.quantize:  # a constant: the masked logits keep one range
                penalty = -ops.MASK_PENALTY
            else:
                penalty = ops.attention.masked_logit(logits)
            logits = r("masked", xp.where(mask, logits, penalty))
        if step:
            exp = xp.exp(logits - xp.reduce_max(logits, -1, keepdims=True))
            weights = exp / xp.reduce_sum(exp, -1, keepdims=True)
        else:
            weights = xp.nn.softmax(logits, axis=-1)
        if self.quantize:
            weights = quantization.fake_quant_probabilities(weights)
        return xp.cast(weights, self.compute_dtype)

    def _attend(
        self,
        inputs,
        heads,
        masks,
        causal,
        training,
        where,
        attention_mask=None,
        attention_bias=None,
        segments=None,
    ):
        """Heads-last context `(B, T, N, Hv)` and weights (None when block-local).

        `inputs` are the `(query, key)` tensors the bias reads, `heads` the
        projected heads-last `(q, k, v)`, `masks` the query, value and key Keras masks,
        `where` the `start_index` / `positions` / `key_positions` arguments,
        `segments` the `(runs, positions)` of a packed row or None.
        """
        query, key = inputs
        query_mask, value_mask, key_mask = masks
        heads = (heads[0], *(self._every_query_head(x) for x in heads[1:]))
        keys = ops.combine_masks(1, 1, value_mask=value_mask, key_mask=key_mask)
        if keys is not None:  # masked values never reach an output, even NaN
            keys = keys[:, 0]  # (B, S)
            real = keys[:, :, None, None]
            heads = (*heads[:2], xp.where(real, heads[2], xp.zeros_like(heads[2])))
        if self.attention_type == "lsh" or self.attention_window is not None:
            swap = ops.attention.swap_heads  # the band / chunks fold heads-first
            folded, start = [swap(x) for x in heads], where["start_index"]
            if self.attention_type == "lsh":
                context = self._lsh_context(
                    inputs, folded, keys, causal, training, start
                )
            else:
                context = self._local_context(
                    inputs,
                    folded,
                    keys,
                    query_mask,
                    causal,
                    training,
                    start,
                    segments,
                    attention_bias,
                )
            return swap(context), None
        bias = None
        if self.position_bias is not None:
            at = self._bias_where(where, segments)
            bias = xp.cast(self.position_bias(query, key, **at), xp.float32)
        bias = _plus(bias, attention_bias)  # (B or 1, N, T, S)
        allowed = segment_mask(segments, attention_mask)  # (B, T, S) or None
        mask = ops.combine_masks(
            dim(query, 1), dim(key, 1), *masks, allowed, causal
        )  # (B, T, S)
        mask = None if mask is None else mask[:, None]  # (B, 1, T, S)
        return self._heads_attention(*heads, bias, mask, training)
