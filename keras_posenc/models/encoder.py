"""Functional-API builders: a Transformer encoder with any position method.

Every builder returns a plain functional `keras.Model` (it saves and loads as
`.keras` in both Keras modes) built from int8-friendly parts: Dense, ReLU,
`keras_posenc.LayerNorm` and BATCH_MATMUL attention.
"""

from keras_posenc import _checks
from keras_posenc._compat import keras
from keras_posenc.layers.mean_pooling import MeanPooling
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.models.methods import METHODS
from keras_posenc.models.packed import PackedModel
from keras_posenc.models.stack import (
    TransformerStack,
    check_sequence_length,
    packed_inputs,
)

#: The position methods every builder accepts as `position=` (`METHODS` rows).
POSITION_METHODS = tuple(METHODS)
#: Methods whose attention carries a relative bias (they extrapolate in length).
RELATIVE_METHODS = tuple(
    name
    for name, method in METHODS.items()
    if (method.bias and not method.bias_needs_grid)
    or method.recursive
    or method.rotary is not None
    or method.forgetting_gate
    or method.contextual
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
    position_options=None,
    attention_options=None,
    mask_zero=False,
    packed=False,
    attention_window=None,
    num_key_value_heads=None,
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
        dropout: float, every dropout rate (attention weights, feed-forward
            outputs before their residual sums). Defaults to `0.0`.
        position: str, one of `POSITION_METHODS` (the rows of
            `keras_posenc.models.methods.METHODS`). Defaults to `"t5"`.
        position_options: dict of the method's layers' options
            (`METHODS[position].options`), `max_length` (512), `grid_shape`
            and `share_position_bias` (`docs/layers.md`). Defaults to `None`.
        attention_options: dict of the LSH concern, `attention_type` and
            LSH's hashing, as the attention takes it (`docs/attention.md`).
            Defaults to `None` (dense).
        mask_zero: bool, token 0 is padding (a Keras mask). Defaults to `False`.
        packed: bool, the model takes packed rows `{"token_ids",
            "segment_ids"}` (with `vocab_size`, without a grid): each
            document reads as alone; not with LSH. Defaults to `False`.
        attention_window: int or None, block-local attention in blocks of W.
            Defaults to `None`.
        num_key_value_heads: int or None, grouped-query attention's key and
            value heads. Defaults to `None`.
        name: str, the model's name. Defaults to `"encoder"`.

    Returns:
        A functional `keras.Model`.
    """
    stack = TransformerStack(  # checks every option, once
        position,
        hidden_dim,
        num_layers,
        num_heads,
        dropout,
        position_options=position_options,
        attention_options=attention_options,
        attention_window=attention_window,
        num_key_value_heads=num_key_value_heads,
    )
    grid_shape = (position_options or {}).get("grid_shape")
    if (vocab_size is None) == (input_dim is None):
        _checks.fail(
            "vocab_size",
            "given, or input_dim given, but not both",
            vocab_size,
            fix=f"Received input_dim={input_dim!r} too",
        )
    lsh = (attention_options or {}).get("attention_type") == "lsh"
    _check_packed(packed, lsh, (input_dim, grid_shape))
    sequence_length = check_sequence_length(position, sequence_length, stack.max_length)
    segments = None
    if vocab_size is not None:
        vocab_size = _checks.positive_int("vocab_size", vocab_size)
        inputs, tokens, segments = packed_inputs(sequence_length, packed)
        x = TokenEmbedding(vocab_size, hidden_dim, mask_zero, name="embedding")(tokens)
    else:
        input_dim = _checks.positive_int("input_dim", input_dim)
        inputs = keras.Input((sequence_length, input_dim), name="features")
        x = keras.layers.Dense(hidden_dim, name="input_projection")(inputs)
    model_class = keras.Model if segments is None else PackedModel
    return model_class(inputs, stack.forward(x, segment_ids=segments), name=name)


def _check_packed(packed, lsh, inputs):
    """Packed rows need token inputs without a grid, and no LSH."""
    input_dim, grid_shape = inputs
    if _checks.boolean("packed", packed) and lsh:
        _checks.fail(
            "packed",
            "False with attention_type='lsh' (a packed row's documents share "
            "the hashing and the sorted chunks, so a document's output would "
            "depend on the others in its row)",
            packed,
            fix="Train LSH attention on one document per row, or use "
            "attention_type='dense' (attention_window=W for long rows)",
        )
    if packed and (input_dim is not None or grid_shape):
        _checks.fail(
            "packed",
            "False for feature inputs (input_dim) or a grid_shape (packed rows "
            "are documents of tokens, each from position 0)",
            packed,
            fix=f"Received input_dim={input_dim!r}, grid_shape={grid_shape!r}",
        )


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
    if encoder_kwargs.get("packed"):
        _checks.fail(
            "packed",
            "False for a classifier of whole rows (a packed row holds several "
            "documents; build_token_classifier takes packed rows)",
            encoder_kwargs["packed"],
        )
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
    return type(encoder)(encoder.input, logits, name="token_classifier")
