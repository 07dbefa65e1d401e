"""Samplers: one class per rule, taken by name or instance by every loop."""

import numpy as np
import pytest

from keras_posenc import generation, samplers

LOGITS = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))


def draws(sampler, count=400, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([sampler(LOGITS, rng)[0] for _ in range(count)])


def test_random_sampler_draws_the_softmax_of_the_scaled_logits():
    picks = draws(samplers.RandomSampler(temperature=2.0), 2000)
    scaled = np.exp(np.log([0.5, 0.3, 0.15, 0.05]) / 2.0)
    want = scaled / scaled.sum()  # a NumPy oracle of softmax(logits / T)
    got = np.bincount(picks, minlength=4) / len(picks)
    np.testing.assert_allclose(got, want, atol=0.04)


def test_named_samplers_draw_the_same_tokens_as_their_classes():
    for name, instance in (
        ("top_k", samplers.TopKSampler(2, 1.5)),
        ("top_p", samplers.TopPSampler(0.7, 1.5)),
        ("random", samplers.RandomSampler(1.5)),
        ("greedy", samplers.GreedySampler()),
    ):
        named = samplers.get(name, temperature=1.5, top_k=2, top_p=0.7)
        np.testing.assert_array_equal(draws(named, 50), draws(instance, 50))
        again = samplers.deserialize(samplers.serialize(instance))
        np.testing.assert_array_equal(draws(again, 50), draws(instance, 50))


class Lowest(samplers.Sampler):
    """A sampler a test adds: the least likely token."""

    def next_tokens(self, logits, rngs):
        return np.argmin(logits, axis=-1)


def test_a_new_sampler_is_a_class_the_decoding_loop_takes():
    prompts, lengths = generation.check_prompts([[1, 2], [3]])

    def prefill(tokens):
        return np.tile(np.arange(5.0), (len(tokens), 1))

    def step(tokens, t):
        return np.tile(np.arange(5.0)[::-1], (len(tokens), 1))

    sampling = generation.Sampling(Lowest())
    out = generation.generate_tokens(prefill, step, prompts, lengths, 3, sampling)
    # The second row's first new token comes from the prefill (lowest: 0),
    # every later one from a step (lowest: 4).
    np.testing.assert_array_equal(out, [[1, 2, 4, 4, 4], [3, 0, 4, 4, 0]])
    assert samplers.deserialize(samplers.serialize(Lowest())).__class__ is Lowest


def test_bad_samplers_are_refused():
    with pytest.raises(ValueError, match="`sampler` must be one of"):
        generation.Sampling("beam")
    with pytest.raises(ValueError, match="`top_p` must be a float in"):
        samplers.TopPSampler(p=1.5)
    with pytest.raises(ValueError, match="`temperature` must be a number >= 1e-06"):
        samplers.RandomSampler(temperature=1e-9)
    with pytest.raises(NotImplementedError, match="must define next_tokens"):
        samplers.Sampler()(LOGITS, np.random.default_rng(0))

    class Local(samplers.Sampler):
        pass

    Local.__module__ = "__main__"  # as a class typed into a script
    with pytest.raises(ValueError, match="a Sampler whose class a child process"):
        samplers.serialize(Local())
