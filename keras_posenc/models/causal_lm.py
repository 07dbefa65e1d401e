"""Decoder-only language models with any position method, and generation."""

import types

from keras_posenc import _checks, ops
from keras_posenc._backend import xp
from keras_posenc._compat import keras, register
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.models._generating import MAX_COMPILED_STEPS, Generating
from keras_posenc.models.decoder_stack import DecoderStack
from keras_posenc.models.options import DEFAULT_MAX_LENGTH
from keras_posenc.models.packed import SegmentIdsCheck
from keras_posenc.models.stack import (
    TransformerStack,
    check_sequence_length,
    packed_inputs,
)
from keras_posenc.utils import nested_layers

__all__ = ["MAX_COMPILED_STEPS", "CausalLM", "build_causal_lm"]


@register
class CausalLM(SegmentIdsCheck, Generating, keras.Model):
    """A decoder-only Transformer language model: `(B, T)` ids -> `(B, T, V)` logits.

    A functional model (train it with `model.fit`, save it as `.keras`) that
    is causal for every position method: attention is masked to `j <= i`,
    biases are one-directional, `"hpn"`/`"hybrid"` position generators use
    causal convolutions, `"gated"` averages its relative table over
    `j <= i`, and the `"recursive"` blocks attend causally. Changing token
    `t` never changes the logits before `t`.

    `generate` decodes with a key/value cache: every attention keeps the keys
    and values of earlier positions (`cache_shapes`), and each position
    producer (bias, rotation, absolute table, position generator) is
    evaluated at the new token's true position against the cache, so cached
    decoding gives the logits a full recompute gives (rotary types whose
    frequencies read the current length read each token at its own length
    instead: `reads_current_length`).

    Args:
        vocab_size: int, the vocabulary size V.
        sequence_length: int or None, a fixed T. Defaults to `None`.
        hidden_dim: int, the width D (divisible by `num_heads`).
            Defaults to `64`.
        num_layers: int, Transformer layers. Defaults to `2`.
        num_heads: int, attention heads. Defaults to `4`.
        dropout: float, every dropout rate (attention weights, feed-forward
            outputs). Defaults to `0.0`.
        position: str, one of `POSITION_METHODS`. Defaults to `"rope"`.
        position_options: dict, as in `build_encoder` (`max_length`: the
            longest text `"learned"` reads or generates; look-ahead options
            refused). Defaults to `None`.
        attention_options: dict, the LSH concern as in `build_encoder`
            (causal LMs refuse LSH). Defaults to `None`.
        quantize: bool, quantization-aware training of every tensor the int8
            export rounds (`tflite_export.quantize_aware`), or `"int4"`: with
            4-bit kernels (`mode="int4"`). Defaults to `False`.
        packed: bool, train on packed rows `{"token_ids", "segment_ids"}`
            (`language_modeling.pack`): each document reads as alone
            (`docs/language_models.md`). Defaults to `False`.
        attention_window: int or None, block-local attention in blocks of W
            (generation keeps the band). Defaults to `None`.
        num_key_value_heads: int or None, grouped-query attention: a cache
            of that many key and value heads. Defaults to `None`.
        block_options: dict or None, what each layer is made of (keys of
            `models.blocks.BlockOptions`, `docs/decoders.md`); None keeps the
            package's first block. Defaults to `None`.
        **kwargs: `name` (default `"causal_lm"`) and `trainable`.

    Example:

    >>> import keras_posenc
    >>> model = keras_posenc.models.build_causal_lm(
    ...     vocab_size=20, hidden_dim=16, num_layers=1, num_heads=2,
    ...     position="alibi")
    >>> model.generate([[1, 2, 3]], max_new_tokens=4).shape
    (1, 7)
    """

    def __init__(
        self,
        vocab_size,
        sequence_length=None,
        hidden_dim=64,
        num_layers=2,
        num_heads=4,
        dropout=0.0,
        position="rope",
        position_options=None,
        attention_options=None,
        quantize=False,
        packed=False,
        attention_window=None,
        num_key_value_heads=None,
        block_options=None,
        **kwargs,
    ):
        given = {k: v for k, v in locals().items() if k in CONFIG_KEYS}
        name = kwargs.pop("name", "causal_lm")
        keras_keywords = {k: kwargs.pop(k) for k in ("trainable",) if k in kwargs}
        if kwargs:  # keras.Model would ignore a misspelled one
            raise TypeError(
                f"CausalLM got unexpected keyword arguments {sorted(kwargs)}. It "
                "takes the arguments of build_causal_lm (vocab_size, hidden_dim, "
                "..., position_options, attention_options, attention_window, "
                "num_key_value_heads, block_options)"
            )
        if not (isinstance(quantize, bool) or quantize == "int4"):
            _checks.fail(
                "quantize",
                "False, True (int8) or 'int4' (4-bit kernels, int8 activations)",
                quantize,
            )
        given["vocab_size"] = _checks.positive_int("vocab_size", vocab_size)
        if block_options is not None:
            stack = _decoder_stack(given)
        else:
            stack = _legacy_stack(given)
        config = _checked_config(given, stack.max_length)
        inputs, logits, embedding, head = _language_model(stack, config)
        super().__init__(inputs, logits, name=name, **keras_keywords)
        # Plain attributes (already tracked by the functional graph).
        self._parts = types.SimpleNamespace(stack=stack, embedding=embedding, head=head)
        self._lm_config = config

    @property
    def max_length(self):
        """The position tables' length (`position_options["max_length"]`,
        512 unless set): the longest text `"learned"` can read."""
        options = self._lm_config["position_options"] or {}
        return int(options.get("max_length", DEFAULT_MAX_LENGTH))

    def make_train_function(self, force=False):
        """Keras' training step; the optimizer is built on the weights first.

        Both Keras modes otherwise create the optimizer's variables inside
        the first trace of the step, and TensorFlow traces a function that
        created variables a second time. Built here (the same variables and
        initial values; `fit` and `train_on_batch` call this before the first
        trace), the step is traced once: a quantization-aware LM's first
        `fit` (2 layers, D=16) 18.3-19.2 -> 10.0-10.1 s in Keras 3,
        14.3 -> 8.9 s in Keras 2 (2-core AMD EPYC). `compile` is left as
        Keras has it, so a saved compiled model loads compiled. Optimizers
        without `build` (Keras 2's legacy ones) are left as they are.
        """
        optimizer = getattr(self, "optimizer", None)
        if (
            optimizer is not None
            # Keras 2's optimizers have no public `built`; their `build`
            # returns at once when built.
            and not getattr(optimizer, "built", False)
            and callable(getattr(optimizer, "build", None))
        ):
            optimizer.build(self.trainable_variables)
        return super().make_train_function(force)

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable, **self._lm_config}
        rotary = [x for x in nested_layers(self) if isinstance(x, RotaryEmbedding)]
        if not rotary:
            return config
        # The scaling in force (`utils.set_rope_scaling` changes it).
        options = dict(config["position_options"] or {})
        if "layer_rope" in options:  # each layer type's, from its first layer
            per_type = {kind: dict(o) for kind, o in options["layer_rope"].items()}
            stack = self._parts.stack
            for attention, kind in zip(stack.blocks, stack.options.layer_types):
                if attention.rotary is not None:
                    scaling = _scaling_in_force(attention.rotary)
                    per_type[kind] = {**per_type.get(kind, {}), **scaling}
            options["layer_rope"] = per_type
        else:
            options.update(_scaling_in_force(rotary[0]))
        config["position_options"] = options
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)

    @property
    def position(self):
        """The position method's name."""
        return self._lm_config["position"]

    @property
    def reads_current_length(self):
        """Whether a rotary layer's frequencies depend on the current length.

        True for `rope_type="dynamic"` and `"longrope"`. Such a model reads
        every token at the length when it arrives: a decoding step keeps its
        keys before rotation and turns them at the step's length, so cached
        decoding (in Keras, LiteRT and TFLM alike) equals a recompute for the
        attention itself; but a recompute would also re-read the earlier
        tokens' hidden states at the new length, which no cache holds, so
        `generate(use_cache=False)` is refused for it.
        """
        return any(
            isinstance(layer, RotaryEmbedding)
            and ops.rotary.ROPE_TYPES[layer.rope_type].length_dependent
            for layer in nested_layers(self)
        )

    def logits(self, token_ids, training=False):
        """Logits `(B, T, V)` of whole rows, one document per row.

        `model(token_ids)` for an unpacked model; a packed one reads each row
        as one segment (`{"token_ids": ..., "segment_ids": ones}`).
        """
        if not self._lm_config.get("packed"):
            return self(token_ids, training=training)
        token_ids = xp.convert_to_tensor(token_ids, xp.int32)
        segments = xp.ones_like(token_ids)
        inputs = {"token_ids": token_ids, "segment_ids": segments}
        return self(inputs, training=training)

    def cache_shapes(self, batch_size, max_length):
        """Shapes of the cache tensors of `call_with_cache`, in order.

        Each attention holds its keys, then its values, `(B, N, max_length,
        H)` each, heads-first (two attentions per `"recursive"` block); a
        causal position convolution holds its inputs `(B, max_length, D)`,
        by position, a forgetting gate its running sums `(B, max_length, N)`.
        """
        return self._parts.stack.cache_shapes(batch_size, max_length)

    def cache_kinds(self):
        """What each cache tensor holds, in `cache_shapes`' order: `"keys"`,
        `"values"`, `"convolution inputs"` (a causal position convolution)
        or `"gate sums"` (a forgetting gate)."""
        return self._parts.stack.cache_kinds()

    def empty_cache(self, batch_size, max_length):
        """A list of zero float32 cache tensors for `call_with_cache`."""
        shapes = self.cache_shapes(batch_size, max_length)
        return [xp.zeros(shape, xp.float32) for shape in shapes]

    def call_with_cache(self, token_ids, cache, cache_update_index, sink_tokens=None):
        """Logits `(B, T, V)` of tokens at `cache_update_index ...`, and the cache.

        Args:
            token_ids: int tensor `(B, T)`, the new tokens.
            cache: list of tensors shaped as `cache_shapes`, holding the
                earlier positions (`empty_cache` before the first call).
            cache_update_index: int or scalar int tensor, the position of the
                first new token.

        Returns:
            `(logits, updated_cache)`.
        """
        shapes = self.cache_shapes(None, None)
        if not isinstance(cache, (list, tuple)) or len(cache) != len(shapes):
            _checks.fail(
                "cache",
                f"a list of {len(shapes)} tensors shaped as cache_shapes "
                "(empty_cache before the first call)",
                f"{type(cache).__name__} of {len(cache)}"
                if isinstance(cache, (list, tuple))
                else cache,
                error=TypeError,
            )
        parts = self._parts
        blocker = parts.stack.streaming_blocker()
        if sink_tokens is not None and blocker is not None:
            _checks.fail(
                "sink_tokens",
                f"None for this model: a rolling cache cannot hold {blocker}",
                sink_tokens,
            )
        x = parts.embedding(token_ids)
        x, cache = parts.stack.forward(
            x, list(cache), cache_update_index, sink_tokens=sink_tokens
        )
        return parts.head(x), cache


#: The constructor arguments a `CausalLM`'s config holds, in order.
CONFIG_KEYS = (
    "vocab_size",
    "sequence_length",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "dropout",
    "position",
    "position_options",
    "attention_options",
    "quantize",
    "packed",
    "attention_window",
    "num_key_value_heads",
    "block_options",
)


def _scaling_in_force(rotary):
    """A rotary layer's scaling as position options."""
    return dict(
        rope_type=rotary.rope_type,
        scaling_factor=rotary.scaling_factor,
        original_max_position_embeddings=rotary.original_max_position_embeddings,
        rope_parameters=dict(rotary.rope_parameters),
    )


#: The arguments both stacks take from a `CausalLM`'s, in their order.
STACK_SIZES = ("position", "hidden_dim", "num_layers", "num_heads", "dropout")
STACK_KEYWORDS = ("position_options", "attention_window", "num_key_value_heads")


def _legacy_stack(given):
    """The package's first stack (post-norm blocks), every option checked."""
    quantize = given["quantize"]
    return TransformerStack(
        *(given[key] for key in STACK_SIZES),
        **{key: given[key] for key in STACK_KEYWORDS},
        attention_options=given["attention_options"],
        causal=True,
        quantize=bool(quantize),
        kernel_bits=4 if quantize == "int4" else 8,
    )


def _decoder_stack(given):
    """The stack `block_options` describe; refuses what it has no form for."""
    for name, off, why in (
        (
            "quantize",
            False,
            "the blocks' int8 rounding is not modelled; an "
            "int8 export quantizes after training",
        ),
        ("attention_options", None, "LSH attention has no decoder-block form"),
    ):
        if given[name] not in (off, None, {}):
            _checks.fail(name, f"{off!r} with block_options ({why})", given[name])
    return DecoderStack(
        *(given[key] for key in STACK_SIZES),
        **{key: given[key] for key in STACK_KEYWORDS},
        block_options=given["block_options"],
    )


def _checked_config(given, max_length):
    """The config of a `CausalLM` built from `given` (its `CONFIG_KEYS`),
    its stack already checked (`max_length`: the stack's)."""
    config = {key: given[key] for key in CONFIG_KEYS}
    config["sequence_length"] = check_sequence_length(
        given["position"], given["sequence_length"], max_length
    )
    for key in ("hidden_dim", "num_layers", "num_heads"):
        config[key] = int(config[key])
    config["dropout"] = float(config["dropout"])
    for key in ("position_options", "attention_options"):
        config[key] = dict(given[key] or {}) or None
    if given["block_options"] is not None:
        config["block_options"] = dict(given["block_options"])
    config["packed"] = _checks.boolean("packed", given["packed"])
    return config


def _language_model(stack, config):
    """`(inputs, logits, embedding, head)`: tokens through the embedding, the
    stack and the head, as `config` (a `CausalLM`'s) says."""
    rounding = {"quantize": True} if config["quantize"] else {}
    vocab_size, width = config["vocab_size"], config["hidden_dim"]
    embedding = TokenEmbedding(vocab_size, width, name="embedding", **rounding)
    if config["quantize"]:  # on the LM's kernel grid, as every projection
        bits = 4 if config["quantize"] == "int4" else 8
        head = QuantizedDense(vocab_size, kernel_bits=bits, name="logits")
    elif (config["block_options"] or {}).get("tie_embeddings"):

        def head(x):  # the embedding's transpose (one weight)
            return embedding(x, reverse=True)

    else:  # a described block's head has a bias where its projections do
        bias = (config["block_options"] or {}).get("use_bias", True)
        head = keras.layers.Dense(vocab_size, use_bias=bias, name="logits")
    inputs, tokens, segments = packed_inputs(
        config["sequence_length"], config["packed"]
    )
    logits = head(stack.forward(embedding(tokens), segment_ids=segments))
    return inputs, logits, embedding, head


def build_causal_lm(vocab_size, **kwargs):
    """A decoder-only LM `(B, T)` ids -> `(B, T, V)` logits, with `generate`.

    Args:
        vocab_size: int, the vocabulary size V.
        **kwargs: the other arguments of `CausalLM`.

    Returns:
        A `CausalLM` (a functional `keras.Model`).

    Example:

    >>> import numpy as np
    >>> from keras_posenc.models import build_causal_lm
    >>> model = build_causal_lm(vocab_size=30, hidden_dim=16, num_layers=1,
    ...                         num_heads=2, position="t5")
    >>> model(np.ones((2, 9), "int32")).shape
    TensorShape([2, 9, 30])
    """
    return CausalLM(vocab_size, **kwargs)
