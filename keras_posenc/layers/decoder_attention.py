"""The attention of a modern decoder layer: per-head norms, sliding windows, sinks."""

import numpy as np

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import (
    add_float32_weight,
    build_sublayer,
    dim,
    optional_layer,
    register,
    serialize_layer,
)
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)


@register
class DecoderAttention(RelativeMultiHeadAttention):
    """`RelativeMultiHeadAttention` with the parts of today's decoder layers.

    On top of every path of its base class (a position bias, a rotation,
    grouped-query heads, cached and packed decoding): `query_norm` and
    `key_norm` normalize each projected head before the rotation (Qwen 3 and
    Gemma 3's QK norm, an `RMSNorm` over H); `qkv_bias` gives the query,
    key and value projections biases apart from the output's (Qwen 2);
    `query_scale` replaces `1/sqrt(H)` (Gemma's `query_pre_attn_scalar`);
    `sliding_window` W lets query `i` see keys `i - W < j` only (Mistral,
    Gemma 3's local layers: HF transformers' sliding window); and
    `attention_sinks` adds one learned logit per head to every softmax's
    denominator (gpt-oss): weights `exp(l_j) / (sum_j exp(l_j) + exp(s_n))`;
    `query_temperature` `{"floor_scale": F, "attn_scale": a}` scales the
    query at position p by `log(floor((p + 1) / F) + 1) a + 1` (Llama 4's
    NoPE layers: sharper attention far into a long context).

    Args:
        num_heads: int, the number of heads N.
        key_dim: int, the size H of each query/key head.
        query_norm: a layer applied to the query heads `(B, T, N, H)`
            before the rotation, or None. Defaults to `None`.
        key_norm: the same for the key heads, or None. Defaults to `None`.
        qkv_bias: bool or None, biases on the query, key and value
            projections; None follows `use_bias`. Defaults to `None`.
        query_scale: float or None, the factor on the queries. Defaults to
            `None` (`1/sqrt(key_dim)`).
        sliding_window: int or None, the sliding window W. Defaults to `None`.
        attention_sinks: bool, a learned sink logit per head. Defaults to
            `False`.
        query_temperature: dict or None, `floor_scale` and `attn_scale` of
            Llama 4's position-dependent query scale. Defaults to `None`.
        **kwargs: the other arguments of `RelativeMultiHeadAttention`
            (`use_bias`, `rotary`, `position_bias`, `num_key_value_heads`, ...).

    Call arguments:
        query: tensor `(B, T, Dq)`.
        value, key: optional `(B, S, Dv)`, `(B, S, Dk)`; default to the query.
        training: bool, whether dropout is active.
        attention_mask: optional boolean `(B, T, S)`, True where allowed
            (combined with the sliding window's).
        attention_bias: optional bias broadcastable to `(B, N, T, S)`.
        use_causal_mask: bool, mask keys `j > i`.
        return_attention_scores: bool, also return the weights.
        query_mask, value_mask, key_mask: Keras masks, True at real tokens.
        start_index: the first query's position (decoding). Defaults to `0`.
        positions, key_positions: optional explicit positions `(T,)`/`(B, T)`.
        cache, cache_update_index: a `[keys, values]` pair and where the new
            tokens go, as `RelativeMultiHeadAttention` takes them.
        sink_tokens: with `cache`, a rolling cache keeping the first tokens.
        segment_ids: optional int `(B, T)`: packed documents.

    Returns:
        As `RelativeMultiHeadAttention`'s.

    Example:

    >>> import tensorflow as tf
    >>> import keras_posenc
    >>> attention = keras_posenc.DecoderAttention(
    ...     num_heads=4, key_dim=8, num_key_value_heads=2, use_bias=False,
    ...     query_norm=keras_posenc.RMSNorm(), key_norm=keras_posenc.RMSNorm(),
    ...     rotary=keras_posenc.RotaryEmbedding(), sliding_window=3)
    >>> x = tf.random.normal((2, 6, 16))
    >>> attention(x, use_causal_mask=True).shape
    TensorShape([2, 6, 16])

    References:
        - [Jiang et al., 2023 (Mistral)](https://arxiv.org/abs/2310.06825)
        - [Gemma Team, 2025 (Gemma 3)](https://arxiv.org/abs/2503.19786)
        - [Xiao et al., 2023 (attention sinks)](https://arxiv.org/abs/2309.17453)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        query_norm=None,
        key_norm=None,
        qkv_bias=None,
        query_scale=None,
        sliding_window=None,
        attention_sinks=False,
        query_temperature=None,
        **kwargs,
    ):
        query_norm = optional_layer("query_norm", query_norm)
        key_norm = optional_layer("key_norm", key_norm)
        if qkv_bias is not None:
            qkv_bias = _checks.boolean("qkv_bias", qkv_bias)
        if query_scale is not None:
            query_scale = _checks.positive_float("query_scale", query_scale)
        sliding_window = _checks.positive_int(
            "sliding_window", sliding_window, allow_none=True
        )
        attention_sinks = _checks.boolean("attention_sinks", attention_sinks)
        query_temperature = check_temperature(query_temperature)
        _check_parts(kwargs, query_norm or key_norm, sliding_window, attention_sinks)
        super().__init__(num_heads, key_dim, **kwargs)
        self.query_norm = query_norm
        self.key_norm = key_norm
        self.qkv_bias = qkv_bias
        self.query_scale = query_scale
        self.sliding_window = sliding_window
        self.attention_sinks = attention_sinks
        self.query_temperature = query_temperature
        self._query_factors = None  # (T,) during a call with a temperature

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        for norm, heads in (
            (self.query_norm, self.num_heads),
            (self.key_norm, self.num_key_value_heads),
        ):
            if norm is not None and not norm.built:
                build_sublayer(norm, (None, None, heads, self.key_dim))
        self.sinks = None
        if self.attention_sinks:
            self.sinks = add_float32_weight(
                self, name="sinks", shape=(self.num_heads,), initializer="zeros"
            )
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
        if self.sliding_window is not None:
            window = self._window_mask(
                query,
                key if key is not None else value,
                cache,
                cache_update_index,
                (start_index, positions, key_positions),
            )
            if attention_mask is not None:
                window = xp.logical_and(window, xp.cast(attention_mask, xp.bool))
            attention_mask = window
        if self.query_temperature is not None:
            self._query_factors = self._temperature(
                query, cache, cache_update_index, start_index, positions
            )
        given = dict(
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            start_index=start_index,
            positions=positions,
            key_positions=key_positions,
            cache=cache,
            cache_update_index=cache_update_index,
            sink_tokens=sink_tokens,
            segment_ids=segment_ids,
        )
        try:
            return super().call(query, value, key, **given)
        finally:
            self._query_factors = None

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "query_norm": serialize_layer(self.query_norm),
                "key_norm": serialize_layer(self.key_norm),
                "qkv_bias": self.qkv_bias,
                "query_scale": self.query_scale,
                "sliding_window": self.sliding_window,
                "attention_sinks": self.attention_sinks,
                "query_temperature": self.query_temperature,
            }
        )
        return config

    def rolling_blocker(self):
        """Why this layer cannot decode through a rolling cache, or None."""
        if self.sliding_window is not None:
            return "a sliding window (its own W keys, not a ring's)"
        if self.query_temperature is not None:
            return "query_temperature (it reads the text's positions)"
        return super().rolling_blocker()

    def _window_mask(self, query, key, cache, index, where):
        """Boolean `(1, T, S)` (or `(B, T, S)`): the sliding window's keys."""
        start_index, positions, key_positions = where
        if cache is not None:  # new tokens at `index ...` against every slot
            slots = _slots(cache)
            queries = xp.range(dim(query, 1)) + xp.cast(index, xp.int32)
            keys = xp.range(slots)
        else:
            queries = positions
            if queries is None:
                queries = xp.range(dim(query, 1)) + xp.cast(start_index, xp.int32)
            keys = key_positions
            if keys is None:
                keys = xp.range(dim(query if key is None else key, 1))
        mask = ops.attention.sliding_window_mask(queries, keys, self.sliding_window)
        return mask if len(mask.shape) == 3 else mask[None]

    def _normalize_heads(self, q, k):
        if self.query_norm is not None:
            q = self.query_norm(q)
        if self.key_norm is not None:
            k = self.key_norm(k)
        if self._query_factors is not None:  # (T,): one factor a position
            q = q * xp.cast(self._query_factors, q.dtype)[None, :, None, None]
        return q, k

    def _temperature(self, query, cache, index, start_index, positions):
        """Float32 `(T,)`: Llama 4's query factor at each new token's position.

        Decoding into a cache of S slots, the factors are a constant table of
        the S positions gathered at the new tokens' (an int8 GATHER, where
        the formula's FLOOR and LOG run in float only in TFLM).
        """
        if positions is None:
            start = index if cache is not None else start_index
            new = xp.range(dim(query, 1)) + xp.cast(start, xp.int32)
            slots = None if cache is None else _slots(cache)
            if isinstance(slots, int):  # positions below S: no cache rolls here
                table = self._temperature_of(np.arange(slots, dtype="float64"))
                return xp.gather(xp.constant(table, xp.float32), new)
            positions = new
        where = xp.cast(positions, xp.float32)
        if len(where.shape) != 1:
            _checks.fail(
                "positions",
                "(T,) positions with query_temperature (one factor a position)",
                f"shape {where.shape}",
            )
        return self._temperature_of(where)

    def _temperature_of(self, where):
        """`log(floor((p + 1) / F) + 1) a + 1` of positions `where` (NumPy or
        float32 tensor: the same formula, written once)."""
        floor_scale = self.query_temperature["floor_scale"]
        scale = self.query_temperature["attn_scale"]
        if isinstance(where, np.ndarray):
            return np.log1p(np.floor((where + 1.0) / floor_scale)) * scale + 1.0
        return xp.math.log1p(xp.floor((where + 1.0) / floor_scale)) * scale + 1.0

    def _dense(self, units, name, use_bias=None):
        if name != "attention_output" and self.qkv_bias is not None:
            use_bias = self.qkv_bias  # the query, key and value projections
        return super()._dense(units, name, use_bias)

    @property
    def _query_scale(self):
        if self.query_scale is not None:
            return self.query_scale
        return super()._query_scale

    def _weights(self, logits, bias, mask, training=None, step=False):
        """The softmax with a sink logit per head in every denominator."""
        if not self.attention_sinks:
            return super()._weights(logits, bias, mask, training, step)
        logits = xp.cast(logits, xp.float32)  # (B, N, T, S)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = xp.where(mask, logits, ops.attention.masked_logit(logits))
        # One softmax over the keys and a sink column, the sink's weight
        # dropped (gpt-oss's own form): integer kernels (CONCATENATION,
        # SOFTMAX, STRIDED_SLICE) where the written-out sum needed EXP.
        sink = xp.reshape(self.sinks, [1, -1, 1, 1])  # (1, N, 1, 1)
        sink = xp.zeros_like(logits[..., :1]) + sink  # (B, N, T, 1)
        weights = xp.nn.softmax(xp.concat([logits, sink], -1), axis=-1)
        return xp.cast(weights[..., :-1], self.compute_dtype)


def _slots(cache):
    """The slot count S of a cache (`[keys, values]` or one tensor)."""
    return (cache[0] if isinstance(cache, (list, tuple)) else cache).shape[2]


def _check_parts(kwargs, norms, sliding_window, attention_sinks):
    """Refuses combinations the added parts have no path for, before any work."""
    lsh = (kwargs.get("attention_options") or {}).get("attention_type") == "lsh"
    local = kwargs.get("attention_window") is not None
    for given, name, value in (
        (sliding_window is not None, "sliding_window", sliding_window),
        (attention_sinks, "attention_sinks", attention_sinks),
    ):
        if given and (lsh or local):
            _checks.fail(
                name,
                "unset with block-local or LSH attention (they choose their own "
                "keys: attention_window / attention_options)",
                value,
            )
    if kwargs.get("quantize") and (norms is not None or attention_sinks):
        _checks.fail(
            "quantize",
            "False with query_norm, key_norm or attention_sinks (their int8 "
            "rounding is not modelled)",
            kwargs.get("quantize"),
        )


def check_temperature(value):
    """Llama 4's `{"floor_scale", "attn_scale"}` checked (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"floor_scale", "attn_scale"}:
        _checks.fail("query_temperature", "a dict of floor_scale and attn_scale", value)
    return {
        "floor_scale": _checks.positive_float("floor_scale", value["floor_scale"]),
        "attn_scale": _checks.positive_float("attn_scale", value["attn_scale"]),
    }
