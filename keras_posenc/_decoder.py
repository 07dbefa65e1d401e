"""The layers of a causal language model and its one forward pass.

`Decoder` owns the layers; `forward` runs them either on a whole sequence
(causal masks) or on new tokens against caches (`cache` given), so the
training graph and the decoding step share one definition.
"""

import tensorflow as tf

from keras_posenc import _checks, ops
from keras_posenc._compat import keras
from keras_posenc.layers.combined_position_input import CombinedPositionInput
from keras_posenc.layers.gated_position_fusion import GatedPositionFusion
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.learned_position_embedding import LearnedPositionEmbedding
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.methods import METHODS


def causal_parts(method, position, position_options, max_length):
    """The method's part options, refusing any that would look ahead."""
    parts = method.resolve_options(position_options, max_length)
    if parts["bias"].get("bidirectional"):
        _checks.fail(
            "position_options",
            f"without bidirectional=True for position={position!r}: a causal "
            "model's bias sees only keys before the query",
            position_options,
        )
    if method.bias == "relative":
        parts["bias"]["bidirectional"] = False
    return parts


class Decoder:
    """The layers of a decoder-only Transformer with one position method."""

    def __init__(self, config):
        method = METHODS[config["position"]]
        parts = causal_parts(
            method,
            config["position"],
            config["position_options"],
            config["max_length"],
        )
        width, heads = config["hidden_dim"], config["num_heads"]
        layers, dropout = config["num_layers"], config["dropout"]
        window = config["attention_window"]
        self.method, self.num_layers = method, layers
        self.embedding = TokenEmbedding(config["vocab_size"], width, name="embedding")
        self.absolute = self.fusion = self.combined = None
        kind = method.input_positions
        if kind in ("sinusoidal", "gated"):
            name = "sinusoidal_positions" if kind == "sinusoidal" else "gated_absolute"
            self.absolute = SinusoidalPositionEncoding(name=name, **parts["sinusoid"])
        elif kind == "learned":
            self.absolute = LearnedPositionEmbedding(
                config["max_length"], name="learned_positions", **parts["learned"]
            )
        if kind == "gated":
            self.fusion = GatedPositionFusion(
                causal=True, name="gated_fusion", **parts["fusion"]
            )
        if method.combined_input:
            self.combined = SinusoidalPositionEncoding(
                name="combined_positions", **parts["sinusoid"]
            )
            self.combine = CombinedPositionInput(name="combined_input")
        self.embedding_norm = LayerNorm(name="embedding_norm")
        self.first = min(method.generator_from, layers - 1)
        self.hpn = None
        if method.generator is not None:
            self.hpn = HierarchicalPositionNetwork(
                width,
                layers - self.first,
                position_features=method.generator,
                causal=True,
                name="position_network",
                **parts["generator"],
            )
        self.shared_bias = None  # one producer for every attention, or None
        if config["share_position_bias"]:
            self.shared_bias = method.bias_layer(heads, "shared", None, parts)
        self.blocks, self.norms, self.ffn = [], [], []
        for index in range(layers):
            if method.recursive:
                block = dict(parts["block"])
                bias = RelativePositionBias(
                    block.get("position_heads", 1),
                    bidirectional=False,
                    name=f"position_bias_{index}",
                )
                self.blocks.append(
                    RecursivePositionUpdate(
                        heads,
                        width // heads,
                        dropout=dropout,
                        position_bias=bias,
                        attention_window=window,
                        name=f"recursive_{index}",
                        **block,
                    )
                )
            else:
                self.blocks.append(
                    RelativeMultiHeadAttention(
                        heads,
                        width // heads,
                        output_dim=width,
                        dropout=dropout,
                        position_bias=None
                        if self.shared_bias is not None
                        else method.bias_layer(heads, index, None, parts),
                        rotary=method.rotary_layer(index, None, parts),
                        attention_window=window,
                        name=f"attention_{index}",
                    )
                )
                self.norms.append(LayerNorm(name=f"attention_norm_{index}"))
            self.ffn.append(
                (
                    keras.layers.Dense(2 * width, "relu", name=f"ffn_hidden_{index}"),
                    keras.layers.Dense(width, name=f"ffn_output_{index}"),
                    keras.layers.Dropout(dropout, name=f"ffn_dropout_{index}"),
                    LayerNorm(name=f"ffn_norm_{index}"),
                )
            )
        self.head = keras.layers.Dense(config["vocab_size"], name="logits")

    def conv_state(self, index):
        """Whether layer `index` keeps a causal-convolution state in the cache."""
        return (
            self.hpn is not None
            and index >= self.first
            and self.hpn.position_features == "conv"
            and self.hpn.kernel_size > 1
        )

    def cache_shapes(self, batch_size, max_length):
        """The shapes of the cache tensors, in the order `forward` reads them."""
        shapes = []
        for index, block in enumerate(self.blocks):
            if self.conv_state(index):
                shapes.append((batch_size, max_length, self.hpn.dim))
            attentions = (block,)
            if self.method.recursive:
                attentions = (block.attention, block.position_attention)
            for attention in attentions:
                size = (attention.num_heads, attention.key_dim)
                shapes.append((batch_size, 2, max_length) + size)
        return shapes

    def encode_input(self, x, start_index=0):
        """The absolute encoding added to the embeddings `x`."""
        if self.fusion is None:
            return self.absolute(x, start_index=start_index)
        encoding = self.absolute(x, start_index=start_index)
        return self.fusion(encoding, start_index=start_index)

    def encode_combined(self, x, start_index=0):
        """The sinusoids joined to the first attention's input."""
        return self.combined(x, start_index=start_index)

    def positions(self, x, encode, cache, index):
        """`encode(x)` at the tokens' positions (decoding: `index ...`)."""
        if cache is None:
            return encode(x)
        max_length = next(c.shape[2] for c in cache if c.shape.rank == 5)

        def at(start, count):  # (1, count, D): the encodings ignore content
            return encode(tf.zeros((1, count, x.shape[-1]), x.dtype), start)

        return ops.cache.position_rows(at, index, tf.shape(x)[1], max_length)

    def bias_once(self, x, cache, index):
        """The shared producer's bias for tokens `x` (decoding: at `index ...`)."""
        if cache is None:
            return self.shared_bias(x)  # (1, N, T, T)
        max_length = next(c.shape[2] for c in cache if c.shape.rank == 5)
        keys = tf.zeros((1, max_length, 1), x.dtype)  # only its length is read
        return ops.cache.cached_bias(self.shared_bias, x, keys, index)

    def forward(self, tokens, cache=None, index=0, training=None):
        """Logits `(B, T, V)`; with `cache` (a list), also the updated list.

        Without a cache the tokens sit at `0 .. T-1` under causal masks; with
        one they sit at `index ...` and read the cached keys (and the causal
        convolution's state) of the earlier positions.
        """
        decoding = cache is not None
        where = {"start_index": index} if decoding else {}
        slots, updated = iter(cache or ()), []
        x = self.embedding(tokens)
        if self.absolute is not None:
            x = x + self.positions(x, self.encode_input, cache, index)
        x = self.embedding_norm(x)
        shared = {}  # the shared bias, evaluated once: (1, N, T, T or S_max)
        if self.shared_bias is not None:
            shared["attention_bias"] = self.bias_once(x, cache, index)
        for i, block in enumerate(self.blocks):
            if self.hpn is not None and i >= self.first:
                if decoding and self.conv_state(i):
                    x, state = self.hpn(
                        x, i - self.first, state=next(slots), start_index=index
                    )
                    updated.append(state)
                else:
                    x = self.hpn(x, i - self.first, training=training, **where)
            if self.method.recursive:
                if decoding:
                    pair = [next(slots), next(slots)]
                    x, pair = block(x, cache=pair, cache_update_index=index)
                    updated.extend(pair)
                else:
                    x = block(x, use_causal_mask=True, training=training)
            else:
                query = x
                if self.combined is not None and i == 0:
                    encode = self.encode_combined
                    query = self.combine(x, self.positions(x, encode, cache, index))
                if decoding:
                    attended, state = block(
                        query, cache=next(slots), cache_update_index=index, **shared
                    )
                    updated.append(state)
                else:
                    attended = block(
                        query, use_causal_mask=True, training=training, **shared
                    )
                x = self.norms[i](x + attended)
            hidden, output, dropout, norm = self.ffn[i]
            x = norm(x + dropout(output(hidden(x)), training=training))
        logits = self.head(x)
        return (logits, updated) if decoding else logits
