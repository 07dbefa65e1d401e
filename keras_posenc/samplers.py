"""Samplers: the next tokens from logits, one small class per rule.

`CausalLM.generate`, `tflite_export.generate_tflite` and the TFLM worker's
loop take `sampler=` as a name in `SAMPLERS` or as a `Sampler` instance, so
adding a sampler is adding a class (as keras-hub's `Sampler.get_next_token`).
Samplers work on NumPy float64 logits `(B, V)` and one NumPy `Generator` per
row, so a row's draws do not depend on the batch it is decoded in.

A sampler that also defines `compiled_next_tokens(logits, uniforms)` (the same
rule in TensorFlow ops, reading one uniform draw per row where the NumPy rule
calls `rng.random()` once) runs inside `CausalLM.generate`'s compiled loop
(`tf.while_loop`, graph or XLA) and gives the NumPy loop's tokens: the loop
hands row `r` the values its `default_rng([seed, r])` stream would give, in
order. Every sampler here does; a sampler with only `next_tokens` decodes
through the step-by-step loop.
"""

import importlib
import numbers

import numpy as np

from keras_posenc import _checks


class Sampler:
    """Base class: `sampler(logits (B, V), rngs) -> (B,) int32` next tokens.

    A subclass implements `next_tokens(logits, rngs)` (float64 logits, one
    `numpy.random.Generator` per row), optionally `compiled_next_tokens(logits,
    uniforms)` (TensorFlow float64 logits `(B, V)` and one uniform in [0, 1)
    per row, `(B,)`, the value the NumPy rule's single `rng.random()` call
    would return; int32 tokens `(B,)`), and, when its constructor takes
    arguments, `get_config()` returning them, so a sampler crosses to a
    TFLM child process as `serialize(sampler)` (its class must then be
    importable: defined in a module, not in `__main__`).

    Example:

    >>> import numpy as np
    >>> from keras_posenc import samplers
    >>> class Lowest(samplers.Sampler):
    ...     def next_tokens(self, logits, rngs):
    ...         return np.argmin(logits, axis=-1).astype(np.int32)
    >>> Lowest()(np.array([[0.1, -3.0, 2.0]]), [np.random.default_rng(0)])
    array([1], dtype=int32)
    """

    #: Whether `compiled_next_tokens` reads its uniforms (the compiled loop
    #: then draws one per new token and row; a deterministic rule sets False).
    uses_uniforms = True

    def __call__(self, logits, rngs):
        logits = np.asarray(logits, dtype=np.float64)
        if isinstance(rngs, np.random.Generator):
            rngs = [rngs] * len(logits)
        return np.asarray(self.next_tokens(logits, rngs), dtype=np.int32)

    def next_tokens(self, logits, rngs):
        raise NotImplementedError(
            f"{type(self).__name__} must define next_tokens(logits, rngs)"
        )

    def compiled_next_tokens(self, logits, uniforms):
        """The rule in TensorFlow ops, for the compiled decoding loop (optional)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no compiled_next_tokens(logits, uniforms)"
        )

    @property
    def compiles(self):
        """Whether the class defines `compiled_next_tokens`."""
        return type(self).compiled_next_tokens is not Sampler.compiled_next_tokens

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class GreedySampler(Sampler):
    """The most likely token (ties: the lowest id)."""

    uses_uniforms = False

    def next_tokens(self, logits, rngs):
        return np.argmax(logits, axis=-1)

    def compiled_next_tokens(self, logits, uniforms):
        import tensorflow as tf

        return tf.argmax(logits, axis=-1, output_type=tf.int32)


class RandomSampler(Sampler):
    """A draw from `softmax(logits / temperature)` over the kept tokens.

    Subclasses narrow the candidates with `keep(probabilities)` on the
    probabilities ranked best first.

    Args:
        temperature: float >= 1e-6, divides the logits. Defaults to `1.0`.
    """

    def __init__(self, temperature=1.0):
        self.temperature = check_temperature(temperature)

    def next_tokens(self, logits, rngs):
        logits = logits / self.temperature
        order = np.argsort(-logits, axis=-1, kind="stable")  # best first
        ranked = np.take_along_axis(logits, order, axis=-1)
        probs = np.exp(ranked - ranked[:, :1])
        probs /= probs.sum(axis=-1, keepdims=True)
        probs = np.where(self.keep(probs), probs, 0.0)
        cdf = np.cumsum(probs, axis=-1)
        cdf /= cdf[:, -1:]
        # One uniform per row, inverted through the ranked distribution (what
        # `rng.choice(V, p=...)` does, so the compiled loop can do it too).
        uniforms = np.array([r.random() for r in rngs])
        picks = [np.searchsorted(c, u, side="right") for c, u in zip(cdf, uniforms)]
        return order[np.arange(len(picks)), picks]

    def compiled_next_tokens(self, logits, uniforms):
        import tensorflow as tf

        logits = logits / self.temperature
        order = tf.argsort(-logits, axis=-1, stable=True)
        ranked = tf.gather(logits, order, batch_dims=1)
        probs = tf.exp(ranked - ranked[:, :1])
        probs /= tf.reduce_sum(probs, axis=-1, keepdims=True)
        probs = tf.where(self.compiled_keep(probs), probs, tf.zeros_like(probs))
        cdf = tf.cumsum(probs, axis=-1)
        cdf /= cdf[:, -1:]
        picks = tf.searchsorted(cdf, uniforms[:, None], side="right")[:, 0]
        picks = tf.minimum(picks, tf.shape(order)[-1] - 1)  # a rounding guard
        return tf.gather(order, picks, batch_dims=1)

    def keep(self, probabilities):
        """Boolean `(B, V)`: which ranked candidates may be drawn (all)."""
        return np.ones_like(probabilities, dtype=bool)

    def compiled_keep(self, probabilities):
        """`keep` in TensorFlow ops (a `tf.Tensor` of ranked probabilities)."""
        import tensorflow as tf

        return tf.ones_like(probabilities, dtype=tf.bool)

    def get_config(self):
        return {"temperature": self.temperature}


class TopKSampler(RandomSampler):
    """A draw among the `k` most likely tokens.

    Args:
        k: int >= 1. Defaults to `50`.
        temperature: as `RandomSampler`. Defaults to `1.0`.
    """

    def __init__(self, k=50, temperature=1.0):
        super().__init__(temperature)
        self.k = _checks.positive_int("top_k", k)

    def keep(self, probabilities):
        return np.arange(probabilities.shape[-1])[None, :] < self.k

    def compiled_keep(self, probabilities):
        import tensorflow as tf

        return tf.range(tf.shape(probabilities)[-1])[None, :] < self.k

    def get_config(self):
        return {"k": self.k, **super().get_config()}


class TopPSampler(RandomSampler):
    """A draw from the smallest head of the ranking whose mass reaches `p` (nucleus).

    Args:
        p: float in (0, 1]. Defaults to `0.9`.
        temperature: as `RandomSampler`. Defaults to `1.0`.
    """

    def __init__(self, p=0.9, temperature=1.0):
        super().__init__(temperature)
        self.p = check_top_p(p)

    def keep(self, probabilities):
        return np.cumsum(probabilities, axis=-1) - probabilities < self.p

    def compiled_keep(self, probabilities):
        import tensorflow as tf

        return tf.cumsum(probabilities, axis=-1) - probabilities < self.p

    def get_config(self):
        return {"p": self.p, **super().get_config()}


#: The smallest `temperature`: below it the scaled logits overflow float64.
MIN_TEMPERATURE = 1e-6
#: The samplers `generate` takes by name.
SAMPLERS = {
    "greedy": GreedySampler,
    "random": RandomSampler,
    "top_k": TopKSampler,
    "top_p": TopPSampler,
}


def check_temperature(temperature):
    """`temperature` as a float >= `MIN_TEMPERATURE`, or the error naming it."""
    temperature = _checks.positive_float("temperature", temperature)
    if temperature < MIN_TEMPERATURE:
        _checks.fail(
            "temperature",
            f"a number >= {MIN_TEMPERATURE}",
            temperature,
            fix="Use sampler='greedy' for the most likely token",
        )
    return temperature


def check_top_p(top_p):
    """`top_p` as a float in (0, 1], or the error naming it."""
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
        _checks.fail("top_p", "a float in (0, 1]", top_p, error=TypeError)
    if not 0.0 < top_p <= 1.0:
        _checks.fail("top_p", "a float in (0, 1]", top_p)
    return float(top_p)


def get(sampler, temperature=1.0, top_k=50, top_p=0.9):
    """A `Sampler` from a name (built with the arguments it reads), an
    instance (returned as is) or `serialize`'s dict."""
    if isinstance(sampler, Sampler):
        return sampler
    if isinstance(sampler, dict):
        return deserialize(sampler)
    if sampler not in SAMPLERS:
        _checks.fail("sampler", f"one of {tuple(SAMPLERS)} or a Sampler", sampler)
    if sampler == "greedy":
        return GreedySampler()
    if sampler == "top_k":
        return TopKSampler(top_k, temperature)
    if sampler == "top_p":
        return TopPSampler(top_p, temperature)
    return RandomSampler(temperature)


def serialize(sampler):
    """`{"module", "class_name", "config"}` (JSON) of a sampler instance."""
    cls = type(sampler)
    if cls.__module__ == "__main__":
        _checks.fail(
            "sampler",
            "a Sampler whose class a child process can import (defined in a "
            "module, not in __main__)",
            sampler,
        )
    return {
        "module": cls.__module__,
        "class_name": cls.__qualname__,
        "config": sampler.get_config(),
    }


def deserialize(config):
    """The sampler `serialize` described (its module is imported)."""
    cls = importlib.import_module(config["module"])
    for name in config["class_name"].split("."):
        cls = getattr(cls, name)
    return cls.from_config(config["config"])
