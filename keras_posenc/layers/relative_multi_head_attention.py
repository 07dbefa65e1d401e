"""Multi-head attention that adds a position bias to its logits.

One class, `RelativeMultiHeadAttention`: its projections (named as Keras'),
the dense attention path and the call checks; the block-local path
(`_local_attention.py`), LSH attention (`_lsh_attention.py`), packed rows
(`_packed_attention.py`) and cached decoding (`_cached_decoding.py`) are mixins.
"""

import math

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import (
    IS_KERAS_3,
    build_sublayer,
    clone_initializer,
    dim,
    incoming_mask,
    keras,
    optional_layer,
    register,
    serialize_layer,
)
from keras_posenc.layers import _rope_checks
from keras_posenc.layers._cached_decoding import CACHE_POINT, CachedDecoding, _plus
from keras_posenc.layers._local_attention import LocalAttention
from keras_posenc.layers._lsh_attention import (  # noqa: F401 (ATTENTION_TYPES)
    ATTENTION_TYPES,
    LSHAttention,
    check_lsh,
)
from keras_posenc.layers._packed_attention import PackedAttention, segment_mask
from keras_posenc.layers._rounding import rounder, rounding_points
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.ops import quantization

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
#: With a rotary layer (`quantize=True`): the two products and the sum of
#: each side (the queries' sum replaces `scaled_query`: the rotation scales).
ROTARY_POINTS = tuple(
    f"{side}_{name}" for side in ("query", "key") for name in ("cos", "sin", "rotated")
)
#: With xPos: the bound of the keys' tables, which grows with the position
#: (learned from the tables of the lengths trained on).
XPOS_POINT = "key_table"


@register
class RelativeMultiHeadAttention(
    CachedDecoding, LocalAttention, LSHAttention, PackedAttention, keras.layers.Layer
):
    """Multi-head attention with a position bias: `softmax(QK^T/sqrt(H) + B) V`.

    Queries `(B, T, Dq)`, keys and values `(B, S, Dv)` of any widths are
    projected to `N` heads (`(B, T, N, H)`, `(B, S, N, H)`), the logits
    `(B, N, T, S)` get the bias `B` of `position_bias` (any producer of the
    bias contract: `RelativePositionBias`, `DynamicPositionBias`, ...) plus an
    optional call-time `attention_bias`; masked keys get exactly zero weight
    (a bounded penalty inside int8 exports, `ops.bounded_masking`). Softmax
    runs in float32 under mixed precision; the output is projected to `output_dim`
    (the query width by default). The projections are public, named as in
    Keras' layer: `query_dense`, `key_dense`, `value_dense`, `output_dense`.

    Subclasses change how attention is computed by overriding one method,
    `compute_attention(query, key, value, bias, mask, training)`: it takes
    projected, scaled heads-first heads (last two axes `(T, H)` / `(S, H)`;
    the `(T, 3W)` band in block-local mode), and returns the context
    `(..., T, Hv)` and the weights `(..., T, S)`. This differs from Keras'
    `_compute_attention`, which takes heads-last `(B, T, N, H)`: the
    block-local band folds heads with blocks, so heads-first is the one
    layout every path (dense, cached, block-local) can hand an override.
    The layer's own computation is the same softmax, from the projections'
    heads-last layout (`ops.attention.head_logits` / `head_context`); an
    override replaces it on every path.

    Built from Dense projections, reshapes, transposes of the heads and
    batched matmuls (no GELU); the TFLite converter keeps them as
    BATCH_MATMUL and TRANSPOSE, so with static shapes
    it exports to full-int8 TFLite and runs on microcontrollers. Keras masks work as in
    `keras.layers.MultiHeadAttention`; a fully masked row gives finite output.

    Args:
        num_heads: int, the number of heads N.
        key_dim: int, the size H of each query/key head.
        value_dim: int, the size of each value head. Defaults to `None`
            (same as `key_dim`).
        output_dim: int, the output width. Defaults to `None` (the query
            width).
        dropout: float, dropout rate on the attention weights.
            Defaults to `0.0`.
        use_bias: bool, whether the projections have biases.
            Defaults to `True`.
        position_bias: a bias-producing layer called as
            `position_bias(query, key)`, or None. Defaults to `None`.
        kernel_initializer: str or initializer for the projection kernels.
            Defaults to `"glorot_uniform"`.
        bias_initializer: str or initializer for the projection biases.
            Defaults to `"zeros"`.
        attention_window: int W for block-local self-attention: each block
            of W queries attends to its own and both neighbouring blocks (3W
            keys), so time and memory grow linearly in T and the bias is
            evaluated on the band (one band if it reads `j - i` only). It equals
            dense attention under `keras_posenc.ops.band_mask`. It takes Keras
            masks, causal masking, `segment_ids` and an `attention_bias` on
            the band (`(B or 1, N*nb, W, 3W)`, nb = ceil(T / W), as
            `ForgettingGate(attention_window=W)` returns it), not an
            `attention_mask`, explicit positions or returned scores.
            Defaults to `None` (dense).
        rotary: a `RotaryEmbedding` turning the projected queries and keys at
            their true positions, or None. Defaults to `None`.
        contextual_position: a `ContextualPosition` (CoPE), the door for a
            position that reads the attention itself: called with the scaled
            query heads `(B, T, N, H)`, the logits `(B, N, T, S)` and the mask,
            it returns a term added to the logits (with any bias). Block-local
            (`attention_window`), it counts over each query's band (every key
            between a band key and its query is in the band, so the counts
            are the dense ones under `keras_posenc.ops.band_mask`).
            Defaults to `None`.
        quantize: bool, fake-quantize what int8 TFLite rounds for
            quantization-aware training: the projections (`QuantizedDense`),
            the scaled queries, the logits, the bias, the biased and masked
            logits (each on a range learned in training), the softmax
            (TFLite's fixed 1/256 grid) and the context; with a rotary
            layer, its cos and sin tables (on their fixed range) and each
            side's two products and sum in place of the scaled queries
            (`ROTARY_POINTS`); with xPos the keys' tables, whose scales grow
            with the position, on the bound learned from the lengths trained
            on (`XPOS_POINT`: a key past them saturates there, in Keras and
            in the int8 model alike). Dense or block-local (the same points
            on the band), not LSH; a rotary layer of one table per 1-D
            position turning every feature (no length-dependent type, grid
            or learned frequencies: refused). Masked logits take
            the bounded penalty of int8 exports (`ops.MASK_PENALTY`).
            Defaults to False.
        quantize_cache: bool, with `quantize`: also round the keys and values
            together on one learned range, as the int8 cache tensor of a
            decoding export holds them (`tflite_export.convert_causal_lm`);
            decoding with a `cache` needs it, and then equals a recompute
            exactly. Self-attention with `value_dim` None. Defaults to False.
        attention_type: str, `"dense"` (or block-local with
            `attention_window`) or `"lsh"`: LSH attention (Kitaev et al.
            2020, `keras_posenc.ops.lsh`), self-attention whose keys are the
            queries' projection (shared QK, as unit vectors: the layer has
            no `key_dense` and reads no `key` input), hashed by random
            rotations into `ceil(T / bucket_size)` buckets (even, at least
            2) in `num_hashes` rounds; each query attends to the keys of its
            chunk of the sorted order and of the chunk before it, to itself
            only when nothing else is allowed, and the rounds combine by
            their log-sum-exp. Time and memory grow as `T log T`; with one
            chunk (`bucket_size >= T`) it is dense shared-QK attention. The
            bias is evaluated at the true positions of every scored pair.
            Takes Keras masks, causal masking (a query's chunk depends on
            the buckets of later tokens, not on their values: no cached
            decoding); padding never changes a real token's output (each
            row hashes into the bucket count of its real tokens). Not
            `attention_window`, `quantize`, `contextual_position`,
            `attention_mask`, `attention_bias`, `segment_ids` (buckets would
            route across documents), explicit positions, returned scores or
            a `cache`; no TFLite export (it sorts). Defaults to `"dense"`.
        num_hashes: int R, the hashing rounds of `"lsh"`. Defaults to `2`.
        bucket_size: int C, the chunk length of `"lsh"`. Defaults to `64`.
        hash_seed: int, the seed of the rotations of `"lsh"`: they are a
            function of the seed and the bucket count, fixed (Reformer draws
            new ones at every step), so a call, a saved model and a graph
            give the same buckets. Defaults to `0`.

    Call arguments:
        query: tensor `(B, T, Dq)`.
        value: optional tensor `(B, S, Dv)`; defaults to `query`
            (self-attention, also the form quantization-aware training wraps).
        key: optional tensor `(B, S, Dk)`; defaults to `value`.
        attention_mask: optional boolean `(B, T, S)`; True where attention is
            allowed.
        attention_bias: optional precomputed bias broadcastable to
            `(B, N, T, S)` (`(B, N, T, S_max)` with `cache`), added to the logits;
            with `attention_window` (and no cache), the band's bias
            `(B or 1, N*nb, W, 3W)`.
        use_causal_mask: bool, mask keys `j > i`. Defaults to `False`.
        return_attention_scores: bool, also return the `(B, N, T, S)`
            attention weights. Defaults to `False`.
        training: bool, whether dropout is active.
        query_mask, value_mask, key_mask: optional booleans `(B, T)`, `(B, S)`,
            `(B, S)`, True at real tokens; Keras passes the inputs' masks here
            (masked queries still get a finite output).
        start_index: int or scalar tensor, the position of the first query
            (decoding with a cache); keys sit at `0 .. S-1`. Defaults to `0`.
        positions: optional query positions `(T,)` or `(B, T)` (`(..., C)`
            coordinates for an N-D rotary) for the bias and the rotation.
        key_positions: optional key positions of the same form.
        cache: optional `(B, 2, S_max, N, H)` keys and values of positions
            `0 .. S_max - 1` (keras-hub's `CachedMultiHeadAttention` layout):
            the new tokens' keys and values are written at
            `cache_update_index`, the queries (at positions
            `cache_update_index + t`) attend causally over the cache with the
            bias and rotation at their true positions, and the call returns
            `(output, updated_cache)`.
        cache_update_index: int or scalar tensor, the position of the first
            new token; required with `cache`.
        sink_tokens: optional int >= 0, with `cache`: the cache is a rolling
            cache (attention sinks) of its `S_max` slots, the first
            `sink_tokens` tokens and the last `S_max - sink_tokens`, so
            decoding runs past `S_max` at fixed memory
            (`ops.cache.rolling_positions`). Keys are cached before rotation;
            the bias and the rotation read positions inside the cache. Tokens
            arrive together only while the cache fills, then one at a time.
        segment_ids: optional int `(B, T)`, a packed row (self-attention):
            documents are contiguous runs of one id (0 is padding), each
            query attends only to keys of its run, and the bias and the
            rotation read positions that restart at 0 in each run
            (`keras_posenc.ops.segments`), so every document gets the output
            it gets alone. Dense and block-local; not LSH (its buckets route
            across documents), not with `cache`, `positions` or a rotary
            type that reads the current length.

    Returns:
        The `(B, T, output_dim)` output; with `return_attention_scores` also
        the `(B, N, T, S)` weights; with `cache` also the updated cache.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> attention = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4,
    ...     position_bias=keras_posenc.RelativePositionBias(num_heads=2))
    >>> x = tf.random.normal((3, 7, 16))
    >>> attention(x, x).shape
    TensorShape([3, 7, 16])
    >>> lsh = keras_posenc.RelativeMultiHeadAttention(
    ...     num_heads=2, key_dim=4, attention_type="lsh", bucket_size=4)
    >>> lsh(x, x, use_causal_mask=True).shape
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
        attention_window=None,
        rotary=None,
        quantize=False,
        quantize_cache=False,
        contextual_position=None,
        attention_type="dense",
        num_hashes=2,
        bucket_size=64,
        hash_seed=0,
        **kwargs,
    ):
        num_heads = _checks.positive_int("num_heads", num_heads)
        key_dim = _checks.positive_int("key_dim", key_dim)
        value_dim = _checks.positive_int("value_dim", value_dim, allow_none=True)
        output_dim = _checks.positive_int("output_dim", output_dim, allow_none=True)
        dropout = _checks.rate("dropout", dropout)
        use_bias = _checks.boolean("use_bias", use_bias)
        attention_window = _checks.positive_int(
            "attention_window", attention_window, allow_none=True
        )
        position_bias = optional_layer("position_bias", position_bias)
        _check_heads("position_bias", position_bias, num_heads)
        rotary = optional_layer("rotary", rotary, RotaryEmbedding)
        quantize = _checks.boolean("quantize", quantize)
        if quantize and rotary is not None:
            _rope_checks.check_quantized_rotary(rotary, key_dim)
        quantize_cache = _checks.boolean("quantize_cache", quantize_cache)
        contextual_position = optional_layer(
            "contextual_position", contextual_position, ContextualPosition
        )
        if contextual_position is not None and quantize:
            _checks.fail(
                "contextual_position",
                "None with `quantize=True` (it counts over the logits in float)",
                contextual_position,
            )
        if quantize_cache and (not quantize or value_dim not in (None, key_dim)):
            _checks.fail(
                "quantize_cache",
                "False unless quantize=True and value_dim is None or key_dim "
                "(keys and values share one cache tensor)",
                quantize_cache,
                fix=f"Received quantize={quantize}, value_dim={value_dim}",
            )
        lsh = check_lsh(
            attention_type,
            dict(
                num_hashes=num_hashes,
                bucket_size=bucket_size,
                hash_seed=hash_seed,
                attention_window=attention_window,
                quantize=quantize,
                contextual_position=contextual_position,
            ),
            type(self).compute_attention
            is not RelativeMultiHeadAttention.compute_attention,
        )
        super().__init__(**kwargs)
        self.attention_type, self.num_hashes, self.bucket_size, self.hash_seed = lsh
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.position_bias = position_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.attention_window = attention_window
        self.rotary = rotary
        self.quantize = quantize
        self.quantize_cache = quantize_cache
        self.contextual_position = contextual_position
        points = ROUNDING_POINTS + ((CACHE_POINT,) if quantize_cache else ())
        if rotary is not None:  # the rotation scales the queries
            points = ROTARY_POINTS + tuple(p for p in points if p != "scaled_query")
            if rotary.xpos_scale_base is not None:
                points += (XPOS_POINT,)
        self.rounding = rounding_points(self, points, quantize)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        width = _checks.known_width(query_shape, "query")
        heads_v = self.num_heads * (self.value_dim or self.key_dim)
        self._query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self._key_dense = None  # LSH: the keys are the queries' projection
        if self.attention_type != "lsh":
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
        self_attention = value is None and key is None  # Keras 2 converts query only
        value = query if value is None else tf.convert_to_tensor(value)
        key = value if key is None else tf.convert_to_tensor(key)
        self._check_call(
            query,
            key,
            value,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            return_attention_scores=return_attention_scores,
            positions=positions,
            key_positions=key_positions,
            cache=cache,
            cache_update_index=cache_update_index,
            self_attention=self_attention,
            segment_ids=segment_ids,
        )
        where = dict(
            start_index=start_index, positions=positions, key_positions=key_positions
        )
        segments = self._segments(
            segment_ids,
            query,
            key,
            dict(cache=cache, positions=positions, key_positions=key_positions),
        )  # (runs, positions) of a packed row, or None
        pairs = ((query, query_mask), (value, value_mask), (key, key_mask))
        masks = [incoming_mask(tensor, mask) for tensor, mask in pairs]
        if cache is not None and self.quantize and not self.quantize_cache:
            _checks.fail(
                "cache",
                "None for a layer with quantize=True and quantize_cache=False "
                "(an int8 cache needs its own range)",
                "a cache",
            )
        if sink_tokens is not None:
            self._check_rolling(cache, sink_tokens)
        if cache is not None:  # decoding: self-attention over the cache
            extra = dict(attention_mask=attention_mask, attention_bias=attention_bias)
            if sink_tokens is not None:
                return self._decode_rolling(
                    query, cache, cache_update_index, sink_tokens, **extra
                )
            return self._decode(query, cache, cache_update_index, **extra)
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
                "attention_window": self.attention_window,
                "rotary": serialize_layer(self.rotary),
                "quantize": self.quantize,
                "quantize_cache": self.quantize_cache,
                "contextual_position": serialize_layer(self.contextual_position),
                "attention_type": self.attention_type,
                "num_hashes": self.num_hashes,
                "bucket_size": self.bucket_size,
                "hash_seed": self.hash_seed,
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
        logits = r("logits", tf.matmul(query, key, transpose_b=True))
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
        return r("context", tf.matmul(dropped, value)), weights

    def _project(self, query, key, value, training=None):
        """Heads-last query, key, value `(B, T|S, N, H)`; queries scaled by 1/sqrt(H).

        Heads stay where the projection puts them (as in Keras'
        `MultiHeadAttention`); only the logits and the context move them. When
        a rotary layer rotates every feature, `rotate` scales the queries
        (on their cos and sin, `(T, r/2)`, one product fewer per call).
        """
        shared = self._key_dense is None  # LSH: keys are the query heads
        q, k, v = (
            None
            if dense is None
            else tf.reshape(
                dense(x, training=training), [-1, dim(x, 1), self.num_heads, size]
            )
            for dense, x, size in (
                (self._query_dense, query, self.key_dim),
                (self._key_dense, key, self.key_dim),
                (self._value_dense, value, self.value_dim or self.key_dim),
            )
        )
        k = q if shared else k
        if self._scale_in_rotation():
            return q, k, v
        scaled = q * tf.cast(self._query_scale, q.dtype)
        return rounder(self.rounding, training)("scaled_query", scaled), k, v

    def _round_cache(self, k, v, training=None):
        """Keys and values `(B, S, N, H)` on the cache's one range (or as they are)."""
        if not self.quantize_cache:
            return k, v
        pair = rounder(self.rounding, training)(CACHE_POINT, tf.stack([k, v], 1))
        return tf.unstack(pair, axis=1)

    @property
    def _query_scale(self):
        """1/sqrt(H), the factor on the queries."""
        return 1.0 / math.sqrt(self.key_dim)

    def _length_dependent(self):
        return ops.rotary.ROPE_TYPES[self.rotary.rope_type].length_dependent

    def _scale_in_rotation(self):
        rotary = self.rotary
        return rotary is not None and rotary.rotary_width == self.key_dim

    def _merge(self, context, training=None):
        """Heads-last context `(B, T, N, Hv)` -> the output `(B, T, output_dim)`."""
        shape = [-1, dim(context, 1), context.shape[2] * context.shape[3]]
        rounding = {"training": training} if self.quantize else {}
        return self._output_dense(tf.reshape(context, shape), **rounding)

    def _dense(self, units, name):
        dense = QuantizedDense if self.quantize else keras.layers.Dense
        return dense(
            units,
            use_bias=self.use_bias,
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

    def _heads_attention(
        self, q, k, v, bias=None, mask=None, training=None, step=False
    ):
        """Heads-last `(B, T, N, H)` in, context `(B, T, N, Hv)` and weights out.

        `head_logits` / `head_context` on the projections' own layout unless a
        subclass overrides `compute_attention`, which then gets heads-first
        `(B, N, T, H)`. `step`: attention over a cache; one query in a
        plain graph outside an export (`ops.cache.static_decoding()`) then
        takes `step_logits` / `step_context` (exports keep the matmuls).
        """
        if self._custom_attention:
            swap = ops.attention.swap_heads
            context, weights = self.compute_attention(
                swap(q), swap(k), swap(v), bias, mask, training
            )
            return swap(context), weights
        r = rounder(self.rounding, training)
        step = (
            step
            and q.shape[1] == 1
            and not ops.attention.in_xla()
            and not ops.cache.is_static()
        )
        products = (
            (ops.attention.step_logits, ops.attention.step_context)
            if step
            else (ops.attention.head_logits, ops.attention.head_context)
        )
        logits = r("logits", products[0](q, k))
        if self.contextual_position is not None:
            bias = _plus(bias, self.contextual_position(q, logits, mask))
        weights = self._weights(logits, bias, mask, training, step)
        dropped = self._dropout_layer(weights, training=training)
        return r("context", products[1](dropped, v)), weights

    def _weights(self, logits, bias, mask, training=None, step=False):
        """Float32 softmax of `logits + bias` over the keys, masked.

        `step` (one query in a plain graph): the softmax written out, as
        oneDNN's kernel costs more than its work on one row per head.
        """
        r = rounder(self.rounding, training)
        logits = tf.cast(logits, tf.float32)
        if bias is not None:
            logits = r("biased", logits + r("bias", bias))
        if mask is not None:
            if self.quantize:  # a constant: the masked logits keep one range
                penalty = -ops.MASK_PENALTY
            else:
                penalty = ops.attention.masked_logit(logits)
            logits = r("masked", tf.where(mask, logits, penalty))
        if step:
            exp = tf.exp(logits - tf.reduce_max(logits, -1, keepdims=True))
            weights = exp / tf.reduce_sum(exp, -1, keepdims=True)
        else:
            weights = tf.nn.softmax(logits, axis=-1)
        if self.quantize:
            weights = quantization.fake_quant_probabilities(weights)
        return tf.cast(weights, self.compute_dtype)

    def _rotate(
        self,
        q,
        k,
        query,
        key,
        start_index=0,
        positions=None,
        key_positions=None,
        max_length=None,
        length=None,
        training=None,
        rows=None,
    ):
        """`rotary` applied to heads-last `(B, T|S, N, H)` at their true positions.

        Scales the queries by 1/sqrt(H) when `project` left it to the rotation.
        A length-dependent rotary type reads one current length for both
        sides: `length` when given (a decoding step: the tokens so far), else
        the largest position + 1.
        `max_length` is the cache length S_max of a decoding step: inside
        `ops.cache.static_decoding()`, the cos and sin of every cached
        position then fold into a constant and the step gathers the rows of
        its runtime positions (no SIN, COS or EXP on the device) when the
        rotary layer is `position_only`: at the integer `rows` when given
        (one tensor for both sides, or a pair: the queries' and the keys',
        as a rolling cache's places), so no float position enters the export.
        """
        q_pos = self.rotary.resolve(query, start_index, positions)  # (..., T, C)
        k_pos = self.rotary.resolve(key, 0, key_positions)  # (..., S, C)
        # One current length for both sides keeps q.k relative.
        if not self._length_dependent():
            length = None
        elif length is None:
            length = tf.maximum(tf.reduce_max(q_pos), tf.reduce_max(k_pos)) + 1.0
        tabulate = max_length is not None and ops.cache.is_static()
        tabulate = tabulate and self.rotary.position_only and q_pos.shape.rank == 2
        side_rows = {"query": rows, "key": rows}  # integer rows, never rounded
        if isinstance(rows, tuple):  # (query rows, key rows)
            side_rows = dict(zip(("query", "key"), rows))
            rows = None
        if self.quantize:
            rows = rows if tabulate else None
            return [
                self._rotate_rounded(x, where, side, max_length, rows, training)
                for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key"))
            ]
        rotated = []
        for x, where, side in ((q, q_pos, "query"), (k, k_pos, "key")):
            if tabulate:  # (T, 1) positions: rows of a constant table
                every = ops.position_range(max_length)[:, None]  # (S_max, 1)
                table = self.rotary.cos_sin(every, side)
                at = side_rows[side]
                at = tf.cast(where[:, 0], tf.int32) if at is None else at
                cos, sin = (tf.gather(t, at) for t in table)
            else:
                cos, sin = self.rotary.cos_sin(where, side, length)
            if side == "query" and self._scale_in_rotation():
                cos, sin = cos * self._query_scale, sin * self._query_scale
            if not self.rotary.learned_frequencies:  # (..., L, r/2): one per head
                cos, sin = cos[..., None, :], sin[..., None, :]
            rotated.append(ops.rotary.rotate(x, cos, sin, self.rotary.interleaved))
        return rotated

    def _table_rows(self, length, index):
        """Integer rows `index .. index + T - 1` of the rotation tables.

        An export gathers the rows at these integers: a position cast to
        float on its way would be an activation the int8 converter rounds
        (to its calibrated range's 255 steps), and a row read one off.
        """
        return tf.range(length) + tf.cast(index, tf.int32)

    def _rotate_rounded(self, x, where, side, max_length, rows, training):
        """`_rotate` of one side as the int8 model computes it (`quantize`).

        The widened, signed cos and sin tables are rounded on their fixed
        range (the attention factor, times 1/sqrt(H) for the queries): a
        constant of the int8 model, of every cached position when the
        decoding step gives its integer `rows` (it gathers them: no float op
        on positions); the two products and their sum pass their learned
        ranges (`ROTARY_POINTS`).
        """
        limit = abs(self.rotary.attention_factor)
        if side == "query":
            limit *= self._query_scale
        if rows is not None:
            where = ops.position_range(max_length)[:, None]  # (S_max, 1)
        cos, sin = self.rotary.cos_sin(where, side)
        if side == "query":
            cos, sin = cos * self._query_scale, sin * self._query_scale
        tables = ops.rotary.rotation_tables(cos, sin, self.rotary.interleaved)
        if side == "key" and XPOS_POINT in self.rounding:  # xPos: scales >= 1
            bound = self.rounding[XPOS_POINT]
            bound(tf.reduce_max(tf.abs(tf.stack(tables)))[None], training=training)
            limit = bound.maximum  # the largest |entry| of the tables trained on
        tables = [quantization.fake_quant_symmetric(t, limit) for t in tables]
        if rows is not None:
            tables = [tf.gather(t, rows) for t in tables]
        cos, sin = (t[..., None, :] for t in tables)  # one table for every head
        r = rounder(self.rounding, training)
        return ops.rotary.rotate_widened(
            x,
            cos,
            sin,
            self.rotary.interleaved,
            lambda name, tensor: r(f"{side}_{name}", tensor),
        )

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
        keys = ops.combine_masks(1, 1, value_mask=value_mask, key_mask=key_mask)
        if keys is not None:  # masked values never reach an output, even NaN
            keys = keys[:, 0]  # (B, S)
            real = keys[:, :, None, None]
            heads = (*heads[:2], tf.where(real, heads[2], tf.zeros_like(heads[2])))
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
            bias = tf.cast(self.position_bias(query, key, **at), tf.float32)
        bias = _plus(bias, attention_bias)  # (B or 1, N, T, S)
        allowed = segment_mask(segments, attention_mask)  # (B, T, S) or None
        mask = ops.combine_masks(
            dim(query, 1), dim(key, 1), *masks, allowed, causal
        )  # (B, T, S)
        mask = None if mask is None else mask[:, None]  # (B, 1, T, S)
        return self._heads_attention(*heads, bias, mask, training)

    def _check_call(self, query, key, value, **call_arguments):
        """Errors for calls the layer cannot honour, before any work."""
        window = self.attention_window
        for name, tensor in (("query", query), ("value", value), ("key", key)):
            if tensor.shape.rank not in (None, 3):
                raise ValueError(
                    f"`{name}` must have rank 3, (B, L, D): attention never folds "
                    f"other axes into the batch. Received: {name}.shape={tensor.shape}"
                )
        s_v, s_k = value.shape[1], key.shape[1]
        if s_v is not None and s_k is not None and s_v != s_k:
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={key.shape}, value.shape={value.shape}"
            )
        if self.attention_type == "lsh":
            self._check_lsh_call(query, key, call_arguments)
        if call_arguments["cache"] is not None:
            self._check_cache(query, **call_arguments)
            return
        if call_arguments["cache_update_index"] is not None:
            raise ValueError(
                "`cache_update_index` goes with `cache`. Received: cache=None, "
                f"cache_update_index={call_arguments['cache_update_index']!r}"
            )
        if window is None:
            return
        t, s = query.shape[1], key.shape[1]
        if t is not None and s is not None and t != s:
            raise ValueError(
                "`attention_window` needs self-attention (equal query and key "
                f"lengths). Received: query.shape={query.shape}, key.shape={key.shape}"
            )
        if call_arguments["return_attention_scores"]:
            raise ValueError(
                "`return_attention_scores` needs the dense (T, S) weights, which "
                "local attention never builds. Received: return_attention_scores="
                f"True with attention_window={window}"
            )
        for name in ("attention_mask", "positions", "key_positions"):
            if call_arguments[name] is not None:
                raise ValueError(
                    f"`{name}` must be None with attention_window={window} (local "
                    "attention builds its own band; use query/key masks and "
                    f"start_index). Received: a {name} tensor"
                )
        _check_band_bias(call_arguments["attention_bias"], t, window, self.num_heads)


def _check_band_bias(bias, length, window, num_heads):
    """A block-local `attention_bias` must lie on the band `(B|1, N*nb, W, 3W)`."""
    if bias is None:
        return
    shape = tf.TensorShape(getattr(bias, "shape", None))
    folded = None if length is None else num_heads * -(-length // window)
    expected = [folded, window, 3 * window]
    if shape.rank != 4 or any(
        want is not None and got is not None and got != want
        for want, got in zip(expected, shape[1:])
    ):
        raise ValueError(
            f"`attention_bias` with attention_window={window} must be the band's "
            f"bias (B or 1, N*nb, W, 3W) = (B or 1, {folded}, {window}, "
            f"{3 * window}) (nb = ceil(T / W); `ForgettingGate(attention_window="
            f"{window})` returns it). Received: attention_bias.shape={shape}"
        )


def _check_heads(name, producer, num_heads):
    """A bias producer must make one bias per attention head."""
    heads = getattr(producer, "num_heads", num_heads)
    if heads != num_heads:
        _checks.fail(
            name,
            f"a producer of num_heads={num_heads} heads",
            f"{type(producer).__name__}(num_heads={heads})",
        )
