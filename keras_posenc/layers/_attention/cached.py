"""Cached decoding for `RelativeMultiHeadAttention`: the full and rolling caches.

A mixin of the attention layer's decoding paths and their checks: new tokens'
keys and values written into a cache at `cache_update_index`, or into a
rolling cache of `sink_tokens` first slots and a ring of the last ones
(`ops.cache.rolling_positions`). A cache is the pair `[keys, values]`, each
heads-first `(B, N, S_max, H)` (`ops.cache`), or keras-hub's one
`(B, 2, S_max, N, H)` tensor (moved to the pair around the step and back:
the pair is the fast form).
"""

import functools
import numbers

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import dim, is_integer, rank
from keras_posenc.layers._rounding import rounder

#: The key cache's and the value cache's ranges (each int8 tensor its own).
CACHE_POINTS = ("cache_key", "cache_value")


class CachedDecoding:
    """The decoding paths of `RelativeMultiHeadAttention` (a mixin).

    It reads the layer's projections (`_project`, `_merge`), rotation
    (`_rotate`, `rotary`), bias (`position_bias`) and softmax
    (`_heads_attention`, `_weights`).
    """

    def _decode(self, query, cache, index, attention_mask=None, attention_bias=None):
        """Cached self-attention of new tokens `(B, T, D)` at `index`.

        Keys and values of the new tokens go into `cache` (rotated at their
        true positions first); the queries attend causally over the cache,
        with the position bias evaluated at positions `index + t` against
        the cached positions `0 .. S_max - 1`. Returns `(output, cache)`,
        the cache in the form it came in.
        A rotary type whose frequencies depend on the current length
        (`"dynamic"`, `"longrope"`) caches its keys before rotation and reads
        every cached key at the step's length `index + T`, as a recompute of
        the `index + T` tokens does (`_turned_logits`).
        """
        pair, restore = _as_pair(cache)
        length, max_length = dim(query, 1), dim(pair[0], 2)  # T, S_max
        q, k, v = self._project(query, query, query)  # (B, T, N, H)
        where = ops.position_range(length, index)  # (T,)
        late = self.rotary is not None and self._length_dependent()
        if self.rotary is not None and not late:
            q, k = self._rotate(
                q,
                k,
                query,
                query,
                positions=where,
                key_positions=where,
                max_length=max_length,
                rows=self._table_rows(length, index),
            )
        rounding = None
        if self.quantize_cache:  # each int8 cache's range, in and out
            r = rounder(self.rounding, None)
            rounding = tuple(functools.partial(r, point) for point in CACHE_POINTS)
        # The slots after the last new position get no weight: read up to it
        # (an overriding `compute_attention` gets every slot, as it always has).
        reach = None
        if not self._custom_attention:
            reach = ops.cache.read_reach(index, length, max_length)
        keys, values, pair = ops.cache.update_cache(
            pair, k, v, index, rounding, reach=reach
        )  # keys, values: (B, N, S, H)
        read = max_length if reach is None else reach  # S: S_max or the reach
        bias = None
        if self.position_bias is not None:
            bias = ops.cache.cached_bias(self.position_bias, query, read, index)
        if attention_bias is not None and reach is not None:
            attention_bias = attention_bias[..., :reach]
        bias = _plus(bias, attention_bias)  # (B or 1, N, T, S)
        mask = ops.cache.cache_mask(index, length, read, self.attention_window)
        mask = mask[None, None]  # (1, 1, T, S)
        if attention_mask is not None:
            if reach is not None:
                attention_mask = attention_mask[..., :reach]
            mask = xp.logical_and(mask, xp.cast(attention_mask, bool)[:, None])
        if late and ops.cache.is_static():  # an export: the cache stays untouched
            logits = self._turned_logits(q, keys, where, index + length)
            if self.contextual_position is not None:
                bias = _plus(bias, self.contextual_position(q, logits, mask))
            weights = self._weights(logits, bias, mask)
            context = ops.attention.cached_context(weights, values)
            return self._merge(context), restore(pair)
        if late:  # every key turned at the current length
            current = xp.cast(index + length, xp.float32)
            q, keys = self._rotate_cached(
                q, keys, query, where, ops.position_range(read), length=current
            )
        context = self._cached_attention(q, keys, values, bias, mask)
        return self._merge(context), restore(pair)

    def _rotate_cached(self, q, keys, query, where, key_positions, **rotation):
        """Queries `(B, T, N, H)` and cached keys `(B, N, S, H)`, rotated.

        The keys move heads-last for the rotation and back (the paths that
        turn cached keys: length-dependent rotary types outside an export,
        rolling caches with learned frequencies).
        """
        swap = ops.attention.swap_heads
        q, turned = self._rotate(
            q,
            swap(keys),
            query,
            query,
            positions=where,
            key_positions=key_positions,
            **rotation,
        )
        return q, swap(turned)

    def _cached_attention(self, q, keys, values, bias=None, mask=None):
        """Context `(B, T, N, Hv)` of heads-last queries over the cached heads.

        `cached_logits` / `cached_context` on the cache's own layout; a
        subclass overriding `compute_attention` gets heads-first tensors.
        One query in a plain graph outside an export takes the products'
        step forms and a written-out softmax.
        """
        swap = ops.attention.swap_heads
        if self._custom_attention:  # one key and value head per query head
            keys, values = (self._every_query_head(x, axis=1) for x in (keys, values))
            context, _ = self.compute_attention(swap(q), keys, values, bias, mask)
            return swap(context)
        r = rounder(self.rounding, None)
        step = (
            q.shape[1] == 1 and not ops.attention.in_xla() and not ops.cache.is_static()
        )
        logits = r("logits", ops.attention.cached_logits(q, keys, step))
        if self.contextual_position is not None:
            bias = _plus(bias, self.contextual_position(q, logits, mask))
        weights = self._weights(logits, bias, mask, None, step)
        return r("context", ops.attention.cached_context(weights, values, step))

    def _check_rolling(self, cache, sink_tokens):
        """A rolling cache's arguments and the layer's fitness for one."""
        if cache is None:
            _checks.fail("sink_tokens", "None without a cache", sink_tokens)
        slots = (cache[0] if isinstance(cache, (list, tuple)) else cache).shape[2]
        sink_tokens = _checks.positive_int("sink_tokens", sink_tokens, minimum=0)
        if slots is not None and sink_tokens >= slots:
            _checks.fail(
                "sink_tokens",
                f"fewer than the cache's {slots} slots (a window of at least one)",
                sink_tokens,
            )
        why = self.rolling_blocker()
        if why is not None:
            _checks.fail("sink_tokens", f"None for a layer with {why}", sink_tokens)

    def rolling_blocker(self):
        """Why this layer cannot decode through a rolling cache, or None."""
        for refused, why in (
            (
                self.quantize,
                "quantize=True (the int8 cache's rolling form is not built)",
            ),
            (
                self.attention_window is not None,
                "attention_window (the rolling cache is the window)",
            ),
            (
                self.contextual_position is not None,
                "contextual_position (CoPE counts keys in text order)",
            ),
            (
                self.rotary is not None and self._length_dependent(),
                "a rotary type whose frequencies read the text's length "
                "('dynamic', 'longrope')",
            ),
        ):
            if refused:
                return why
        return None

    def _decode_rolling(
        self, query, cache, index, sink_tokens, attention_mask=None, attention_bias=None
    ):
        """Cached self-attention over a rolling cache (`sink_tokens`).

        The new keys go into the cache unrotated, at their slot; every
        cached key is rotated (and the bias evaluated) at its position
        inside the cache when read (inside `ops.cache.static_decoding()`,
        rows of constant tables at those integer places). An export of a
        fixed rotation caches its keys rotated at their slots instead, and
        turns the queries (`_slot_rotation`). Returns `(output, cache)`.
        """
        pair, restore = _as_pair(cache)
        length, slots = dim(query, 1), pair[0].shape[2]
        q, k, v = self._project(query, query, query)  # (B, T, N, H)
        slot, q_pos, k_pos, mask = ops.cache.rolling_positions(
            index, length, sink_tokens, slots
        )
        rotary = self.rotary
        tabled = ops.cache.is_static() and rotary is not None
        tabled = tabled and rotary.position_only and not rotary.learned_frequencies
        if tabled:  # an export: keys cached rotated at their slot
            q, k = self._slot_rotation(q, k, slot, q_pos, slots, slots - sink_tokens)
        keys, values, pair = ops.cache.update_cache(pair, k, v, slot)
        bias = None
        if self.position_bias is not None:
            bias = ops.cache.rolling_bias(
                self.position_bias, query, slots, q_pos, k_pos
            )
        bias = _plus(bias, attention_bias)
        mask = mask[None, None]  # (1, 1, T, S_max)
        if attention_mask is not None:
            mask = xp.logical_and(mask, xp.cast(attention_mask, bool)[:, None])
        if tabled:
            logits = ops.attention.heads_first_logits(q, keys)  # (B, N, 3T, S)
            logits = ops.cache.pick_rolling_logits(logits, slot, sink_tokens)
            weights = self._weights(logits, bias, mask)
            context = ops.attention.cached_context(weights, values)
            return self._merge(context), restore(pair)
        if self.rotary is not None:  # exports gather rows of an (S, r/2) table
            q, keys = self._rotate_cached(
                q,
                keys,
                query,
                xp.cast(q_pos, xp.float32),
                xp.cast(k_pos, xp.float32),
                max_length=slots,
                rows=(q_pos, k_pos),
            )
        context = self._cached_attention(q, keys, values, bias, mask)
        return self._merge(context), restore(pair)

    def _slot_rotation(self, q, k, slot, q_pos, slots, window):
        """A rolling export's queries, heads-first `(B, N, 3T, H)`, and new keys.

        Each new key is rotated at its slot `j` (a row of a constant table),
        as a stopping step rotates at the position, and is never touched
        again. Rotations compose (`R_a q . R_j k = R_(a-j) q . k`), so a
        query in the ring's slot `c` sees a window key in slot `j <= c` at
        distance `c - j` and one in `j > c` (an older lap) at `c + W - j`:
        its age either way, the distance the Keras model reads from the
        keys' in-cache places; a sink `s` at `place - s`. Each query comes
        out rotated at its place, at `c` and at `c + W` (rows of a table of
        `S + W` positions; the keys' has `S`), and
        `ops.cache.pick_rolling_logits` reads each slot's logit from the
        right one: three one-row products a head instead of a rotation of
        every cached key, and no float op on positions.
        """
        length = dim(q, 1)
        c = xp.range(length) + slot  # (T,) int32: the queries' own slots
        rows = xp.concat([q_pos, c, c + window], axis=0)  # (3T,): kind-major
        k = self._rotate_rows(k, "key", c, slots)
        q = ops.attention.swap_heads(q)  # (B, N, T, H): a reshape for one token
        if length != 1 or not self._scale_in_rotation():  # no broadcast then
            q = xp.concat([q] * 3, axis=2)
        # One token's (B, N, 1, H) turned by (3, r) tables broadcasts to 3 rows.
        return self._rotate_rows(q, "query", rows, slots + window, True), k

    def _turned_logits(self, q, keys, where, current):
        """Logits `(B, N, T, S_max)` of unturned queries and cached keys `(B, N, S, H)`.

        The same numbers as turning both at the current length: rotations
        compose, `R_i q . R_j k = R_(i-j) q . k`, so each query is turned by
        its distance to every slot and the cached keys are only read. Inside
        an int8 export no rotation then touches the cache (a rotated cache
        would leave the converter's cache tensors float32).
        """
        slots = dim(keys, 2)
        offsets = where[:, None] - ops.position_range(slots)[None, :]  # (T, S)
        cos, sin = self.rotary.cos_sin(
            offsets[..., None], "query", xp.cast(current, xp.float32)
        )  # (T, S, r/2)
        scale = self.rotary.attention_factor  # the keys' factor, on this side
        if self._scale_in_rotation():
            scale = scale * self._query_scale
        cos, sin = cos * scale, sin * scale
        keys = self._every_query_head(keys, axis=1)  # grouped-query: repeated
        return ops.rotary.turned_logits(q, keys, cos, sin, self.rotary.interleaved)

    def _check_cache(
        self, query, cache, cache_update_index, sink_tokens=None, **call_arguments
    ):
        """Cached decoding is self-attention of new tokens at the cache's positions."""
        if cache_update_index is None:
            raise ValueError(
                "`cache_update_index` must be given with `cache` (the position of "
                "the first new token). Received: cache_update_index=None"
            )
        slots = _check_cache_shape(
            cache, self.num_key_value_heads, self.key_dim, self.value_dim
        )
        rolling = sink_tokens is not None  # positions past the slots roll over
        _check_cache_index(
            cache_update_index, query.shape[1], None if rolling else slots
        )
        cope = self.contextual_position
        if cope is not None and cope.bidirectional:
            raise ValueError(
                "`contextual_position` must count one way (bidirectional=False) "
                "with `cache`: a cached step has no keys after its query. "
                "Received: ContextualPosition(bidirectional=True)"
            )
        if not call_arguments["self_attention"]:
            raise ValueError(
                "`value` and `key` must be None with `cache`: cached decoding is "
                "self-attention of the new tokens. Received: a value or key tensor"
            )
        for name in ("positions", "key_positions"):
            if call_arguments[name] is not None:
                raise ValueError(
                    f"`{name}` must be None with `cache` (positions are "
                    f"cache_update_index + t). Received: a {name} tensor"
                )
        if call_arguments["return_attention_scores"]:
            raise ValueError(
                "`return_attention_scores` must be False with `cache`. "
                "Received: return_attention_scores=True"
            )

    def _round_cache(self, k, v, training=None):
        """Keys and values `(B, S, N, H)` on their caches' ranges (or as they are)."""
        if not self.quantize_cache:
            return k, v
        r = rounder(self.rounding, training)
        return tuple(r(point, x) for point, x in zip(CACHE_POINTS, (k, v)))


def _as_pair(cache):
    """`(pair, restore)`: the cache as `(keys, values)` heads-first, and the
    function giving an updated pair back in the form `cache` came in."""
    if isinstance(cache, (list, tuple)):
        return tuple(cache), type(cache)
    return ops.cache.from_stacked(cache), ops.cache.to_stacked


def _check_cache_shape(cache, num_heads, key_dim, value_dim):
    """The cache's slot count S_max (None if unknown), its shapes checked."""
    if isinstance(cache, (list, tuple)):
        sizes = (key_dim, value_dim or key_dim)
        if len(cache) != 2 or not all(xp.is_tensor(c) for c in cache):
            _checks.fail(
                "cache",
                "a [keys, values] pair of tensors (or one (B, 2, S_max, N, H) tensor)",
                f"{type(cache).__name__} of {len(cache)}",
            )
        for name, tensor, size in zip(("keys", "values"), cache, sizes):
            expected = (num_heads, None, size)
            if rank(tensor) != 4 or any(
                want not in (None, got) for want, got in zip(expected, tensor.shape[1:])
            ):
                raise ValueError(
                    f"`cache` {name} must have shape (B, {num_heads}, S_max, {size}). "
                    f"Received: shape={tensor.shape}"
                )
        s_k, s_v = cache[0].shape[2], cache[1].shape[2]
        if None not in (s_k, s_v) and s_k != s_v:
            raise ValueError(
                "`cache` keys and values must have the same S_max. Received: "
                f"{s_k} and {s_v}"
            )
        return s_k
    expected = (2, None, num_heads, key_dim)
    if rank(cache) != 5 or any(
        want not in (None, got) for want, got in zip(expected, cache.shape[1:])
    ):
        raise ValueError(
            f"`cache` must have shape (B, 2, S_max, {num_heads}, {key_dim}) or be "
            f"a [keys, values] pair. Received: cache.shape={cache.shape}"
        )
    if value_dim not in (None, key_dim):
        raise ValueError(
            "`value_dim` must equal key_dim to keep keys and values in one cache "
            f"(or pass a [keys, values] pair). Received: value_dim={value_dim}, "
            f"key_dim={key_dim}"
        )
    return cache.shape[2]


def _plus(bias, attention_bias):
    """The float32 sum of two optional biases (None when both are None)."""
    if attention_bias is None:
        return bias
    extra = xp.cast(attention_bias, xp.float32)
    return extra if bias is None else bias + extra


def _check_cache_index(index, length, max_length):
    """`cache_update_index` is an integer whose T new tokens fit the cache.

    Checked wherever its value is known (Python and NumPy integers, eager and
    constant tensors); a traced index cannot be read before it runs.
    """
    if isinstance(index, bool) or not (
        isinstance(index, numbers.Integral)
        or (xp.is_tensor(index) and is_integer(index))
    ):
        raise TypeError(
            "`cache_update_index` must be an integer or an integer scalar tensor. "
            f"Received: cache_update_index={index!r}"
        )
    value = xp.get_static_value(index)
    if value is None or length is None or max_length is None:
        return
    if not 0 <= int(value) <= max_length - length:
        raise ValueError(
            f"`cache_update_index` must be in [0, S_max - T] = [0, "
            f"{max_length - length}] so the {length} new tokens fit the "
            f"{max_length} cache slots. Received: cache_update_index={int(value)}"
        )
