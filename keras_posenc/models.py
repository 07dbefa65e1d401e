"""Functional-API builders: a Transformer encoder with any position method.

Every builder returns a plain functional `keras.Model` (it saves and loads as
`.keras` in both Keras modes) built from int8-friendly parts: Dense, ReLU,
`keras_posenc.LayerNorm` and BATCH_MATMUL attention.
"""

from keras_posenc import _checks
from keras_posenc._compat import keras
from keras_posenc._encoder_checks import check_encoder_arguments
from keras_posenc.causal_lm import CausalLM
from keras_posenc.layers.combined_position_input import CombinedPositionInput
from keras_posenc.layers.hierarchical_position_network import (
    HierarchicalPositionNetwork,
)
from keras_posenc.layers.layer_norm import LayerNorm
from keras_posenc.layers.mean_pooling import MeanPooling
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.layers.relative_multi_head_attention import (
    RelativeMultiHeadAttention,
)
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.methods import METHODS
from keras_posenc.methods import SHARED_BIAS_METHODS as SHARED_BIAS_METHODS

#: The position methods every builder accepts as `position=` (`METHODS` rows).
POSITION_METHODS = tuple(METHODS)
#: Methods whose attention carries a relative bias (they extrapolate in length).
RELATIVE_METHODS = tuple(
    name
    for name, method in METHODS.items()
    if (method.bias and not method.bias_needs_grid)
    or method.recursive
    or method.rotary is not None
)


def build_encoder(
    vocab_size=None,
    input_dim=None,
    sequence_length=None,
    hidden_dim=64,
    num_layers=2,
    num_heads=4,
    dropout=0.0,
    position="t5",
    max_length=512,
    mask_zero=False,
    grid_shape=None,
    attention_window=None,
    position_options=None,
    share_position_bias=False,
    name="encoder",
):
    """A Transformer encoder `(B, T) or (B, T, input_dim) -> (B, T, hidden_dim)`.

    Args:
        vocab_size: int, integer-token inputs `(B, T)` with this vocabulary;
            exactly one of `vocab_size` and `input_dim` is given.
        input_dim: int, feature inputs `(B, T, input_dim)`.
        sequence_length: int or None, a fixed T (None lets relative methods
            run on other lengths). Defaults to `None`.
        hidden_dim: int, the model width D (divisible by `num_heads`).
            Defaults to `64`.
        num_layers: int, the number of Transformer layers. Defaults to `2`.
        num_heads: int, attention heads N. Defaults to `4`.
        dropout: float, the rate of every dropout in the model, the same for
            every method: on the attention weights of every attention (the
            recursive blocks' two included) and on each feed-forward output
            before its residual sum. Defaults to `0.0`.
        position: str, one of `POSITION_METHODS` (the rows of
            `keras_posenc.methods.METHODS`). Defaults to `"t5"`.
        max_length: int, the table size of `"learned"`; `"clipped"` and
            `"gated"` clip distances at `min(max_length, 32)` unless
            `position_options` sets `max_distance`. Defaults to `512`.
        mask_zero: bool, token 0 is padding (a Keras mask). Defaults to `False`.
        grid_shape: tuple, e.g. `(rows, cols)`: the sequence is a flattened
            grid; `"dynamic_bias"` (or `"hybrid"`, which then adds it to its
            attention) reads 2-D distances and `"rope"` turns axially over
            the grid. Defaults to `None`.
        attention_window: int, block-local attention with this window in
            every layer (linear in T); None keeps dense attention.
            Defaults to `None`.
        position_options: dict, constructor arguments forwarded to the
            method's layers, e.g. `{"num_buckets": 64, "max_distance": 256}`
            for `"t5"`; `keras_posenc.methods.METHODS[position].options`
            lists the keys each method takes. Defaults to `None`.
        share_position_bias: bool, one bias producer evaluates the bias once
            per forward and every attention adds it, as T5 does: one
            parameter set and L - 1 fewer evaluations. For the methods in
            `SHARED_BIAS_METHODS`, with dense attention. Defaults to `False`.
        name: str, the model name. Defaults to `"encoder"`.

    Returns:
        A functional `keras.Model`.
    """
    checked = check_encoder_arguments(**locals())  # every argument, by name
    method, hidden_dim, num_layers, num_heads = checked[:4]
    sequence_length, dropout, max_length = checked[4:]
    parts = method.resolve_options(position_options, max_length)

    if vocab_size is not None:
        vocab_size = _checks.positive_int("vocab_size", vocab_size)
        inputs = keras.Input((sequence_length,), dtype="int32", name="tokens")
        x = TokenEmbedding(vocab_size, hidden_dim, mask_zero, name="embedding")(inputs)
    else:
        input_dim = _checks.positive_int("input_dim", input_dim)
        inputs = keras.Input((sequence_length, input_dim), name="features")
        x = keras.layers.Dense(hidden_dim, name="input_projection")(inputs)
    if method.input_positions is not None:
        x = _add(x, method.input_encoding(x, parts, max_length))
    x = LayerNorm(name="embedding_norm")(x)

    key_dim = hidden_dim // num_heads
    first = min(method.generator_from, num_layers - 1)  # first layer fed
    hpn = None
    if method.generator is not None:
        hpn = HierarchicalPositionNetwork(
            hidden_dim,
            num_layers - first,
            position_features=method.generator,
            name="position_network",
            **parts["generator"],
        )

    def bias_layer(index):
        return method.bias_layer(num_heads, index, grid_shape, parts)

    shared = {}  # the bias evaluated once, (1, N, T, T), as a call argument
    if share_position_bias:
        shared["attention_bias"] = bias_layer("shared")(x)
    for index in range(num_layers):
        if hpn is not None and index >= first:
            x = hpn(x, index - first)
        if method.recursive:
            x = RecursivePositionUpdate(
                num_heads,
                key_dim,
                dropout=dropout,
                attention_window=attention_window,
                name=f"recursive_{index}",
                **parts["block"],
            )(x)
        else:
            attention = RelativeMultiHeadAttention(
                num_heads,
                key_dim,
                output_dim=hidden_dim,
                dropout=dropout,
                position_bias=None if share_position_bias else bias_layer(index),
                rotary=method.rotary_layer(index, grid_shape, parts),
                attention_window=attention_window,
                name=f"attention_{index}",
            )
            query = x
            if method.combined_input and index == 0:
                # The joint position-content input (docs/design.md).
                positions = SinusoidalPositionEncoding(
                    name="combined_positions", **parts["sinusoid"]
                )(x)
                query = CombinedPositionInput(name="combined_input")(x, positions)
            context = attention(query, **shared)
            x = LayerNorm(name=f"attention_norm_{index}")(_add(x, context))
        x = _feed_forward(x, hidden_dim, dropout, index)
    return keras.Model(inputs, x, name=name)


def build_classifier(num_classes, **encoder_kwargs):
    """An encoder, mean pooling over (unmasked) tokens, and class logits.

    The pooling (`MeanPooling`) gives an all-padding row zeros, so its
    logits are the output bias: finite, and exportable to int8.

    Args:
        num_classes: int, the number of classes.
        **encoder_kwargs: the arguments of `build_encoder`.

    Returns:
        A functional `keras.Model` returning logits `(B, num_classes)`.
    """
    num_classes = _checks.positive_int("num_classes", num_classes)
    encoder = build_encoder(**encoder_kwargs)
    pooled = MeanPooling(name="pool")(encoder.output)  # all-padding rows: zeros
    logits = keras.layers.Dense(num_classes, name="logits")(pooled)
    return keras.Model(encoder.input, logits, name="classifier")


def build_token_classifier(num_classes, **encoder_kwargs):
    """An encoder and per-token class logits `(B, T, num_classes)`.

    Args:
        num_classes: int, the number of classes.
        **encoder_kwargs: the arguments of `build_encoder`.

    Returns:
        A functional `keras.Model`.
    """
    num_classes = _checks.positive_int("num_classes", num_classes)
    encoder = build_encoder(**encoder_kwargs)
    logits = keras.layers.Dense(num_classes, name="logits")(encoder.output)
    return keras.Model(encoder.input, logits, name="token_classifier")


def _feed_forward(x, hidden_dim, dropout, index):
    h = keras.layers.Dense(2 * hidden_dim, "relu", name=f"ffn_hidden_{index}")(x)
    h = keras.layers.Dense(hidden_dim, name=f"ffn_output_{index}")(h)
    h = keras.layers.Dropout(dropout)(h)
    return LayerNorm(name=f"ffn_norm_{index}")(_add(x, h))


def _add(*tensors):
    # A layer, not `+`: `+` on symbolic tensors drops the Keras mask.
    return keras.layers.Add()(list(tensors))


def build_causal_lm(vocab_size, **kwargs):
    """A decoder-only LM `(B, T)` ids -> `(B, T, V)` logits, with `generate`.

    Args:
        vocab_size: int, the vocabulary size V.
        **kwargs: the other arguments of `keras_posenc.causal_lm.CausalLM`.

    Returns:
        A `keras_posenc.causal_lm.CausalLM` (a functional `keras.Model`).

    Example:

    >>> import numpy as np
    >>> from keras_posenc.models import build_causal_lm
    >>> model = build_causal_lm(vocab_size=30, hidden_dim=16, num_layers=1,
    ...                         num_heads=2, position="t5")
    >>> model(np.ones((2, 9), "int32")).shape
    TensorShape([2, 9, 30])
    """
    return CausalLM(vocab_size, **kwargs)
