"""The decoding loop and its argument checks, shared by Keras and interpreters."""

import json

import numpy as np
import pytest

from keras_posenc import generation, samplers


def uniform_steps(vocab=7, seen=None):
    """`prefill`/`step` with equal logits; `seen` collects every fed token."""

    def prefill(tokens):
        if seen is not None:
            seen.extend(tokens.ravel().tolist())
        return np.zeros((tokens.shape[0], vocab))

    def step(tokens, index):
        if seen is not None:
            seen.extend(tokens.ravel().tolist())
        return np.zeros((tokens.shape[0], vocab))

    return prefill, step


@pytest.mark.parametrize(
    "prompt_ids", [[[1.7, 2.9]], [[1, 2.0]], [[True, 2]], [["3", 4]]]
)
def test_token_ids_that_are_not_integers_are_refused(prompt_ids):
    with pytest.raises(TypeError, match="prompt_ids"):
        generation.check_prompts(prompt_ids)


@pytest.mark.parametrize(
    "value, want",
    [
        (None, []),
        (5, [5]),
        (np.int64(5), [5]),
        ([3, 4], [3, 4]),
        (np.array([3, 4]), [3, 4]),
    ],
)
def test_stop_token_ids_take_one_id_or_a_list_of_ids(value, want):
    assert (
        generation.Sampling(stop_token_ids=value).options(3)["stop_token_ids"] == want
    )


@pytest.mark.parametrize("value", ["12", [1.9], 2.0, [[1, 2]]])
def test_stop_token_ids_that_are_not_ids_are_refused(value):
    with pytest.raises(TypeError, match="stop_token_ids"):
        generation.Sampling(stop_token_ids=value)


def test_numpy_scalars_are_accepted_and_come_back_as_json_numbers():
    options = generation.Sampling(
        "top_p",
        temperature=np.float32(0.5),
        top_k=np.int32(4),
        top_p=np.float64(0.5),
        seed=np.int64(3),
        stop_token_ids=np.array([2]),
        pad_token_id=np.int64(0),
    ).options(np.int64(3))
    assert json.loads(json.dumps(options)) == options
    assert options["temperature"] == 0.5 and options["seed"] == 3


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"seed": "abc"}, TypeError),
        ({"seed": -1}, ValueError),
        ({"seed": 1.5}, TypeError),
        ({"temperature": 1e-320}, ValueError),
        ({"pad_token_id": 0.5}, TypeError),
    ],
)
def test_bad_sampling_arguments_name_the_argument(kwargs, error):
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        generation.Sampling(**kwargs)


@pytest.mark.parametrize("rows", [[[1, 2]] * 3, [[1, 2, 3, 4, 5], [1], [2, 3]]])
def test_every_row_draws_from_its_own_seeded_stream(rows):
    prompts, lengths = generation.check_prompts(rows)
    prefill, step = uniform_steps()
    sampling = generation.Sampling("top_k", top_k=7, seed=4)
    batch = generation.generate_tokens(prefill, step, prompts, lengths, 12, sampling)
    # One seed: three different samples, not one sample thrice.
    assert len({tuple(row) for row in batch}) == 3
    # A row decoded alone (as the interpreters do) draws what it drew in the
    # batch, whatever the other prompts' lengths (a row draws only when it
    # takes a new token).
    for b in range(3):
        alone = generation.generate_tokens(
            prefill, step, prompts[b : b + 1], lengths[b : b + 1], 12, sampling, (b,)
        )
        np.testing.assert_array_equal(alone[0], batch[b])
    again = generation.generate_tokens(prefill, step, prompts, lengths, 12, sampling)
    np.testing.assert_array_equal(again, batch)


def test_finished_rows_feed_a_real_token_even_with_a_negative_pad_id():
    seen = []
    prompts, lengths = generation.check_prompts([[1, 2, 3], [4]], pad_token_id=-1)
    prefill, step = uniform_steps(seen=seen)
    sampling = generation.Sampling(pad_token_id=-1)
    out = generation.generate_tokens(prefill, step, prompts, lengths, 2, sampling)
    assert min(seen) >= 0  # the model never reads the pad id
    np.testing.assert_array_equal(out[1, 3:], [-1, -1])  # row 1 ended at slot 3
    np.testing.assert_array_equal(out[0, :3], [1, 2, 3])


def test_prompt_ids_outside_the_vocabulary_are_refused():
    prompts, lengths = generation.check_prompts([[1, 2], [3]], pad_token_id=-1)
    generation.check_vocabulary(prompts, lengths, 4)  # the -1 pad is not a token
    for bad in ([[1, 4]], [[-1, 2]]):
        prompts, lengths = generation.check_prompts(bad)
        with pytest.raises(ValueError, match="vocab_size=4"):
            generation.check_vocabulary(prompts, lengths, 4)


def test_sampling_is_checked_once_where_it_is_made():
    sampling = generation.Sampling("top_k", top_k=3, seed=np.int64(2), stop_token_ids=4)
    assert sampling.seed == 2 and sampling.stop_token_ids == (4,)
    assert generation.sampling_from(sampling) is sampling  # taken whole
    assert generation.sampling_from(None) == generation.Sampling()  # greedy
    assert sampling.options(5)["max_new_tokens"] == 5


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: generation.Sampling("beam"), ValueError, "sampler"),
        (lambda: generation.Sampling(top_k=0), ValueError, "top_k"),
        (lambda: generation.Sampling(temperature=0.0), ValueError, "temperature"),
        (lambda: generation.Sampling(top_p=1.5), ValueError, "top_p"),
        (lambda: generation.Sampling(seed=-1), ValueError, "seed"),
        (lambda: generation.Sampling(pad_token_id=0.5), TypeError, "pad_token_id"),
        (lambda: generation.Streaming(0), ValueError, "cache_window"),
        (lambda: generation.Streaming(4, sink_tokens=-1), ValueError, "sink_tokens"),
    ],
)
def test_bad_options_are_refused_naming_the_field(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("field, value", [("top_k", 7), ("temperature", 0.5)])
def test_a_sampler_objects_own_settings_are_not_given_twice(field, value):
    """`Sampling(TopKSampler(k=2), top_k=7)` ignored the 7: refused by name."""
    sampler = samplers.TopKSampler(k=2)
    with pytest.raises(ValueError, match=f"`{field}` must be left at its default"):
        generation.Sampling(sampler, **{field: value})
    assert generation.Sampling(sampler).sampler is sampler  # defaults: accepted


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: generation.sampling_from({"sampler": "top_k"}), "sampling"),
        (lambda: generation.sampling_from("top_k"), "sampling"),
        (lambda: generation.sampling_from(samplers.TopKSampler(2)), "sampling"),
        (lambda: generation.streaming_from({"cache_window": 8}), "streaming"),
        (lambda: generation.streaming_from(8), "streaming"),
        (lambda: generation.streaming_from(True), "streaming"),
    ],
)
def test_an_options_object_is_the_one_form_of_its_options(make, argument):
    """A dict, a sampler name or a window size is not the object: refused
    naming the argument the user passed (it once named `sampler` or
    `cache_window`, or was taken as an old form)."""
    with pytest.raises(TypeError, match=f"`{argument}` must be None or a "):
        make()


def test_options_objects_are_frozen_and_streaming_counts_its_slots():
    streaming = generation.Streaming(60)
    assert (streaming.cache_window, streaming.sink_tokens, streaming.slots) == (
        60,
        4,
        64,
    )
    with pytest.raises(AttributeError):
        streaming.cache_window = 8
    assert generation.streaming_from(streaming) is streaming
    assert generation.streaming_from() is None
