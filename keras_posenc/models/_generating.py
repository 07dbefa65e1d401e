"""Generation and scoring for `CausalLM`: the compiled loops and their entries.

A mixin of `CausalLM`'s decoding methods: `generate` (the compiled loop of
`_loop.py`, or the step loop of `_steps.py` the interpreters share),
`score`, the streaming checks, and the cache of compiled functions.
"""

import collections

import numpy as np
import tensorflow as tf

from keras_posenc import _checks, generation, samplers
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.models import _loop, _steps
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

    def check_streaming(self, cache_window, sink_tokens=4):
        """`(sink_tokens, slots)` of a rolling cache, or the error naming why not.

        `cache_window` (int >= 1) recent tokens plus `sink_tokens` (int >= 0)
        first ones; refused for a model whose positions a rolling cache cannot
        hold (`TransformerStack.streaming_blocker`: absolute encodings such as
        `learned`, generators, the recursive stream, gated fusion, a shared
        bias, CoPE, block-local windows, length-dependent rotary types,
        quantize=True).
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
                "(alibi, t5, clipped, dynamic_bias, kerple, fire, rope, xpos, fox, "
                "none)",
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
            logits = tf.cast(self.logits(tokens), tf.float32)[:, :-1]
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
            draws = options["max_new_tokens"] if sampler.uses_uniforms else 1
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
