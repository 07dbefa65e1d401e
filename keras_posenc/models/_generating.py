"""Generation and scoring for `CausalLM`: the compiled loops and their entries.

A mixin of `CausalLM`'s decoding methods: `generate` (the compiled loop of
`_loop.py`, or the step loop of `_steps.py` the interpreters share),
`score`, the streaming checks, and the cache of compiled functions.
"""

import collections
import types

import numpy as np

from keras_posenc import _checks, generation, samplers
from keras_posenc._backend import FLOAT64, to_numpy, xp
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.models import _loop, _steps, capabilities
from keras_posenc.utils import nested_layers

#: How many compiled `(prefill, step)` pairs a `CausalLM` keeps.
MAX_COMPILED_STEPS = 8


class Generating:
    """`CausalLM`'s generation methods (a mixin).

    It reads the model's `call_with_cache`, `empty_cache`, `max_length`,
    `reads_current_length` and its stack (`_parts.stack`).
    """

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

    def check_streaming(self, streaming):
        """`(sink_tokens, slots)` of a rolling cache, or the error naming why not.

        `streaming` is a `keras_posenc.generation.Streaming`; refused for a
        model whose
        positions a rolling cache cannot hold
        (`TransformerStack.streaming_blocker`: absolute encodings such as
        `learned`, generators, the recursive stream, gated fusion, a shared
        bias, CoPE, block-local windows, length-dependent rotary types,
        quantize=True).
        """
        streaming = generation.streaming_from(streaming)
        cache_window, sink_tokens = streaming.cache_window, streaming.sink_tokens
        blocker = self._parts.stack.streaming_blocker()
        if blocker is not None:
            _checks.fail(
                "streaming",
                "None for this model: a rolling cache keeps positions inside "
                f"the cache, which {blocker} cannot read",
                streaming,
                fix="Stream with a method whose positions live in the attention "
                f"({', '.join(capabilities.streaming_methods())})",
            )
        return sink_tokens, sink_tokens + cache_window

    def score(self, token_ids, streaming=None, jit_compile=False):
        """Log-probability of each next token, `(B, T - 1)` float32 NumPy.

        Entry `[b, t]` is `log p(token_ids[b, t + 1] | token_ids[b, :t + 1])`
        (natural log; bits are `-score / ln 2`). Without `streaming`, one
        pass over the whole sequence. With a `Streaming`, the tokens are read
        one at a time through its rolling cache (the prefix that fits
        prefilled in one pass, the rest inside one compiled
        `tf.while_loop`): the model reads a text of any length at fixed
        memory, as it would stream it.

        Args:
            token_ids: int array `(B, T)`, `T >= 2`, ids in `[0, vocab_size)`.
            streaming: None, or a `keras_posenc.generation.Streaming`.
            jit_compile: bool, compile the streaming loop with XLA.
        """
        streaming = generation.streaming_from(streaming)
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
        tokens = tokens.astype(np.int32)
        if streaming is None:
            limit = self.max_length
            if self.position == "learned" and tokens.shape[1] > limit:
                _checks.fail(
                    "token_ids",
                    f"at most max_length={limit} tokens for position='learned'",
                    tokens.shape[1],
                )
            logits = xp.cast(self.logits(tokens), xp.float32)[:, :-1]
            return to_numpy(_loop.next_token_log_probs(logits, tokens[:, 1:]))
        rolling = self.check_streaming(streaming)
        batch, length = tokens.shape
        key = ("score", batch, length, jit_compile, rolling)
        read = self._compiled(
            key,
            lambda: _loop.compile_scoring(self, batch, length, jit_compile, rolling),
        )
        first = min(length - 1, rolling[1])
        return to_numpy(read(xp.constant(tokens[:, :first]), xp.constant(tokens)))

    def generate(
        self,
        prompt_ids,
        max_new_tokens,
        sampling=None,
        streaming=None,
        use_cache=True,
        jit_compile=False,
        compiled_loop=None,
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
                different lengths (right-padded with the pad token; each row
                continues right after its own prompt, at its true positions).
            max_new_tokens: int >= 1, new tokens per row.
            sampling: a `keras_posenc.generation.Sampling` (sampler,
                temperature, top-k/p, seed, stop and pad tokens), or None
                (greedy).
            streaming: a `keras_posenc.generation.Streaming`: decode through
                a rolling cache with attention sinks, past `max_length` at
                fixed memory (`check_streaming` says which models can).
            use_cache: bool, decode with the key/value cache or recompute
                the whole sequence every step (the same tokens).
            jit_compile: bool, compile the loop (or the step) with XLA.
            compiled_loop: None (the compiled loop when the sampler has
                `compiled_next_tokens`), True, or False (a Python loop
                calling one compiled step per token).

        Returns:
            An int32 NumPy array `(B, P + max_new_tokens)`.
        """
        streaming = generation.streaming_from(streaming)
        sampling = generation.sampling_from(sampling)
        prompts, lengths = generation.check_prompts(prompt_ids, sampling.pad_token_id)
        generation.check_vocabulary(prompts, lengths, self._lm_config["vocab_size"])
        options = sampling.options(max_new_tokens)
        flags = self._check_decoding(use_cache, jit_compile, compiled_loop, streaming)
        total = prompts.shape[1] + options["max_new_tokens"]
        self._check_reach(prompts.shape[1], total, flags.rolling, max_new_tokens)
        sampler = samplers.get(
            options["sampler"],
            options["temperature"],
            options["top_k"],
            options["top_p"],
        )
        if flags.rolling is not None and not sampler.compiles:
            _checks.fail(
                "sampler",
                "a Sampler with compiled_next_tokens for streaming (only the "
                "compiled loop streams)",
                sampler,
            )
        compiled = sampler.compiles if compiled_loop is None else compiled_loop
        if _checks.boolean("compiled_loop", compiled):
            return self._generate_compiled(prompts, lengths, options, sampler, flags)
        prefill, step = _steps.decoding_steps(
            self, len(lengths), total, flags.use_cache, flags.jit_compile
        )
        return generation.generate_tokens(
            prefill, step, prompts, lengths, options["max_new_tokens"], sampling
        )

    def _check_decoding(self, use_cache, jit_compile, compiled_loop, streaming):
        """`generate`'s checked flags and the rolling cache `(sink, slots)`."""
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
        rolling = None
        if streaming is not None:
            rolling = self.check_streaming(streaming)
            for name, value, why in (
                ("use_cache", use_cache, "a rolling cache is a cache"),
                ("compiled_loop", compiled_loop, "the step loop has no rolling cache"),
            ):
                if value is False:
                    _checks.fail(name, f"True with streaming ({why})", value)
        return types.SimpleNamespace(
            use_cache=use_cache, jit_compile=jit_compile, rolling=rolling
        )

    def _check_reach(self, prompt_length, total, rolling, max_new_tokens):
        """Refuses positions past what the model's tables reach: `learned`'s
        table, xPos' float32 scales (a rolling cache reaches its slots)."""
        reach = total if rolling is None else rolling[1]  # the largest position + 1
        limit = self.max_length
        if self.position == "learned" and prompt_length > limit:
            _checks.fail(
                "prompt_ids",
                f"prompts of at most max_length={limit} tokens for "
                "position='learned' (its table ends at max_length)",
                f"a prompt of {prompt_length} tokens",
            )
        for layer in nested_layers(self):
            if isinstance(layer, RotaryEmbedding) and layer.max_position is not None:
                if reach > layer.max_position:
                    _checks.fail(
                        "max_new_tokens",
                        f"at most {layer.max_position - prompt_length} here: "
                        f"xPos (xpos_scale_base={layer.xpos_scale_base}) scales "
                        f"leave float32 from position {layer.max_position}",
                        max_new_tokens,
                    )
        if self.position == "learned" and total > limit:
            _checks.fail(
                "max_new_tokens",
                f"at most max_length - prompt length = {limit - prompt_length} "
                "for position='learned' (its table ends at max_length)",
                max_new_tokens,
            )

    def _generate_compiled(self, prompts, lengths, options, sampler, flags):
        """`generate` in one compiled loop (`compiled_loop`).

        One trace per batch size and prompt-length bucket, whatever
        `max_new_tokens`: the loop's width, draws and stop list are padded to
        sizes that do not move with it (`_loop.capacity`).
        """
        batch, rolling = len(lengths), flags.rolling
        total = prompts.shape[1] + options["max_new_tokens"]
        width = _loop.capacity(total, self.max_length, flags.use_cache, rolling)
        decode = self.compiled_loop(
            batch, width, flags.use_cache, flags.jit_compile, sampler, rolling
        )
        draws = width if sampler.uses_uniforms else 1
        uniforms = _loop.uniforms(options["seed"], range(batch), draws)
        start = _loop.prefix_length(int(lengths.min()))
        if rolling is not None:  # the prefill fills the cache at most
            start = min(start, rolling[1])
        out = np.full((batch, width), options["pad_token_id"], np.int32)
        out[:, : prompts.shape[1]] = prompts
        tokens = decode(
            xp.constant(prompts[:, :start]),
            xp.constant(out),
            xp.constant(lengths),
            xp.constant(options["max_new_tokens"]),
            xp.constant(uniforms, FLOAT64),
            xp.constant(_loop.stop_list(options["stop_token_ids"])),
            xp.constant(options["pad_token_id"]),
        )
        return to_numpy(tokens)[:, :total]
