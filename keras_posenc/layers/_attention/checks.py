"""Argument and call checks of `RelativeMultiHeadAttention`, before any work.

`check_arguments` validates the constructor's arguments, each in its one
form; `AttentionChecks._check_call` refuses calls
the layer cannot honour (`docs/attention.md` is the table of which path takes
which argument).
"""

import tensorflow as tf

from keras_posenc import _checks
from keras_posenc._compat import optional_layer, rank
from keras_posenc.layers import _rope_checks
from keras_posenc.layers._attention.lsh import (
    LSH_OPTIONS,
    check_attention_options,
    check_lsh,
)
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.ops import quantization

#: The constructor arguments `check_arguments` checks, in order.
ARGUMENTS = (
    "num_heads",
    "key_dim",
    "value_dim",
    "output_dim",
    "dropout",
    "use_bias",
    "position_bias",
    "rotary",
    "quantize",
    "contextual_position",
    "attention_window",
    "num_key_value_heads",
    "attention_options",
    "kernel_bits",
)
#: What `attention_options` holds: the LSH concern, its type and its hashing.
ATTENTION_KEYS = ("attention_type", *LSH_OPTIONS)
#: The attention options, as attributes of the layer.
LSH_FIELDS = ("attention_type", *LSH_OPTIONS)


def check_arguments(overrides_attention, arguments):
    """`{name: checked value}` of the layer's `ARGUMENTS`, and the LSH options
    as attributes (`attention_type`, `num_hashes`, `bucket_size`,
    `hash_seed`). `overrides_attention`: the class overrides
    `compute_attention`; `arguments`: `{name: value}` of the constructor's
    `ARGUMENTS`."""
    given = {name: arguments[name] for name in ARGUMENTS}
    checked = {
        "num_heads": _checks.positive_int("num_heads", given["num_heads"]),
        "key_dim": _checks.positive_int("key_dim", given["key_dim"]),
        "dropout": _checks.rate("dropout", given["dropout"]),
        "use_bias": _checks.boolean("use_bias", given["use_bias"]),
    }
    for name in ("value_dim", "output_dim", "attention_window"):
        checked[name] = _checks.positive_int(name, given[name], allow_none=True)
    checked["kernel_bits"] = quantization.check_kernel_bits(given["kernel_bits"])
    heads = checked["num_heads"]
    checked.update(_checked_layers(given, heads, checked["key_dim"]))
    position_bias, quantize = checked["position_bias"], checked["quantize"]
    contextual_position = checked["contextual_position"]
    options = lsh_options(given["attention_options"])
    lsh = check_lsh(
        options.get("attention_type", "dense"),
        dict(
            **check_attention_options(
                options.get("attention_type", "dense"),
                {k: options[k] for k in LSH_OPTIONS if k in options} or None,
            ),
            attention_window=checked["attention_window"],
            quantize=quantize,
            contextual_position=contextual_position,
        ),
        overrides_attention,
    )
    attention_type, num_hashes, bucket_size, hash_seed = lsh
    check_logit_reader(position_bias, quantize, attention_type, overrides_attention)
    if attention_type == "lsh":  # the hashing in force, written out
        options.update(
            num_hashes=num_hashes, bucket_size=bucket_size, hash_seed=hash_seed
        )
    checked.update(
        num_key_value_heads=check_key_value_heads(
            given["num_key_value_heads"], heads, attention_type
        ),
        attention_options=options or None,
        attention_type=attention_type,
        num_hashes=num_hashes,
        bucket_size=bucket_size,
        hash_seed=hash_seed,
    )
    return checked


def _checked_layers(given, heads, key_dim):
    """The checked `position_bias`, `rotary`, `quantize` and
    `contextual_position` of the constructor's `given` arguments."""
    position_bias = optional_layer("position_bias", given["position_bias"])
    check_heads("position_bias", position_bias, heads)
    rotary = optional_layer("rotary", given["rotary"], RotaryEmbedding)
    quantize = given["quantize"]
    if quantize not in (False, True, "cache"):
        _checks.fail("quantize", "False, True or 'cache'", quantize)
    _checks.rounds_on_tensorflow("quantize", quantize)
    if quantize and rotary is not None:
        _rope_checks.check_quantized_rotary(rotary, key_dim)
    contextual_position = optional_layer(
        "contextual_position", given["contextual_position"], ContextualPosition
    )
    if contextual_position is not None and quantize:
        _checks.fail(
            "contextual_position",
            "None with `quantize=True` (it counts over the logits in float)",
            contextual_position,
        )
    return dict(
        position_bias=position_bias,
        rotary=rotary,
        quantize=quantize,
        contextual_position=contextual_position,
    )


def lsh_options(attention_options):
    """`attention_options` as a new dict of `ATTENTION_KEYS`, or the error."""
    if attention_options is not None and not isinstance(attention_options, dict):
        _checks.fail(
            "attention_options", "a dict or None", attention_options, error=TypeError
        )
    options = dict(attention_options or {})
    unknown = sorted(set(options) - set(ATTENTION_KEYS))
    if unknown:
        _checks.fail(
            "attention_options",
            f"a dict of {', '.join(ATTENTION_KEYS)} (the LSH concern)",
            attention_options,
            fix=f"Unknown keys: {unknown}; attention_window and "
            "num_key_value_heads are keywords of their own",
        )
    return options


def check_logit_reader(position_bias, quantize, attention_type, overrides_attention):
    """A producer that reads the logits (`DataAdaptiveBias`) needs the paths
    where the layer meets its logits with the bias in `_weights`."""
    if not getattr(position_bias, "reads_logits", False):
        return
    for refused, expectation in (
        (quantize, "quantize=False (its MLP's int8 rounding is not modelled)"),
        (
            attention_type == "lsh",
            "attention_type='dense' (LSH attention scores its chunks' pairs "
            "head by head, never all heads of a pair together)",
        ),
        (
            overrides_attention,
            "a layer that keeps compute_attention (an override would skip "
            "the MLP over the logits)",
        ),
    ):
        if refused:
            _checks.fail(
                "position_bias",
                f"a producer that does not read the logits with {expectation}",
                f"{type(position_bias).__name__}",
            )


def check_key_value_heads(num_key_value_heads, num_heads, attention_type="dense"):
    """The key and value heads (`num_heads` when None): a divisor of `num_heads`.

    Grouped-query attention (keras-hub's and HF's `num_key_value_heads`):
    query head n reads key and value head `n // (num_heads / kv_heads)`.
    """
    if num_key_value_heads is None:
        return num_heads
    kv_heads = _checks.positive_int("num_key_value_heads", num_key_value_heads)
    if num_heads % kv_heads:
        _checks.fail(
            "num_key_value_heads",
            f"a divisor of num_heads={num_heads}",
            num_key_value_heads,
        )
    if kv_heads != num_heads and attention_type == "lsh":
        _checks.fail(
            "num_key_value_heads",
            f"None or num_heads={num_heads} with attention_type='lsh' (its "
            "keys are the queries' own heads)",
            num_key_value_heads,
        )
    return kv_heads


class AttentionChecks:
    """The call checks of `RelativeMultiHeadAttention` (a mixin)."""

    def _check_call(self, query, key, value, **call_arguments):
        """Errors for calls the layer cannot honour, before any work."""
        window = self.attention_window
        for name, tensor in (("query", query), ("value", value), ("key", key)):
            if rank(tensor) not in (None, 3):
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
        reads_logits = getattr(self.position_bias, "reads_logits", False)
        if reads_logits and call_arguments["attention_bias"] is not None:
            _checks.fail(
                "attention_bias",
                "None for an attention whose position_bias reads the logits "
                f"({type(self.position_bias).__name__}: its MLP would read the "
                "extra bias as position)",
                "an attention_bias tensor",
            )
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
        check_band_bias(call_arguments["attention_bias"], t, window, self.num_heads)


def check_band_bias(bias, length, window, num_heads):
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


def check_heads(name, producer, num_heads):
    """A bias producer must make one bias per attention head."""
    heads = getattr(producer, "num_heads", num_heads)
    if heads != num_heads:
        _checks.fail(
            name,
            f"a producer of num_heads={num_heads} heads",
            f"{type(producer).__name__}(num_heads={heads})",
        )
