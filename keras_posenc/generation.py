"""Token generation shared by Keras models and TFLite interpreters.

Two options objects, each defined and checked here once and taken the same
way by every entry point (`CausalLM.generate` and `score`,
`tflite_export.generate_tflite`, `tflite_export.convert_causal_lm`,
`generate_tokens` and the export CLI): `Sampling` (how each new token is
chosen) and `Streaming` (a rolling cache with attention sinks), each the one
form of its options.

`generate_tokens` runs the decoding loop on two callables, `prefill` and
`step`, so the Keras model (with or without its KV cache) and the exported
LiteRT / TFLM models decode with one loop and one set of samplers.
"""

import dataclasses
import numbers

import numpy as np

from keras_posenc import _checks, samplers

#: The samplers `generate` takes by name (`keras_posenc.samplers.SAMPLERS`);
#: a `keras_posenc.samplers.Sampler` instance is taken too.
SAMPLERS = tuple(samplers.SAMPLERS)
#: The smallest `temperature`: below it the scaled logits overflow float64
#: (use `sampler="greedy"` for the limit of a temperature going to 0).
MIN_TEMPERATURE = samplers.MIN_TEMPERATURE


def check_prompts(prompt_ids, pad_token_id=0):
    """`(prompts (B, P) int32, lengths (B,))` from a 2-D array or a list of lists.

    Rows of a list may differ in length (they are right-padded with
    `pad_token_id`); every prompt has at least one token.
    """
    rows = prompt_ids
    if hasattr(rows, "numpy"):
        rows = rows.numpy()
    if isinstance(rows, np.ndarray):
        if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
            _checks.fail(
                "prompt_ids",
                "integer token ids (B, P) or a list of token lists",
                f"an array of shape {rows.shape} and dtype {rows.dtype}",
            )
        rows = rows.tolist()
    if not isinstance(rows, (list, tuple)) or not rows:
        _checks.fail("prompt_ids", "a non-empty batch of prompts", prompt_ids)
    if not all(isinstance(row, (list, tuple, np.ndarray)) for row in rows):
        _checks.fail("prompt_ids", "a list of token lists", prompt_ids, error=TypeError)
    for row in rows:
        for token in row:
            if not _is_int(token):
                _checks.fail(
                    "prompt_ids",
                    "integer token ids (a float id is never truncated)",
                    token,
                    error=TypeError,
                )
    pad_token_id = _integer("pad_token_id", pad_token_id)
    lengths = np.array([len(row) for row in rows], dtype=np.int32)
    if lengths.min() < 1:
        _checks.fail("prompt_ids", "prompts of at least one token", lengths.tolist())
    prompts = np.full((len(rows), lengths.max()), pad_token_id, dtype=np.int32)
    for b, row in enumerate(rows):
        prompts[b, : len(row)] = row
    return prompts, lengths


def check_vocabulary(prompts, lengths, vocab_size, name="prompt_ids"):
    """Every real token (not padding) of argument `name` is an id in `[0, V)`."""
    real = np.arange(prompts.shape[1])[None, :] < lengths[:, None]
    bad = real & ((prompts < 0) | (prompts >= vocab_size))
    if bad.any():
        row, column = np.argwhere(bad)[0]
        _checks.fail(
            name,
            f"token ids in [0, vocab_size={vocab_size})",
            int(prompts[row, column]),
            fix=f"Found at row {row}, position {column}",
        )


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How generation chooses each new token: the sampling options' one home.

    Checked when made (a `ValueError`/`TypeError` naming the field), so an
    entry point receives it whole.

    Args:
        sampler: `"greedy"`, `"random"`, `"top_k"`, `"top_p"` (nucleus) or a
            `keras_posenc.samplers.Sampler` (then the next three are its own).
        temperature: float >= `MIN_TEMPERATURE`, divides the logits.
        top_k: int >= 1, the candidates of `"top_k"`.
        top_p: float in (0, 1], the probability mass of `"top_p"`.
        seed: int >= 0 or None; the same seed gives the same tokens.
        stop_token_ids: token ids that end a row (kept in the output).
        pad_token_id: int, fills padding and the slots after a stop token.

    Example:
    >>> from keras_posenc.generation import Sampling
    >>> Sampling("top_k", top_k=5, seed=1, stop_token_ids=[2]).stop_token_ids
    (2,)
    """

    sampler: object = "greedy"
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.9
    seed: object = None
    stop_token_ids: tuple = ()
    pad_token_id: int = 0

    def __post_init__(self):
        if not isinstance(self.sampler, samplers.Sampler):
            _checks.choice("sampler", self.sampler, SAMPLERS)
        else:
            self._check_sampler_owns_its_settings()
        seed = self.seed
        if seed is not None:
            seed = _checks.positive_int("seed", seed, minimum=0)
        checked = dict(
            temperature=samplers.check_temperature(self.temperature),
            top_k=_checks.positive_int("top_k", self.top_k),
            top_p=samplers.check_top_p(self.top_p),
            seed=seed,
            stop_token_ids=tuple(_stop_tokens(self.stop_token_ids)),
            pad_token_id=_integer("pad_token_id", self.pad_token_id),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def _check_sampler_owns_its_settings(self):
        """A `Sampler` object carries its own temperature, k and p: the
        fields that would be ignored must keep their defaults."""
        for field in dataclasses.fields(self):
            if field.name not in OWN_SETTINGS:
                continue
            value = getattr(self, field.name)
            if value != field.default:
                _checks.fail(
                    field.name,
                    f"left at its default ({field.default}) with a Sampler "
                    f"object: {type(self.sampler).__name__} chooses with its own",
                    value,
                    fix="Set it on the sampler, or pass the sampler's name",
                )

    def options(self, max_new_tokens):
        """The plain dict `generate_tokens` and the interpreters' loops read:
        the fields and `max_new_tokens`."""
        return dict(
            max_new_tokens=_checks.positive_int("max_new_tokens", max_new_tokens),
            sampler=self.sampler,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop_token_ids=list(self.stop_token_ids),
            pad_token_id=self.pad_token_id,
        )


@dataclasses.dataclass(frozen=True)
class Streaming:
    """A rolling cache with attention sinks: the streaming options' one home.

    The cache keeps the first `sink_tokens` tokens and the last
    `cache_window`, at positions inside the cache (Xiao et al. 2023), so a
    model generates, scores or runs on the device past its `max_length` at
    fixed memory.

    Args:
        cache_window: int >= 1, the recent tokens the cache keeps.
        sink_tokens: int >= 0, the first tokens it keeps. Defaults to `4`.

    Example:
    >>> from keras_posenc.generation import Streaming
    >>> Streaming(60).slots
    64
    """

    cache_window: int
    sink_tokens: int = 4

    def __post_init__(self):
        window = _checks.positive_int("cache_window", self.cache_window)
        sinks = _checks.positive_int("sink_tokens", self.sink_tokens, minimum=0)
        object.__setattr__(self, "cache_window", window)
        object.__setattr__(self, "sink_tokens", sinks)

    @property
    def slots(self):
        """The cache length: `sink_tokens + cache_window`."""
        return self.sink_tokens + self.cache_window


#: The `Sampling` fields a `Sampler` object carries itself.
OWN_SETTINGS = ("temperature", "top_k", "top_p")
#: `Sampling`'s fields, the keys of its `options` dict but `max_new_tokens`.
SAMPLING_FIELDS = tuple(field.name for field in dataclasses.fields(Sampling))


def sampling_from(sampling=None):
    """The `Sampling` an entry point's `sampling=` argument means: itself, or
    greedy for None; anything else is a `TypeError` naming `sampling`."""
    if sampling is None:
        return Sampling()
    if not isinstance(sampling, Sampling):
        _checks.fail(
            "sampling",
            "None or a keras_posenc.generation.Sampling",
            f"a {type(sampling).__name__}: {sampling!r}",
            error=TypeError,
            fix="Pass sampling=Sampling(...) (e.g. Sampling('top_k', top_k=5))",
        )
    return sampling


def streaming_from(streaming=None):
    """The `Streaming` (or None) an entry point's `streaming=` argument means;
    anything else is a `TypeError` naming `streaming`."""
    if streaming is not None and not isinstance(streaming, Streaming):
        _checks.fail(
            "streaming",
            "None or a keras_posenc.generation.Streaming",
            f"a {type(streaming).__name__}: {streaming!r}",
            error=TypeError,
            fix="Pass streaming=Streaming(cache_window, sink_tokens=4)",
        )
    return streaming


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(name, value):
    if not _is_int(value):
        _checks.fail(name, "an integer", value, error=TypeError)
    return int(value)


def _stop_tokens(value):
    """None, one id, or ids in a list, tuple or 1-D array -> a list of ints."""
    if value is None:
        return []
    if _is_int(value):
        return [int(value)]
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else value
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        _checks.fail(
            "stop_token_ids",
            "None, a token id, or a list of integer token ids",
            value,
            error=TypeError,
        )
    return [int(v) for v in value]


def sample(logits, sampler, temperature, top_k, top_p, rng):
    """Next tokens `(B,)` from float logits `(B, V)` (NumPy).

    `sampler` is a name, a `Sampler` or `samplers.serialize`'s dict; `rng` a
    NumPy `Generator` for every row, or a list of one per row.
    """
    return samplers.get(sampler, temperature, top_k, top_p)(logits, rng)


def generate_tokens(
    prefill,
    step,
    prompts,
    lengths,
    max_new_tokens,
    sampling=None,
    rows=None,
):
    """The decoding loop: `(B, P + max_new_tokens)` prompts and new tokens.

    `prefill(tokens (B, T))` returns the logits `(B, V)` of the last of the
    `T` tokens at positions `0 .. T-1`; `step(tokens (B, 1), t)` those of one
    token at position `t`. `sampling` is a `Sampling` (None: greedy), checked
    where the user passed it. Each row continues right after its
    own prompt; slots past its `max_new_tokens` new tokens or its stop token
    hold `pad_token_id` (any integer, -1 included: a finished row feeds the
    model token 0, whose logits are never read). Each row samples from its
    own random stream, seeded by `(seed, row)` with `rows` the rows' indices
    in the caller's batch (default `0 .. B-1`), and draws only when it takes
    a new token, so a row's tokens do not depend on the batch it is decoded
    in (nor on the other prompts' lengths) and equal prompts still draw
    different samples.
    """
    options = sampling_from(sampling).options(max_new_tokens)
    sampler, temperature, top_k, top_p, seed, stop_token_ids, pad_token_id = (
        options[name] for name in SAMPLING_FIELDS
    )
    batch, prompt_length = prompts.shape
    total = prompt_length + max_new_tokens
    out = np.full((batch, total), pad_token_id, dtype=np.int32)
    out[:, :prompt_length] = prompts
    stops = np.array(sorted(set(stop_token_ids or ())), dtype=np.int32)
    rows = range(batch) if rows is None else rows
    rngs = [np.random.default_rng(None if seed is None else [seed, r]) for r in rows]
    end = lengths + max_new_tokens  # first slot after each row's new tokens
    done = np.zeros(batch, dtype=bool)
    start = int(lengths.min())
    chooser = samplers.get(sampler, temperature, top_k, top_p)
    logits = prefill(out[:, :start])
    for t in range(start, total):
        prompted = t < lengths
        active = ~prompted & ~done & (t < end)
        # Only rows that take a new token draw: a row's stream then does not
        # depend on the other prompts' lengths (it equals decoding it alone).
        chosen = np.zeros(batch, dtype=np.int32)
        drawing = np.flatnonzero(active)
        if drawing.size:
            picked = [rngs[i] for i in drawing]
            chosen[drawing] = chooser(np.asarray(logits)[drawing], picked)
        out[:, t] = np.where(
            prompted, out[:, t], np.where(active, chosen, pad_token_id)
        )
        done |= active & np.isin(chosen, stops)
        if np.all(done | (t + 1 >= end)) or t + 1 == total:
            break
        fed = np.where(prompted | active, out[:, t], 0)  # finished rows: id 0
        logits = step(fed[:, None].astype(np.int32), t)
    return out
