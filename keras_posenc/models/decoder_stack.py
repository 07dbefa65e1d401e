"""The description-built stack: `block_options` and per-layer positions.

A layer is its parts: a norm, a `DecoderAttention` with its position
producer (the method's bias, rotation or CoPE, or none on a NoPE layer), a
norm and a `FeedForward`, arranged pre- or post-norm (`BlockOptions`); a
model is the list of its layer types (`"full"` / `"sliding"`), each type
with its own rotary parameters (`layer_rope`). `CausalLM(block_options=...)`
builds it; its interface is `TransformerStack`'s (forward with or without a
cache, cache shapes, the streaming check), so generation, scoring and every
export read either.
"""

import math
import types

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc.layers.decoder_attention import DecoderAttention
from keras_posenc.layers.feed_forward import FeedForward
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.rms_norm import RMSNorm
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.segment_positions import SegmentPositions
from keras_posenc.models.blocks import (
    LAYER_TYPES,
    check_block_options,
)
from keras_posenc.models.methods import METHODS
from keras_posenc.models.options import DEFAULT_MAX_LENGTH, checked_options
from keras_posenc.models.stack import TransformerStack, _add, _method_parts, _plus

#: Why a method has no decoder-block form yet, by method (refused by name).
UNBLOCKED = {
    name: why
    for name, method in METHODS.items()
    for why in [
        "its position generator network feeds the post-norm stack"
        if method.generator
        else "its recursive blocks are layers of their own"
        if method.recursive
        else "its joint input is read by the first post-norm attention"
        if method.combined_input
        else "its gated fusion is built for the post-norm stack"
        if method.input_positions == "gated"
        else "its forgetting gate's cache state is the post-norm stack's"
        if method.forgetting_gate
        else None
    ]
    if why
}


class DecoderStack(TransformerStack):
    """The layers of a decoder described by `block_options`.

    Args:
        position: str, a key of `METHODS` (not one of `UNBLOCKED`).
        hidden_dim, num_layers, num_heads, dropout: as `TransformerStack`'s.
        position_options: dict or None, the method's options, `max_length`,
            `nope_layers` (layers without positions) and `layer_rope` (each
            layer type's rotary options over the shared ones).
        block_options: dict, the keys of `BlockOptions`.
        attention_window: int or None, block-local attention's W.
        num_key_value_heads: int or None, grouped-query attention's heads.
    """

    def __init__(
        self,
        position,
        hidden_dim,
        num_layers,
        num_heads,
        dropout=0.0,
        position_options=None,
        block_options=None,
        attention_window=None,
        num_key_value_heads=None,
    ):
        given = _check_decoder(
            position,
            (hidden_dim, num_layers, num_heads, dropout),
            position_options,
            block_options,
            (attention_window, num_key_value_heads),
        )
        self.method, self.causal, self.num_layers = given.method, True, given.layers
        self.max_length, self.options = given.max_length, given.block
        self.absolute = given.method.input_layers(given.parts, given.max_length, True)
        self.combined = self.hpn = self.shared_bias = None
        self.sums = {}
        self.gates = [None] * given.layers
        self.embedding_norm = None
        if given.block.embedding_norm:
            self.embedding_norm = _norm(given.block, "embedding_norm")
        self.blocks, self.norms, self.ffn = [], [], []
        for index in range(given.layers):  # each layer's parts in turn
            self.norms.append(_norm(given.block, f"attention_norm_{index}"))
            self.blocks.append(_attention(given, index))
            self.norms.append(_norm(given.block, f"ffn_norm_{index}"))
            self.ffn.append(_feed_forward(given, index))
            if given.block.post_norms:
                self.norms.append(_norm(given.block, f"post_attention_norm_{index}"))
                self.norms.append(_norm(given.block, f"post_ffn_norm_{index}"))
        self.final_norm = None
        if given.block.final_norm:
            self.final_norm = _norm(given.block, "final_norm")
        self.segment_positions = SegmentPositions(name="segment_positions")

    def forward(
        self, x, cache=None, index=0, training=None, sink_tokens=None, segment_ids=None
    ):
        """The stack's output `(B, T, D)`, as `TransformerStack.forward`'s."""
        decoding = cache is not None
        run = types.SimpleNamespace(
            decoding=decoding,
            index=index,
            training=training,
            sink_tokens=sink_tokens,
            packed={} if segment_ids is None else {"segment_ids": segment_ids},
            slots=iter(cache or ()),
            updated=[],
        )
        if self.options.scale_embeddings:  # HF casts sqrt(D) to the dtype
            x = x * xp.cast(math.sqrt(x.shape[-1]), x.dtype)
        if self.absolute is not None:
            positions = None
            if segment_ids is not None:
                positions = self.segment_positions(segment_ids)
            encoding = self._positions(
                x, self._encode_input, cache, index, positions, segment_ids
            )
            x = _plus(x, encoding) if decoding else _add(x, encoding)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        per_layer = 4 if self.options.post_norms else 2
        for i, block in enumerate(self.blocks):
            norms = self.norms[per_layer * i : per_layer * (i + 1)]
            x = self._layer(x, block, self.ffn[i], norms, run)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, run.updated) if decoding else x

    def _layer(self, x, attention, ffn, norms, run):
        """One layer: attention then feed-forward, each with its norms."""
        first, post = self.options.norm_first, self.options.post_norms
        attention_norm, ffn_norm = norms[:2]

        def residual(x, f, norm, post_norm):
            h = norm(x) if first else x
            out = f(h)
            if post:
                out = post_norm(out)
            summed = _plus(x, out) if run.decoding else _add(x, out)
            return summed if first else norm(summed)

        post_attention, post_ffn = norms[2:] if post else (None, None)
        x = residual(
            x, lambda h: self._attend(attention, h, run), attention_norm, post_attention
        )
        return residual(x, lambda h: ffn(h, training=run.training), ffn_norm, post_ffn)

    def _attend(self, attention, h, run):
        """The attention's output on `h` (decoding: its keys and values)."""
        if not run.decoding:
            return attention(
                h, use_causal_mask=True, training=run.training, **run.packed
            )
        extra = {} if run.sink_tokens is None else {"sink_tokens": run.sink_tokens}
        pair = [next(run.slots), next(run.slots)]
        out, pair = attention(h, cache=pair, cache_update_index=run.index, **extra)
        run.updated.extend(pair)
        return out


def _norm(options, name):
    if options.norm == "rms":
        return RMSNorm(options.norm_epsilon, options.norm_unit_offset, name=name)
    return LayerNorm(options.norm_epsilon, name=name)


def _attention(given, index):
    """Layer `index`'s `DecoderAttention` with its position producer."""
    block, method, parts = given.block, given.method, given.parts
    heads, width = given.heads, given.width
    kind = block.layer_types[index]
    nope = index in given.nope_layers
    rotary = None
    if method.rotary is not None and not nope:
        options = dict(
            method.rotary, **parts["rotary"], **given.layer_rope.get(kind, {})
        )
        rotary = RotaryEmbedding(name=f"rotary_{index}", **options)
    bias = None if nope else method.bias_layer(heads, index, None, parts)
    norms = {}
    if block.qk_norm:
        for side in ("query", "key"):
            norms[f"{side}_norm"] = RMSNorm(
                block.qk_norm_epsilon or block.norm_epsilon,
                block.norm_unit_offset,
                name=f"{side}_norm_{index}",
            )
    return DecoderAttention(
        heads,
        block.head_dim,
        output_dim=width,
        dropout=given.dropout,
        use_bias=block.use_bias,
        qkv_bias=block.qkv_bias,
        position_bias=bias,
        rotary=rotary,
        contextual_position=None if nope else method.contextual_layer(index, parts),
        attention_window=given.window,
        num_key_value_heads=given.kv_heads,
        query_scale=block.query_scale,
        sliding_window=block.sliding_window if kind == "sliding" else None,
        attention_sinks=block.attention_sinks,
        query_temperature=block.nope_temperature if nope else None,
        name=f"attention_{index}",
        **norms,
    )


def _feed_forward(given, index):
    block = given.block
    return FeedForward(
        block.intermediate_dim,
        given.width,
        activation=block.activation,
        gated=block.gated,
        use_bias=block.use_bias,
        dropout=given.dropout,
        name=f"ffn_{index}",
    )


def _check_decoder(position, sizes, position_options, block_options, attention):
    """Every argument of `DecoderStack`, checked once, as a namespace."""
    position_options, _ = checked_options(position_options, None)
    position = _checks.choice("position", position, tuple(METHODS))
    if position in UNBLOCKED:
        _checks.fail(
            "position",
            f"a method other than {sorted(UNBLOCKED)} with block_options "
            f"({position!r}: {UNBLOCKED[position]})",
            position,
        )
    hidden_dim, num_layers, num_heads, dropout = sizes
    given = types.SimpleNamespace(method=METHODS[position], causal=True)
    given.width = _checks.positive_int("hidden_dim", hidden_dim)
    given.layers = _checks.positive_int("num_layers", num_layers)
    given.heads = _checks.positive_int("num_heads", num_heads)
    given.dropout = _checks.rate("dropout", dropout)
    given.block = check_block_options(
        {} if block_options is None else block_options,
        given.width,
        given.heads,
        given.layers,
    )
    max_length = position_options.pop("max_length", DEFAULT_MAX_LENGTH)
    given.max_length = _checks.positive_int("max_length", max_length)
    for key in ("grid_shape", "share_position_bias"):
        if position_options.get(key) not in (None, False):
            _checks.fail(
                key,
                "unset with block_options (1-D positions, one bias per layer)",
                position_options[key],
            )
        position_options.pop(key, None)
    given.nope_layers = _nope_layers(position_options.pop("nope_layers", ()), given)
    given.layer_rope = _layer_rope(position_options.pop("layer_rope", None), given)
    window, kv_heads = attention
    given.window = _checks.positive_int("attention_window", window, True)
    given.kv_heads = _check_kv_heads(kv_heads, given.heads)
    given.quantize = False
    given.parts = _method_parts(given, position, position_options or None)
    return given


def _nope_layers(value, given):
    """The checked layer indices without positions, a frozenset."""
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < given.layers
        for i in value
    ):
        _checks.fail(
            "nope_layers",
            f"a list of layer indices in [0, {given.layers})",
            value,
        )
    return frozenset(value)


def _layer_rope(value, given):
    """`{layer type: rotary options}` checked (rotary methods only)."""
    if value is None:
        return {}
    if given.method.rotary is None:
        _checks.fail(
            "layer_rope",
            "unset unless position is a rotary method ('rope', 'xpos')",
            value,
        )
    if not isinstance(value, dict) or not set(value) <= set(LAYER_TYPES):
        _checks.fail(
            "layer_rope",
            f"a dict keyed by layer types {list(LAYER_TYPES)} of rotary options",
            value,
        )
    for kind, options in value.items():
        if not isinstance(options, dict):
            _checks.fail(f"layer_rope[{kind!r}]", "a dict of rotary options", options)
        RotaryEmbedding(**options)  # each type's options checked by the layer
    return {kind: dict(options) for kind, options in value.items()}


def _check_kv_heads(kv_heads, heads):
    kv_heads = _checks.positive_int("num_key_value_heads", kv_heads, True)
    if kv_heads is not None and heads % kv_heads:
        _checks.fail("num_key_value_heads", f"a divisor of num_heads={heads}", kv_heads)
    return kv_heads
