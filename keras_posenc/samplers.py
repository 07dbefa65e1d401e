"""Samplers: the next tokens from logits, one small class per rule.

`CausalLM.generate`, `tflite_export.generate_tflite` and the TFLM worker's
loop take `Sampling(sampler=...)` as a name in `SAMPLERS` or a `Sampler`, so
adding a sampler is adding a class (as keras-hub's `Sampler.get_next_token`).
Samplers work on NumPy float64 logits `(B, V)` and one NumPy `Generator` per
row, so a row's draws do not depend on the batch it is decoded in.

A sampler that also defines `compiled_next_tokens(logits, uniforms)` (the same
rule in TensorFlow ops, reading one uniform draw per row where the NumPy rule
calls `rng.random()` once) runs inside `CausalLM.generate`'s compiled loop
(`tf.while_loop`, graph or XLA) and gives the NumPy loop's tokens: the loop
hands row `r` the values its `default_rng([seed, r])` stream would give, in
order. Every sampler here does, its rule written once (`rule(ops, logits,
uniforms)`) on the array operations of NumPy or of TensorFlow; a sampler with
only `next_tokens` decodes through the step-by-step loop.
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


class _NumPyOps:
    """The array operations a rule reads, on NumPy arrays (the step loop and
    the TFLM child, which imports no TensorFlow)."""

    @staticmethod
    def rank(logits):
        """`(order, ranked)`: token ids best first and their logits `(B, V)`."""
        order = np.argsort(-logits, axis=-1, kind="stable")
        return order, np.take_along_axis(logits, order, axis=-1)

    exp = staticmethod(np.exp)

    @staticmethod
    def row_sum(x):
        return np.sum(x, axis=-1, keepdims=True)

    @staticmethod
    def cumsum(x):
        return np.cumsum(x, axis=-1)

    @staticmethod
    def kept(keep, x):
        return np.where(keep, x, 0.0)

    @staticmethod
    def places(x):
        """Each ranked candidate's place `(1, V)`: 0 for the best."""
        return np.arange(x.shape[-1])[None, :]

    @staticmethod
    def argmax(logits):
        return np.argmax(logits, axis=-1)

    @staticmethod
    def pick(order, cdf, uniforms):
        """The token whose ranked CDF interval holds each row's uniform."""
        picks = [np.searchsorted(c, u, side="right") for c, u in zip(cdf, uniforms)]
        picks = np.minimum(picks, order.shape[-1] - 1)  # a rounding guard
        return order[np.arange(len(picks)), picks]


class _TensorOps:
    """The same operations on the backend's tensors (the compiled loop:
    TensorFlow's graph or XLA, `jax.jit`, or PyTorch's eager tensors)."""

    def __init__(self):
        from keras_posenc._backend import xp

        self.tf = xp
        self.exp = xp.exp

    def rank(self, logits):
        order = self.tf.argsort(-logits, axis=-1, stable=True)
        return order, self.tf.gather(logits, order, batch_dims=1)

    def row_sum(self, x):
        return self.tf.reduce_sum(x, axis=-1, keepdims=True)

    def cumsum(self, x):
        return self.tf.cumsum(x, axis=-1)

    def kept(self, keep, x):
        return self.tf.where(keep, x, self.tf.zeros_like(x))

    def places(self, x):
        return self.tf.range(self.tf.shape(x)[-1])[None, :]

    def argmax(self, logits):
        return self.tf.argmax(logits, axis=-1, output_type=self.tf.int32)

    def pick(self, order, cdf, uniforms):
        picks = self.tf.searchsorted(cdf, uniforms[:, None], side="right")[:, 0]
        picks = self.tf.minimum(picks, self.tf.shape(order)[-1] - 1)
        return self.tf.gather(order, picks, batch_dims=1)


class GreedySampler(Sampler):
    """The most likely token (ties: the lowest id)."""

    uses_uniforms = False

    def next_tokens(self, logits, rngs):
        return self.rule(_NumPyOps, logits, None)

    def compiled_next_tokens(self, logits, uniforms):
        return self.rule(_TensorOps(), logits, uniforms)

    def rule(self, ops, logits, uniforms):
        """The rule, once, on `ops` (NumPy or TensorFlow arrays)."""
        return ops.argmax(logits)


class RandomSampler(Sampler):
    """A draw from `softmax(logits / temperature)` over the kept tokens.

    Subclasses narrow the candidates with `keep(ops, probabilities)` on the
    probabilities ranked best first. Each rule is written once, on the array
    operations `ops` of NumPy (`next_tokens`: one `rng.random()` a row) or of
    TensorFlow (`compiled_next_tokens`: the same uniforms, given).

    Args:
        temperature: float >= 1e-6, divides the logits. Defaults to `1.0`.
    """

    def __init__(self, temperature=1.0):
        self.temperature = check_temperature(temperature)

    def next_tokens(self, logits, rngs):
        uniforms = np.array([r.random() for r in rngs])
        return self.rule(_NumPyOps, logits, uniforms)

    def compiled_next_tokens(self, logits, uniforms):
        return self.rule(_TensorOps(), logits, uniforms)

    def rule(self, ops, logits, uniforms):
        """One uniform per row, inverted through the ranked distribution of
        the kept candidates (what `rng.choice(V, p=...)` does)."""
        order, ranked = ops.rank(logits / self.temperature)  # best first
        probs = ops.exp(ranked - ranked[:, :1])
        probs = probs / ops.row_sum(probs)
        probs = ops.kept(self.keep(ops, probs), probs)
        cdf = ops.cumsum(probs)
        return ops.pick(order, cdf / cdf[:, -1:], uniforms)

    def keep(self, ops, probabilities):
        """Boolean `(B, V)`: which ranked candidates may be drawn (all)."""
        return ops.places(probabilities) >= 0

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

    def keep(self, ops, probabilities):
        return ops.places(probabilities) < self.k

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

    def keep(self, ops, probabilities):
        return ops.cumsum(probabilities) - probabilities < self.p

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
