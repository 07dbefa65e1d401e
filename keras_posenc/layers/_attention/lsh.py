"""LSH attention of `RelativeMultiHeadAttention` (`{"attention_type": "lsh"}`).

A mixin: shared query-key heads hashed into buckets, sorted, attended in
chunks (`ops.lsh`), with the position bias of every (query, key) pair the
chunks score, at their true positions.
"""

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import dim

#: `attention_type` values: dense (or block-local with `attention_window`), LSH.
ATTENTION_TYPES = ("dense", "lsh")
#: LSH attention's options (`attention_options`) and their defaults.
LSH_OPTIONS = {"num_hashes": 2, "bucket_size": 64, "hash_seed": 0}
#: Call arguments LSH attention cannot honour (it builds its own chunks).
_REFUSED = ("attention_mask", "attention_bias", "positions", "key_positions")


def check_attention_options(attention_type, options):
    """`LSH_OPTIONS` updated by `options` (None or a dict of its keys), the
    one home of LSH's options for the layer and the builders alike."""
    _checks.choice("attention_type", attention_type, ATTENTION_TYPES)
    if options is None:
        return dict(LSH_OPTIONS)
    if not isinstance(options, dict):
        raise TypeError(
            f"`attention_options` must be a dict or None. Received: {options!r}"
        )
    unknown = sorted(set(options) - set(LSH_OPTIONS))
    if unknown:
        _checks.fail(
            "attention_options",
            f"a dict of {', '.join(LSH_OPTIONS)}",
            options,
            fix=f"Unknown keys: {unknown}",
        )
    if attention_type != "lsh":
        _checks.fail(
            "attention_options", f"None with attention_type={attention_type!r}", options
        )
    return {**LSH_OPTIONS, **options}


def check_lsh(attention_type, options, overrides_attention=False):
    """Checked `(attention_type, num_hashes, bucket_size, hash_seed)`.

    `options` holds the constructor's `num_hashes`, `bucket_size`,
    `hash_seed`, `attention_window`, `quantize` and `contextual_position`;
    `overrides_attention` says whether the layer's class overrides
    `compute_attention` (which LSH attention would not call).
    """
    attention_type = _checks.choice("attention_type", attention_type, ATTENTION_TYPES)
    num_hashes = _checks.positive_int("num_hashes", options["num_hashes"])
    bucket_size = _checks.positive_int("bucket_size", options["bucket_size"])
    seed = options["hash_seed"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"`hash_seed` must be an int. Received: hash_seed={seed!r}")
    if attention_type != "lsh":
        return attention_type, num_hashes, bucket_size, seed
    for name, off in (
        ("attention_window", None),
        ("quantize", False),
        ("contextual_position", None),
    ):
        if options[name] not in (None, False):
            _checks.fail(
                name,
                f"{off} with attention_type='lsh' (LSH attention sorts its own "
                "chunks: no band, no int8 rounding model, no dense logits to count)",
                options[name],
            )
    if overrides_attention:
        _checks.fail(
            "attention_type",
            "'dense' for a subclass that overrides compute_attention (LSH "
            "attention combines its hashing rounds itself)",
            attention_type,
        )
    return attention_type, num_hashes, bucket_size, seed


class LSHAttention:
    """The LSH path of `RelativeMultiHeadAttention` (a mixin).

    It reads the layer's `num_hashes`, `bucket_size`, `hash_seed`,
    `position_bias` and dropout.
    """

    def _check_lsh_call(self, query, key, call_arguments):
        """Errors for calls LSH attention cannot honour, before any work."""
        t, s = query.shape[1], key.shape[1]
        if t is not None and s is not None and t != s:
            _checks.fail(
                "key",
                "as long as the query with attention_type='lsh' (self-attention: "
                "the keys are the queries' projection)",
                f"key.shape={key.shape} for query.shape={query.shape}",
            )
        if call_arguments["return_attention_scores"]:
            _checks.fail(
                "return_attention_scores",
                "False with attention_type='lsh' (it never builds the (T, S) weights)",
                True,
            )
        if call_arguments["segment_ids"] is not None:
            _checks.fail(
                "segment_ids",
                "None with attention_type='lsh' (a packed row's documents share "
                "the hashing and the sorted chunks, so one document's output "
                "would depend on the others)",
                "a segment_ids tensor",
                fix="Train LSH attention on one document per row",
            )
        for name in _REFUSED + ("cache",):
            if call_arguments[name] is not None:
                _checks.fail(
                    name,
                    "None with attention_type='lsh' (it sorts its own chunks; a "
                    "query's chunk depends on the buckets of every token, later "
                    "ones too, so it has no cached decoding)",
                    f"a {name}",
                )

    def _lsh_context(self, inputs, heads, key_mask, causal, training, start):
        """Context `(B, N, T, Hv)` of heads-first `(q, k, v)` by `ops.lsh`."""
        q, k, v = heads
        pair_bias = None
        if self.position_bias is not None:

            def pair_bias(q_index, k_index):
                return self._pair_bias(inputs, q_index, k_index, start)

        return ops.lsh.lsh_attention(
            q,
            k,
            v,
            self.num_hashes,
            self.bucket_size,
            self.hash_seed,
            key_mask=key_mask,
            causal=causal,
            pair_bias=pair_bias,
            dropout=lambda weights: self._dropout_layer(weights, training=training),
        )

    def _pair_bias(self, inputs, q_index, k_index, start):
        """Float32 bias `(B, N, R, nc, C, 2C)` of the scored pairs.

        A producer that reads `j - i` alone is evaluated once on the
        `2T - 1` distances and gathered per head; any other is called per
        head at the pairs' true positions, one `(B R nc, N, C, 2C)` bias of
        which it keeps its head.
        """
        producer, length = self.position_bias, dim(inputs[0], 1)
        if getattr(producer, "translation_invariant", False):
            stubs = (xp.zeros([1, 1, 1]), xp.zeros([1, 2 * length - 1, 1]))
            row = producer(*stubs, start_index=length - 1)  # (1, N, 1, 2T - 1)
            row = xp.cast(row, xp.float32)[0, :, 0]  # (N, 2T - 1)
            distance = k_index[..., None, :] - q_index[..., :, None] + length - 1
            per_head = xp.transpose(distance, [1, 0, 2, 3, 4, 5])
            bias = xp.gather(row, per_head, batch_dims=1)  # (N, B, R, nc, C, 2C)
            return xp.transpose(bias, [1, 0, 2, 3, 4, 5])
        heads = []
        for head in range(self.num_heads):
            at = [x[:, head] for x in (q_index, k_index)]  # (B, R, nc, C | 2C)
            at = [x + xp.cast(start, x.dtype) for x in at]
            flat = [xp.reshape(x, [-1, x.shape[-1]]) for x in at]
            bias = producer(*inputs, positions=flat[0], key_positions=flat[1])
            bias = xp.cast(bias, xp.float32)[:, head]  # (B R nc, C, 2C)
            heads.append(xp.reshape(bias, xp.concat([xp.shape(at[0]), [-1]], 0)))
        return xp.stack(heads, axis=1)
