"""The one assembly: a `METHODS` row becomes the layers of a Transformer stack.

`TransformerStack` owns every layer between the token (or feature) embedding
and the output head: the method's absolute encoding, the embedding norm, a
position generator network, the shared or per-layer bias producers, the
attention (or recursive) blocks and the feed-forward blocks. The encoder
builders run it bidirectionally on whole sequences; `CausalLM` runs it
causally, on whole sequences (training) or on new tokens against caches
(decoding), so the training graph and the decoding step share one definition.
"""

import functools
import types

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import keras, rank
from keras_posenc.layers.combined_position_input import CombinedPositionInput
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.quantized_add import QuantizedAdd
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_multi_head_attention import (
    ATTENTION_TYPES,
    RelativeMultiHeadAttention,
    check_attention_options,
    check_key_value_heads,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.segment_positions import SegmentPositions
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.models.methods import (
    DIRECTED_BIASES,
    LSH_METHODS,
    METHODS,
    QUANTIZED_METHODS,
    SHARED_BIAS_METHODS,
)
from keras_posenc.models.options import DEFAULT_MAX_LENGTH, checked_options
from keras_posenc.ops import quantization


class TransformerStack:
    """The layers of a Transformer stack with one position method.

    Every argument is checked here, once, for the encoder builders and the
    causal LM alike (`ValueError`/`TypeError` naming the argument).

    Args:
        position: str, a key of `METHODS`.
        hidden_dim: int, the width D (divisible by `num_heads`).
        num_layers: int, the number of blocks L.
        num_heads: int, the attention heads N.
        dropout: float, every dropout rate of the stack.
        position_options: dict or None, as `build_encoder` takes it (the
            method's options, `max_length`, `grid_shape`,
            `share_position_bias`).
        attention_options: dict or None, the LSH concern as the attention
            takes it (`attention_type`, LSH's hashing).
        causal: bool, no position reads a later one (decoders).
        quantize: bool, every layer fake-quantizes what int8 TFLite rounds
            (quantization-aware training), caches too in a causal stack. For
            `QUANTIZED_METHODS`, dense or block-local.
        attention_window: int or None, block-local attention's W.
        num_key_value_heads: int or None, grouped-query attention's heads.
        kernel_bits: int, with `quantize`, every kernel's grid: 8, or 4 (an
            int4 LM's).
    """

    def __init__(
        self,
        position,
        hidden_dim,
        num_layers,
        num_heads,
        dropout=0.0,
        position_options=None,
        attention_options=None,
        causal=False,
        quantize=False,
        attention_window=None,
        num_key_value_heads=None,
        kernel_bits=8,
    ):
        given = _check_stack(
            position,
            (hidden_dim, num_layers, num_heads, dropout),
            position_options,
            attention_options,
            dict(
                causal=causal,
                quantize=quantize,
                attention_window=attention_window,
                num_key_value_heads=num_key_value_heads,
                kernel_bits=kernel_bits,
            ),
        )
        method, parts = given.method, given.parts
        self.method, self.causal, self.num_layers = method, causal, given.layers
        self.max_length = given.max_length
        self.absolute = method.input_layers(parts, given.max_length, causal)
        self.combined = _combined_input(given)
        rounding = {"quantize": True} if given.quantize else {}
        self.embedding_norm = LayerNorm(name="embedding_norm", **rounding)
        self.first = min(method.generator_from, given.layers - 1)  # first layer fed
        self.hpn = _generator(given, self.first)
        self.shared_bias = None  # one producer for every attention, or None
        if given.share_position_bias:
            heads, grid = given.heads, given.grid_shape
            self.shared_bias = method.bias_layer(heads, "shared", grid, parts)
        self.gates = [
            method.gate_layer(given.heads, i, parts) for i in range(given.layers)
        ]
        self.blocks, self.norms, self.ffn = self._layer_blocks(given)
        self.segment_positions = SegmentPositions(name="segment_positions")
        self.sums = _residual_sums(given)  # quantize: one rounding layer a sum

    def _layer_blocks(self, given):
        """Every layer's attention (or recursive) block, its norm and its
        feed-forward block, made layer by layer (unseeded initializers draw
        their seeds when made: the order is the weights')."""
        method, parts, heads, width = (
            given.method,
            given.parts,
            given.heads,
            given.width,
        )
        blocks, norms, ffn = [], [], []
        for index in range(given.layers):
            if method.recursive:
                blocks.append(_recursive_block(given, index))
                ffn.append(_feed_forward(given, index))
                continue
            bias = None
            if self.shared_bias is None:
                bias = method.bias_layer(heads, index, given.grid_shape, parts)
            rounding = {}
            if given.quantize:
                rounding = {
                    "quantize": "cache" if given.causal else True,
                    "kernel_bits": given.kernel_bits,
                }
            blocks.append(
                RelativeMultiHeadAttention(
                    heads,
                    width // heads,
                    output_dim=width,
                    dropout=given.dropout,
                    position_bias=bias,
                    rotary=method.rotary_layer(index, given.grid_shape, parts),
                    contextual_position=method.contextual_layer(index, parts),
                    attention_window=given.window,
                    num_key_value_heads=given.kv_heads,
                    attention_options=given.lsh,
                    name=f"attention_{index}",
                    **rounding,
                )
            )
            rounding = {"quantize": True} if given.quantize else {}
            norms.append(LayerNorm(name=f"attention_norm_{index}", **rounding))
            ffn.append(_feed_forward(given, index))
        return blocks, norms, ffn

    def conv_state(self, index):
        """Whether layer `index` keeps a causal-convolution state in the cache."""
        return (
            self.causal
            and self.hpn is not None
            and index >= self.first
            and self.hpn.position_features == "conv"
            and self.hpn.kernel_size > 1
        )

    def streaming_blocker(self):
        """Why the stack cannot decode through a rolling cache, or None.

        A rolling cache keeps positions inside the cache, which only
        positions that live in the attention can read (biases, rotations);
        the embedding's absolute encodings, the position generators, the
        recursive block's position stream, gated fusion, a shared bias and
        CoPE's counts are not built for it. The forgetting gate keeps each
        slot's log-gate and sums them in cache order
        (`ForgettingGate.rolling_step`).
        """
        parts = (
            (
                self.absolute is not None or self.combined is not None,
                "an absolute position encoding of the tokens (its positions are "
                "the text's)",
            ),
            (self.hpn is not None, "a position generator network"),
            (self.method.recursive, "the recursive position stream"),
            (self.shared_bias is not None, "share_position_bias=True"),
            (bool(self.sums), "quantize=True"),
        )
        for blocked, why in parts:
            if blocked:
                return why
        for block in self.blocks:  # each attention's own reasons
            why = block.rolling_blocker()
            if why is not None:
                return why
        return None

    def cache_shapes(self, batch_size, max_length):
        """The shapes of the cache tensors, in the order `forward` reads them."""
        return [shape for _, shape in self._caches(batch_size, max_length)]

    def cache_kinds(self):
        """What each cache tensor holds: `"keys"`, `"values"`,
        `"convolution inputs"` or `"gate sums"`, in `cache_shapes`' order."""
        return [kind for kind, _ in self._caches(None, None)]

    def _caches(self, batch_size, max_length):
        caches = []
        for index, block in enumerate(self.blocks):
            if self.conv_state(index):
                shape = (batch_size, max_length, self.hpn.dim)
                caches.append(("convolution inputs", shape))
            if self.gates[index] is not None:  # running log-gate sums c_j
                shape = (batch_size, max_length, self.gates[index].num_heads)
                caches.append(("gate sums", shape))
            attentions = (block,)
            if self.method.recursive:
                attentions = (block.attention, block.position_attention)
            for attention in attentions:  # keys, then values: (B, N_kv, S, H)
                heads = attention.num_key_value_heads
                value_dim = attention.value_dim or attention.key_dim
                for kind, size in (("keys", attention.key_dim), ("values", value_dim)):
                    caches.append((kind, (batch_size, heads, max_length, size)))
        return caches

    def forward(
        self, x, cache=None, index=0, training=None, sink_tokens=None, segment_ids=None
    ):
        """The stack's output `(B, T, D)` for embedded tokens `x` `(B, T, D)`.

        Without a cache the tokens sit at `0 .. T-1` (under causal masks for
        a causal stack) and Keras masks flow through; with one (a list, causal
        stacks only) they sit at `index ...`, read the cached keys (and the
        causal convolution's state) of the earlier positions, and the call
        returns `(output, updated_cache)`. With `segment_ids` `(B, T)` (no
        cache) the rows are packed (`keras_posenc.ops.segments`): every
        position restarts at 0 in each document and attention stays inside
        it.
        """
        decoding = cache is not None
        packed, positions = {}, None
        if segment_ids is not None:
            if decoding:
                _checks.fail(
                    "segment_ids",
                    "None with a cache (decoding runs one document per row)",
                    "a segment_ids tensor",
                )
            packed = {"segment_ids": segment_ids}
            positions = self.segment_positions(segment_ids)  # (B, T) int32
        run = types.SimpleNamespace(
            cache=cache,
            decoding=decoding,
            index=index,
            training=training,
            sink_tokens=sink_tokens,
            packed=packed,
            positions=positions,
            slots=iter(cache or ()),  # the cache tensors, read in order
            updated=[],
            shared={},  # the shared bias, evaluated once: (1, N, T, T or S_max)
        )
        if self.absolute is not None:
            encoding = self._positions(
                x, self._encode_input, cache, index, positions, segment_ids
            )
            x = self._sum("position_sum", x, encoding, run)
        x = self.embedding_norm(x)
        if self.shared_bias is not None:
            bias = self._bias_once(x, cache, index, positions)
            run.shared["attention_bias"] = bias
        for i, block in enumerate(self.blocks):
            if self.hpn is not None and i >= self.first:
                x = self._generate_positions(x, i, run)
            if self.method.recursive:
                x = self._recursive_step(x, block, run)
            else:
                x = self._attention_step(x, i, block, run)
            hidden, output, dropout, norm = self.ffn[i]
            fed = dropout(output(hidden(x)), training=training)
            x = norm(self._sum(f"ffn_sum_{i}", x, fed, run))
        return (x, run.updated) if decoding else x

    def _sum(self, name, a, b, run):
        """`a + b`: the rounding layer `name` (the same for sequences and
        steps), else a plain sum decoding, or `Add` (which keeps masks)."""
        if self.sums:
            return self.sums[name]([a, b])
        return _plus(a, b) if run.decoding else _add(a, b)

    def _generate_positions(self, x, i, run):
        """Layer `i`'s position generator on `x` (decoding: its conv state)."""
        if run.decoding and self.conv_state(i):
            maker = self.ffn[i - 1][3] if i else self.embedding_norm
            rounding = {"state_range": maker.output_range} if self.sums else {}
            x, state = self.hpn(
                x,
                i - self.first,
                state=next(run.slots),
                start_index=run.index,
                **rounding,
            )
            run.updated.append(state)
            return x
        where = {"start_index": run.index} if run.decoding else {}
        return self.hpn(
            x,
            i - self.first,
            training=run.training,
            **where,
            **run.packed,
            **self._cache_length(run.cache),
        )

    def _recursive_step(self, x, block, run):
        """A `RecursivePositionUpdate` block (decoding: its two cache pairs)."""
        if not run.decoding:
            causal = self.causal
            return block(x, use_causal_mask=causal, training=run.training, **run.packed)
        pair = [[next(run.slots), next(run.slots)] for _ in range(2)]
        x, pair = block(x, cache=pair, cache_update_index=run.index)
        run.updated.extend(pair[0] + pair[1])
        return x

    def _attention_step(self, x, i, block, run):
        """Attention `i` and its residual norm (decoding: its keys, values
        and the gate's sums)."""
        query = x
        if self.combined is not None and i == 0:
            encoding, combine = self.combined
            positions = self._positions(
                x, encoding, run.cache, run.index, run.positions
            )
            query = combine(x, positions)
        extra = dict(run.shared)
        if self.gates[i] is not None:
            extra["attention_bias"] = self._gate_bias(self.gates[i], query, run)
        if run.decoding:
            if run.sink_tokens is not None:
                extra["sink_tokens"] = run.sink_tokens
            pair = [next(run.slots), next(run.slots)]  # keys, values
            attended, pair = block(
                query, cache=pair, cache_update_index=run.index, **extra
            )
            run.updated.extend(pair)
        else:
            causal = {"use_causal_mask": True} if self.causal else {}
            attended = block(
                query, training=run.training, **causal, **extra, **run.packed
            )
        return self.norms[i](self._sum(f"attention_sum_{i}", x, attended, run))

    def _gate_bias(self, gate, query, run):
        """The forgetting gate's bias (decoding: from its sums, updated)."""
        if not run.decoding:
            return gate(query)
        if run.sink_tokens is not None:
            bias, sums = gate.rolling_step(
                query, next(run.slots), run.index, run.sink_tokens
            )
        else:
            bias, sums = gate.step(query, next(run.slots), run.index)
        run.updated.append(sums)
        return bias

    @staticmethod
    def _cache_length(cache):
        """`{"max_length": S_max}` of a decoding cache (`{}` without one)."""
        if cache is None:
            return {}
        return {"max_length": next(c.shape[2] for c in cache if rank(c) == 4)}

    def _encode_input(self, x, start_index=0, positions=None, segment_ids=None):
        """The absolute encoding added to the embeddings `x`.

        Packed rows give the `positions` and `segment_ids` of their runs.
        """
        encoding, *fusion = self.absolute
        if segment_ids is None:
            encoded = encoding(x, start_index=start_index)
            for layer in fusion:
                encoded = layer(encoded, start_index=start_index)
            return encoded
        encoded = encoding(x, positions=positions)
        for layer in fusion:
            encoded = layer(encoded, segment_ids=segment_ids)
        return encoded

    def _positions(self, x, encode, cache, index, positions=None, segment_ids=None):
        """`encode(x)` at the tokens' positions (decoding: `index ...`).

        Packed rows: at `positions` `(B, T)` (`encode` also takes their
        `segment_ids` when given).
        """
        if cache is None and positions is not None:
            packed = {} if segment_ids is None else {"segment_ids": segment_ids}
            return encode(x, positions=positions, **packed)
        if cache is None:
            return encode(x)
        max_length = self._cache_length(cache)["max_length"]

        def at(start, count):  # (1, count, D): the encodings ignore content
            return encode(xp.zeros((1, count, x.shape[-1]), x.dtype), start_index=start)

        return ops.cache.position_rows(at, index, xp.shape(x)[1], max_length)

    def _bias_once(self, x, cache, index, positions=None):
        """The shared producer's bias for tokens `x` (decoding: at `index ...`).

        Packed rows: a producer that reads more than `j - i` reads the
        positions `(B, T)` inside each run, `(B, N, T, T)`.
        """
        invariant = getattr(self.shared_bias, "translation_invariant", False)
        if cache is None and positions is not None and not invariant:
            return self.shared_bias(x, positions=positions, key_positions=positions)
        if cache is None:
            return self.shared_bias(x)  # (1, N, T, T)
        max_length = self._cache_length(cache)["max_length"]
        return ops.cache.cached_bias(self.shared_bias, x, max_length, index)


def check_sequence_length(position, sequence_length, max_length):
    """`sequence_length` checked; `"learned"` cannot read past its table."""
    sequence_length = _checks.positive_int("sequence_length", sequence_length, True)
    if position == "learned" and sequence_length and sequence_length > max_length:
        _checks.fail(
            "max_length",
            f">= sequence_length={sequence_length} for position='learned'",
            max_length,
            fix="Use a relative method such as position='t5' for long sequences",
        )
    return sequence_length


def packed_inputs(sequence_length, packed):
    """`(inputs, token_ids, segment_ids or None)`: the model's `keras.Input`s.

    Token ids `(B, T)` named `"tokens"`, or for packed rows a dict of
    `"token_ids"` and `"segment_ids"` `(B, T)` (keras-hub's names).
    """
    if not packed:
        tokens = keras.Input((sequence_length,), dtype="int32", name="tokens")
        return tokens, tokens, None
    tokens = keras.Input((sequence_length,), dtype="int32", name="token_ids")
    segments = keras.Input((sequence_length,), dtype="int32", name="segment_ids")
    return {"token_ids": tokens, "segment_ids": segments}, tokens, segments


def _combined_input(given):
    """The joint position-content input's layers `(encoding, combine)`, or None."""
    if not given.method.combined_input:
        return None
    sinusoid = given.parts["sinusoid"]
    return (
        SinusoidalPositionEncoding(name="combined_positions", **sinusoid),
        CombinedPositionInput(name="combined_input", quantize=given.quantize),
    )


def _generator(given, first):
    """The method's position generator network feeding layers `first ..`, or None."""
    if given.method.generator is None:
        return None
    return HierarchicalPositionNetwork(
        given.width,
        given.layers - first,
        position_features=given.method.generator,
        causal=given.causal,
        quantize=given.quantize,
        kernel_bits=given.kernel_bits,
        name="position_network",
        **given.parts["generator"],
    )


def _residual_sums(given):
    """`{name: QuantizedAdd}` of every residual sum (quantize), else `{}`."""
    if not given.quantize:
        return {}
    names = ["position_sum"] + [
        f"{part}_sum_{index}"
        for index in range(given.layers)
        for part in ("attention", "ffn")
    ]
    return {name: QuantizedAdd(name=name) for name in names}


def _recursive_block(given, index):
    """Layer `index`'s `RecursivePositionUpdate` (`given`: `_check_stack`'s)."""
    block = dict(given.parts["block"])
    if given.quantize:  # a causal LM's blocks also round their caches
        block["quantize"] = "cache" if given.causal else True
        block["kernel_bits"] = given.kernel_bits
    bias = None  # an encoder's block makes its own bidirectional T5 bias
    if given.causal:
        bias = RelativePositionBias(
            block.get("position_heads", 1),
            bidirectional=False,
            name=f"position_bias_{index}",
        )
    return RecursivePositionUpdate(
        given.heads,
        given.width // given.heads,
        dropout=given.dropout,
        position_bias=bias,
        attention_window=given.window,
        name=f"recursive_{index}",
        **block,
    )


def _feed_forward(given, index):
    """Layer `index`'s feed-forward block: hidden, output, dropout, norm."""
    dense = keras.layers.Dense
    if given.quantize:
        dense = functools.partial(QuantizedDense, kernel_bits=given.kernel_bits)
    rounding = {"quantize": True} if given.quantize else {}
    width = given.width
    return (
        dense(2 * width, "relu", name=f"ffn_hidden_{index}"),
        dense(width, name=f"ffn_output_{index}"),
        keras.layers.Dropout(given.dropout, name=f"ffn_dropout_{index}"),
        LayerNorm(name=f"ffn_norm_{index}", **rounding),
    )


def _check_stack(position, sizes, position_options, attention_options, flags):
    """Every argument of `TransformerStack`, checked once, as a namespace:
    the method's row and the `parts` of its layers' options, the sizes, the
    position keys and the attention's checked window, heads and LSH dict."""
    position_options, attention_options = checked_options(
        position_options, attention_options
    )
    method = METHODS[_checks.choice("position", position, tuple(METHODS))]
    hidden_dim, num_layers, num_heads, dropout = sizes
    given = types.SimpleNamespace(method=method, causal=flags["causal"])
    given.width = _checks.positive_int("hidden_dim", hidden_dim)
    given.layers = _checks.positive_int("num_layers", num_layers)
    given.heads = _checks.positive_int("num_heads", num_heads)
    if given.width % given.heads:
        _checks.fail("hidden_dim", f"divisible by num_heads={given.heads}", hidden_dim)
    given.dropout = _checks.rate("dropout", dropout)
    given.quantize = _checks.boolean("quantize", flags["quantize"])
    given.kernel_bits = quantization.check_kernel_bits(flags["kernel_bits"])
    max_length = position_options.pop("max_length", DEFAULT_MAX_LENGTH)
    given.max_length = _checks.positive_int("max_length", max_length)
    given.grid_shape = position_options.pop("grid_shape", None)
    given.share_position_bias = position_options.pop("share_position_bias", False)
    given.window = _checks.positive_int(
        "attention_window", flags["attention_window"], True
    )
    attention_type = attention_options.pop("attention_type", "dense")
    given.kv_heads = _check_grouped(
        flags["num_key_value_heads"], given.heads, attention_type, method
    )
    if given.grid_shape is not None and not method.takes_grid:
        grid_methods = [n for n, m in METHODS.items() if m.takes_grid]
        _checks.fail(
            "grid_shape", f"None unless position is in {grid_methods}", given.grid_shape
        )
    _check_share_position_bias(
        given.share_position_bias, position, method, given.grid_shape, given.window
    )
    given.lsh = _check_attention_type(
        attention_type,
        attention_options or None,
        position,
        dict(
            attention_window=given.window,
            share_position_bias=given.share_position_bias,
            grid_shape=given.grid_shape,
            causal=given.causal,
            quantize=given.quantize,
        ),
    )
    _check_quantize(given.quantize, position)
    given.parts = _method_parts(given, position, position_options or None)
    return given


def _check_grouped(num_key_value_heads, heads, attention_type, method):
    """The checked `num_key_value_heads` (None when not given)."""
    if num_key_value_heads is None:
        return None
    kv_heads = check_key_value_heads(num_key_value_heads, heads, attention_type)
    if method.recursive:
        _checks.fail(
            "num_key_value_heads",
            "None for position='recursive' (its position attention has "
            "one head of its own)",
            kv_heads,
        )
    return kv_heads


def _check_quantize(quantize, position):
    _checks.rounds_on_tensorflow("quantize", quantize)
    if quantize and position not in QUANTIZED_METHODS:
        _checks.fail(
            "quantize",
            f"False unless position is in {list(QUANTIZED_METHODS)} (the "
            "others' int8 rounding is not modelled yet)",
            quantize,
            fix=f"Received position={position!r}",
        )


def _method_parts(given, position, position_options):
    """`{part: constructor kwargs}` of the method's layers, with what the
    stack sets itself (quantization, causality, the band)."""
    method = given.method
    parts = method.resolve_options(position_options, given.max_length)
    if given.quantize:
        parts["sinusoid"]["quantize"] = parts["learned"]["quantize"] = True
        parts["fusion"]["quantize"] = True
    if given.causal:
        _refuse_lookahead(parts, position, position_options)
        if method.bias in DIRECTED_BIASES:
            parts["bias"]["bidirectional"] = False
        if method.static_bias in DIRECTED_BIASES:
            parts["static"]["bidirectional"] = False
        parts["gate"]["bidirectional"] = False
        parts["cope"]["bidirectional"] = False
    else:  # an encoder's CoPE counts from the query on both sides
        parts["cope"].setdefault("bidirectional", True)
    if given.window is not None:  # the gate's bias on the attention's band
        parts["gate"]["attention_window"] = given.window
    return parts


def _check_attention_type(attention_type, options, position, others):
    """The attention's `attention_options`: None for dense, else the checked
    LSH dict."""
    attention_type = _checks.choice("attention_type", attention_type, ATTENTION_TYPES)
    if attention_type == "dense":
        if options is not None:
            _checks.fail(
                "attention_options", "None with attention_type='dense'", options
            )
        return None
    if position not in LSH_METHODS:
        _checks.fail(
            "attention_type",
            f"'dense' unless position is in {list(LSH_METHODS)} (position="
            f"{position!r} reads the dense logits, a dense bias or its own blocks)",
            attention_type,
        )
    reasons = {
        "attention_window": "a band or LSH chunks, not both",
        "share_position_bias": "a shared bias is one dense (T, T) tensor",
        "grid_shape": "LSH chunks read 1-D positions",
        "causal": "a query's chunk depends on later tokens: no cached decoding",
        "quantize": "LSH sorts: it has no int8 model",
    }
    for name, reason in reasons.items():
        if others[name] not in (None, False):
            _checks.fail(
                name,
                f"unset with attention_type='lsh' ({reason})",
                others[name],
            )
    options = check_attention_options("lsh", options)
    return {"attention_type": "lsh", **options}


def _refuse_lookahead(parts, position, position_options):
    """A causal stack refuses options that would let a bias look ahead."""
    parts_read = ("bias", "static", "gate", "cope")
    if any(parts[part].get("bidirectional") for part in parts_read):
        _checks.fail(
            "position_options",
            f"without bidirectional=True for position={position!r}: a causal "
            "model's bias sees only keys before the query",
            position_options,
        )


def _check_share_position_bias(value, position, method, grid_shape, window):
    """Refuses `share_position_bias=True` where there is no one bias to share."""
    if not _checks.boolean("share_position_bias", value):
        return
    if position not in SHARED_BIAS_METHODS or (
        method.bias_needs_grid and not grid_shape
    ):
        _checks.fail(
            "share_position_bias",
            f"False unless position is in {SHARED_BIAS_METHODS} (with a "
            "grid_shape for those that read a grid)",
            value,
            fix=f"position={position!r} (grid_shape={grid_shape!r}) has no bias "
            "producer to share",
        )
    if window is not None:
        _checks.fail(
            "share_position_bias",
            "False with block-local attention (each block evaluates its own "
            "band of the bias)",
            value,
            fix=f"Received attention_window={window!r}",
        )


def _add(*tensors):
    # A layer, not `+`: `+` on symbolic tensors drops the Keras mask.
    return keras.layers.Add()(list(tensors))


def _plus(a, b):
    return a + b
