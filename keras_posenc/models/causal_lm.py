"""Decoder-only language models with any position method, and generation."""

import collections
import types

import numpy as np
import tensorflow as tf

from keras_posenc import _checks, generation, ops, samplers
from keras_posenc._compat import keras, register
from keras_posenc.layers.quantized_dense import QuantizedDense
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.token_embedding import TokenEmbedding
from keras_posenc.models import _loop, _steps
from keras_posenc.models.stack import TransformerStack, check_sequence_length
from keras_posenc.utils import nested_layers

#: How many compiled `(prefill, step)` pairs a `CausalLM` keeps.
MAX_COMPILED_STEPS = 8


@register
class CausalLM(keras.Model):
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
        max_length: int, the table size of `"learned"` (the longest text it
            can read or generate); the clipping distance of `"clipped"` and
            `"gated"` defaults to `min(max_length, 32)`. Defaults to `512`.
        attention_window: int, block-local causal attention with this window
            (linear in T; generation keeps the same band). Defaults to `None`.
        position_options: dict, options of the method's layers, as in
            `build_encoder`; options that would look ahead (a bias with
            `bidirectional=True`) are refused. Defaults to `None`.
        share_position_bias: bool, one bias producer for every attention,
            evaluated once per forward (and once per decoding step), as in
            `build_encoder`. Defaults to `False`.
        quantize: bool, quantization-aware training: every tensor the int8
            decoding export rounds (the embedding table, the projections and
            the head, every norm, residual sum and attention step, and the
            caches, keys and values on one range) passes a fake quantizer
            with a range learned in training, so
            `tflite_export.convert_causal_lm(model, None)` converts it without
            calibration data, and cached decoding still equals a recompute.
            For the methods in `keras_posenc.models.methods.QUANTIZED_METHODS`
            with dense attention; `tflite_export.quantize_aware(model)` makes
            one from a trained float model. Defaults to `False`.
        name: str, the model name. Defaults to `"causal_lm"`.

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
        max_length=512,
        attention_window=None,
        position_options=None,
        share_position_bias=False,
        quantize=False,
        name="causal_lm",
        **kwargs,
    ):
        unknown = sorted(set(kwargs) - {"trainable"})
        if unknown:  # keras.Model would ignore a misspelled argument
            raise TypeError(
                f"CausalLM got unexpected keyword arguments {unknown}; it takes "
                "the arguments of build_causal_lm (vocab_size, hidden_dim, ...). "
                f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
            )
        stack = TransformerStack(
            position,
            hidden_dim,
            num_layers,
            num_heads,
            dropout,
            max_length,
            attention_window=attention_window,
            position_options=position_options,
            share_position_bias=share_position_bias,
            causal=True,
            quantize=quantize,
        )
        config = {
            "vocab_size": _checks.positive_int("vocab_size", vocab_size),
            "sequence_length": check_sequence_length(
                position, sequence_length, max_length
            ),
            "hidden_dim": int(hidden_dim),
            "num_layers": int(num_layers),
            "num_heads": int(num_heads),
            "dropout": float(dropout),
            "position": position,
            "max_length": int(max_length),
            "attention_window": attention_window,
            "position_options": position_options,
            "share_position_bias": share_position_bias,
            "quantize": quantize,
        }
        rounding = {"quantize": True} if quantize else {}
        embedding = TokenEmbedding(vocab_size, hidden_dim, name="embedding", **rounding)
        head = (QuantizedDense if quantize else keras.layers.Dense)(
            vocab_size, name="logits"
        )
        tokens = keras.Input((config["sequence_length"],), dtype="int32", name="tokens")
        logits = head(stack.forward(embedding(tokens)))
        super().__init__(tokens, logits, name=name, **kwargs)
        # Plain attributes (already tracked by the functional graph).
        self._parts = types.SimpleNamespace(stack=stack, embedding=embedding, head=head)
        self._lm_config = config

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable, **self._lm_config}
        rotary = [x for x in nested_layers(self) if isinstance(x, RotaryEmbedding)]
        if rotary:  # the scaling in force (`utils.set_rope_scaling` changes it)
            options = dict(config["position_options"] or {})
            options.update(
                rope_type=rotary[0].rope_type,
                scaling_factor=rotary[0].scaling_factor,
                original_max_position_embeddings=(
                    rotary[0].original_max_position_embeddings
                ),
                rope_parameters=dict(rotary[0].rope_parameters),
            )
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

    def cache_shapes(self, batch_size, max_length):
        """Shapes of the cache tensors of `call_with_cache`, in order.

        Each attention holds `(B, 2, max_length, N, H)` keys and values (two
        per `"recursive"` block); a causal position convolution holds its
        inputs `(B, max_length, D)`, by position.
        """
        return self._parts.stack.cache_shapes(batch_size, max_length)

    def empty_cache(self, batch_size, max_length):
        """A list of zero float32 cache tensors for `call_with_cache`."""
        shapes = self.cache_shapes(batch_size, max_length)
        return [tf.zeros(shape, tf.float32) for shape in shapes]

    def compiled_steps(
        self, batch_size, total_length, use_cache=True, jit_compile=False
    ):
        """The compiled `(prefill, step)` functions of `generate`, traced once.

        Kept per `(batch_size, total_length, use_cache, jit_compile)`, so
        repeated `generate` calls reuse them and
        `step.experimental_get_tracing_count()` stays 1 however many tokens
        are decoded (`prefill` is None without the cache). At most
        `MAX_COMPILED_STEPS` are kept (the least recently used goes first);
        `clear_compiled_steps` drops them all.
        """
        key = (batch_size, total_length, use_cache, jit_compile)
        return self._compiled(key, lambda: _steps.compile_steps(self, *key))

    def compiled_loop(
        self,
        batch_size,
        total_length,
        use_cache=True,
        jit_compile=False,
        sampler="greedy",
        rolling=None,
    ):
        """The compiled decoding loop of `generate` (one `tf.function`), traced once.

        Prefill, every step and `sampler` (a `Sampler` that defines
        `compiled_next_tokens`, or a name) in one `tf.while_loop`; kept as
        `compiled_steps` are, per `(batch_size, total_length, use_cache,
        jit_compile)`, the sampler's class and config and `rolling`
        (`(sink_tokens, slots)` of a rolling cache, or None).
        """
        sampler = samplers.get(sampler)
        if not sampler.compiles:
            _checks.fail(
                "sampler",
                "a Sampler that defines compiled_next_tokens for the compiled loop",
                sampler,
                fix="Use compiled_loop=False to decode it step by step",
            )
        identity = (type(sampler), repr(sorted(sampler.get_config().items())))
        key = ("loop", batch_size, total_length, use_cache, jit_compile, identity)
        key += (rolling,)  # one function per rolling-cache shape
        return self._compiled(
            key,
            lambda: _loop.compile_loop(
                self,
                batch_size,
                total_length,
                use_cache,
                jit_compile,
                sampler,
                rolling,
            ),
        )

    def _compiled(self, key, build):
        functions = self.__dict__.setdefault(
            "_generation_functions", collections.OrderedDict()
        )
        if key not in functions:
            functions[key] = build()
            while len(functions) > MAX_COMPILED_STEPS:
                functions.popitem(last=False)
        functions.move_to_end(key)
        return functions[key]

    def clear_compiled_steps(self):
        """Drops the compiled decoding steps: the next `generate` traces again.

        Anything that changes what a step computes (`utils.set_rope_scaling`
        calls this) must clear them, or they keep decoding the old way.
        """
        self.__dict__.pop("_generation_functions", None)

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

    def check_streaming(self, cache_window, sink_tokens=4):
        """`(sink_tokens, slots)` of a rolling cache, or the error naming why not.

        `cache_window` (int >= 1) recent tokens plus `sink_tokens` (int >= 0)
        first ones; refused for a model whose positions a rolling cache cannot
        hold (`TransformerStack.streaming_blocker`: absolute encodings such as
        `learned`, generators, the recursive stream, gated fusion, a shared
        bias, the forgetting gate, CoPE, block-local windows, length-dependent
        rotary types, quantize=True).
        """
        cache_window = _checks.positive_int("cache_window", cache_window)
        sink_tokens = _checks.positive_int("sink_tokens", sink_tokens, minimum=0)
        blocker = self._parts.stack.streaming_blocker()
        if blocker is not None:
            _checks.fail(
                "cache_window",
                "None for this model: a rolling cache keeps positions inside "
                f"the cache, which {blocker} cannot read",
                cache_window,
                fix="Stream with a method whose positions live in the attention "
                "(alibi, t5, clipped, dynamic_bias, kerple, fire, rope, xpos, none)",
            )
        return sink_tokens, sink_tokens + cache_window

    def score(self, token_ids, cache_window=None, sink_tokens=4, jit_compile=False):
        """Log-probability of each next token, `(B, T - 1)` float32 NumPy.

        Entry `[b, t]` is `log p(token_ids[b, t + 1] | token_ids[b, :t + 1])`
        (natural log; bits are `-score / ln 2`). Without `cache_window`, one
        pass over the whole sequence. With it, the tokens are read one at a
        time through a rolling cache of the first `sink_tokens` and the last
        `cache_window` tokens (the prefix that fits prefilled in one pass,
        the rest inside one compiled `tf.while_loop`): the model reads a
        text of any length at fixed memory, as it would stream it.

        Args:
            token_ids: int array `(B, T)`, `T >= 2`, ids in `[0, vocab_size)`.
            cache_window: None, or int >= 1 recent tokens the cache keeps.
            sink_tokens: int >= 0, the first tokens the rolling cache keeps.
            jit_compile: bool, compile the streaming loop with XLA.
        """
        tokens = np.asarray(token_ids)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            _checks.fail(
                "token_ids",
                "integer token ids (B, T)",
                f"an array of shape {tokens.shape} and dtype {tokens.dtype}",
            )
        if tokens.shape[1] < 2:
            _checks.fail("token_ids", "at least 2 tokens per row", tokens.shape[1])
        generation.check_vocabulary(
            tokens,
            np.full(len(tokens), tokens.shape[1]),
            self._lm_config["vocab_size"],
            name="token_ids",
        )
        jit_compile = _checks.boolean("jit_compile", jit_compile)
        _checks.positive_int("sink_tokens", sink_tokens, minimum=0)
        tokens = tokens.astype(np.int32)
        if cache_window is None:
            limit = self._lm_config["max_length"]
            if self.position == "learned" and tokens.shape[1] > limit:
                _checks.fail(
                    "token_ids",
                    f"at most max_length={limit} tokens for position='learned'",
                    tokens.shape[1],
                )
            logits = tf.cast(self(tokens), tf.float32)[:, :-1]
            return _loop.next_token_log_probs(logits, tokens[:, 1:]).numpy()
        rolling = self.check_streaming(cache_window, sink_tokens)
        batch, length = tokens.shape
        key = ("score", batch, length, jit_compile, rolling)
        read = self._compiled(
            key,
            lambda: _loop.compile_scoring(self, batch, length, jit_compile, rolling),
        )
        first = min(length - 1, rolling[1])
        return read(tf.constant(tokens[:, :first]), tf.constant(tokens)).numpy()

    def generate(
        self,
        prompt_ids,
        max_new_tokens,
        sampler="greedy",
        temperature=1.0,
        top_k=50,
        top_p=0.9,
        seed=None,
        stop_token_ids=None,
        use_cache=True,
        pad_token_id=0,
        jit_compile=False,
        compiled_loop=None,
        cache_window=None,
        sink_tokens=4,
    ):
        """Prompts followed by generated tokens, `(B, P + max_new_tokens)`.

        By default the whole decoding runs as one compiled function
        (`compiled_loop`): the prompts' common length prefilled in one pass,
        then every step and the sampler inside one `tf.while_loop`, with no
        Python per token. It gives the tokens of the step-by-step loop the
        exported models decode with (`compiled_loop=False`), greedy and
        seeded sampling alike.

        Args:
            prompt_ids: int array `(B, P)`, or a list of token lists of
                different lengths (right-padded with `pad_token_id`; each row
                continues right after its own prompt, at its true positions).
            max_new_tokens: int >= 1, new tokens per row.
            sampler: `"greedy"`, `"random"`, `"top_k"` or `"top_p"`
                (nucleus), or a `keras_posenc.samplers.Sampler` instance
                (then `temperature`, `top_k` and `top_p` are its own).
            temperature: float > 0, divides the logits before sampling.
            top_k: int >= 1, the candidates of `"top_k"`.
            top_p: float in (0, 1], the probability mass of `"top_p"`.
            seed: int or None, seeds the sampler (same seed, same tokens).
            stop_token_ids: token ids that end a row (kept in the output);
                the slots after them hold `pad_token_id`.
            use_cache: bool, decode with the key/value cache (one token per
                step) or recompute the whole sequence every step; both give
                the same tokens.
            pad_token_id: int, fills padding and the slots after a stop token.
            jit_compile: bool, compile the loop (or the step) with XLA.
                Defaults to `False` (a graph, traced once).
            compiled_loop: None, True or False. True: the compiled loop (the
                sampler must define `compiled_next_tokens`, as every named one
                does); False: a Python loop calling one compiled step per
                token; None (default): the compiled loop when the sampler
                has it.
            cache_window: None, or int >= 1: decode through a rolling cache
                (attention sinks, Xiao et al. 2023) of the first
                `sink_tokens` and the last `cache_window` tokens, at
                positions inside the cache, so generation runs past
                `max_length` at fixed memory. For models whose positions
                live in the attention (`check_streaming`); with the cache
                and the compiled loop.
            sink_tokens: int >= 0, the first tokens a rolling cache keeps.
                Defaults to `4` (read only with `cache_window`).

        Returns:
            An int32 NumPy array `(B, P + max_new_tokens)`.
        """
        prompts, lengths = generation.check_prompts(prompt_ids, pad_token_id)
        generation.check_vocabulary(prompts, lengths, self._lm_config["vocab_size"])
        options = generation.sampling_options(
            max_new_tokens,
            sampler,
            temperature,
            top_k,
            top_p,
            seed,
            stop_token_ids,
            pad_token_id,
        )
        use_cache = _checks.boolean("use_cache", use_cache)
        if not use_cache and self.reads_current_length:
            _checks.fail(
                "use_cache",
                "True for a rotary type whose frequencies read the current "
                "length ('dynamic', 'longrope')",
                use_cache,
                fix="A recompute would re-read earlier tokens at the new "
                "length, which cached decoding (and every export) cannot",
            )
        jit_compile = _checks.boolean("jit_compile", jit_compile)
        batch, total = len(lengths), prompts.shape[1] + options["max_new_tokens"]
        rolling = None
        _checks.positive_int("sink_tokens", sink_tokens, minimum=0)
        if cache_window is not None:
            rolling = self.check_streaming(cache_window, sink_tokens)
            for name, value, why in (
                ("use_cache", use_cache, "a rolling cache is a cache"),
                ("compiled_loop", compiled_loop, "the step loop has no rolling cache"),
            ):
                if value is False:
                    _checks.fail(name, f"True with cache_window ({why})", value)
        reach = total if rolling is None else rolling[1]  # the largest position + 1
        limit = self._lm_config["max_length"]
        if self.position == "learned" and prompts.shape[1] > limit:
            _checks.fail(
                "prompt_ids",
                f"prompts of at most max_length={limit} tokens for "
                "position='learned' (its table ends at max_length)",
                f"a prompt of {prompts.shape[1]} tokens",
            )
        for layer in nested_layers(self):
            if isinstance(layer, RotaryEmbedding) and layer.max_position is not None:
                if reach > layer.max_position:
                    _checks.fail(
                        "max_new_tokens",
                        f"at most {layer.max_position - prompts.shape[1]} here: "
                        f"xPos (xpos_scale_base={layer.xpos_scale_base}) scales "
                        f"leave float32 from position {layer.max_position}",
                        max_new_tokens,
                    )
        if self.position == "learned" and total > limit:
            _checks.fail(
                "max_new_tokens",
                f"at most max_length - prompt length = {limit - prompts.shape[1]} "
                "for position='learned' (its table ends at max_length)",
                max_new_tokens,
            )
        sampler = samplers.get(
            options["sampler"],
            options["temperature"],
            options["top_k"],
            options["top_p"],
        )
        if compiled_loop is None:
            compiled_loop = sampler.compiles
        if rolling is not None and not sampler.compiles:
            _checks.fail(
                "sampler",
                "a Sampler with compiled_next_tokens for cache_window (only the "
                "compiled loop streams)",
                sampler,
            )
        if _checks.boolean("compiled_loop", compiled_loop):
            decode = self.compiled_loop(
                batch, total, use_cache, jit_compile, sampler, rolling
            )
            draws = (
                1
                if isinstance(sampler, samplers.GreedySampler)
                else (options["max_new_tokens"])
            )
            uniforms = _loop.uniforms(options["seed"], range(batch), draws)
            start = int(lengths.min())
            if rolling is not None:  # the prefill fills the cache at most
                start = min(start, rolling[1])
            out = np.full((batch, total), options["pad_token_id"], np.int32)
            out[:, : prompts.shape[1]] = prompts
            tokens = decode(
                tf.constant(prompts[:, :start]),
                tf.constant(out),
                tf.constant(lengths),
                tf.constant(options["max_new_tokens"]),
                tf.constant(uniforms, tf.float64),
                tf.constant(np.array(options["stop_token_ids"], np.int32).reshape(-1)),
                tf.constant(options["pad_token_id"]),
            )
            return tokens.numpy()
        prefill, step = _steps.decoding_steps(
            self, batch, total, use_cache, jit_compile
        )
        return generation.generate_tokens(prefill, step, prompts, lengths, **options)


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
