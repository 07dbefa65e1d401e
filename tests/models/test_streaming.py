"""Streaming: rolling caches (attention sinks) in `generate` and `score`."""

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import fast_only

from keras_posenc import RelativeMultiHeadAttention
from keras_posenc.generation import Streaming
from keras_posenc.models import METHODS, build_causal_lm

VOCAB = 17
#: The builder methods whose positions live in the attention, read from
#: their rows: no absolute encoding, generator, recursive stream or count.
STREAMING = tuple(
    name
    for name, row in METHODS.items()
    if row.input_positions is None
    and not (row.combined_input or row.recursive or row.contextual)
    and row.generator is None
)


def small(position, **kwargs):
    tf.keras.utils.set_random_seed(5)
    options = dict(hidden_dim=16, num_layers=2, num_heads=2, max_length=24)
    options.update(kwargs)
    return build_causal_lm(VOCAB, position=position, **builder_kwargs(**options))


def text(batch=2, length=30, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


#: One method per kind of producer that streams (`clipped` reads T5's
#: buckets, `kerple` ALiBi's distances and `xpos` RoPE's rotation; the
#: oracle below reads `xpos` and `fire` past the cache's length).
NEVER_ROLLS = ("none", "t5", "alibi", "dynamic_bias", "fire", "rope", "fox", "dape")


@pytest.mark.parametrize(
    "position", fast_only(NEVER_ROLLS, ("alibi", "rope"), per_kind=True)
)
def test_a_rolling_cache_that_never_rolls_is_the_full_cache(position):
    model = small(position, num_layers=1)
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]]
    full = model.generate(prompts, 12)
    rolling = model.generate(prompts, 12, streaming=Streaming(16, sink_tokens=2))
    np.testing.assert_array_equal(rolling, full)  # 18 slots hold all 17 tokens
    x = text(length=18)
    np.testing.assert_allclose(
        model.score(x, streaming=Streaming(14, sink_tokens=4)),
        model.score(x),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "position",
    fast_only(
        ("alibi", "t5", "rope", "fire", "xpos", "fox", "dape"),
        ("t5", "rope"),
        per_kind=True,
    ),
)
def test_one_layer_reads_its_rolling_cache_as_a_fresh_text(position):
    """The oracle: past the cache's length, a one-layer model's next-token
    log-probabilities are those of the same model on the text the cache
    holds (the sink tokens, then the window), read from position 0: keys
    and values of one layer depend only on their token, and the positions
    are the places inside the cache."""
    model = small(position, num_layers=1)
    sink, window = 2, 5
    x = text(length=26)
    streamed = model.score(x, streaming=Streaming(window, sink_tokens=sink))
    # The loop writes its caches in place: a second call starts afresh.
    again = model.score(x, streaming=Streaming(window, sink_tokens=sink))
    np.testing.assert_array_equal(again, streamed)
    for p in (6, 7, 8, 13, 24):  # the cache (7 slots) is full from p = 6
        held = np.concatenate([x[:, :sink], x[:, max(sink, p - window + 1) : p + 1]], 1)
        logits = model(held).numpy()[:, -1]
        want = np.take_along_axis(log_softmax(logits), x[:, p + 1 : p + 2], 1)[:, 0]
        np.testing.assert_allclose(streamed[:, p], want, atol=2e-5)


def test_score_is_the_log_probability_of_each_next_token():
    model = small("t5")
    x = text(length=9)
    logits = model(x).numpy().astype(np.float64)
    want = np.take_along_axis(log_softmax(logits[:, :-1]), x[:, 1:, None], 2)[..., 0]
    got = model.score(x)
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_generation_and_scoring_run_past_max_length_at_fixed_memory():
    model = small("alibi", max_length=8)
    streaming = Streaming(6, sink_tokens=2)
    out = model.generate([[1, 2, 3]], 40, streaming=streaming)
    assert out.shape == (1, 43)  # 5x max_length, through 8 cache slots
    again = model.generate([[1, 2, 3]], 40, streaming=Streaming(6, sink_tokens=2))
    np.testing.assert_array_equal(out, again)  # an equal Streaming, a fresh cache
    scores = model.score(text(length=64), streaming)
    assert scores.shape == (2, 63) and np.isfinite(scores).all()
    again = model.score(text(length=64), streaming=Streaming(6, sink_tokens=2))
    np.testing.assert_array_equal(scores, again)
    # A prompt longer than the cache: the rest of it streams in the loop.
    long = model.generate(
        [list(range(1, 12))], 5, streaming=Streaming(4, sink_tokens=1)
    )
    np.testing.assert_array_equal(long[0, :11], range(1, 12))
    assert model.compiled_loop(1, 16, rolling=(1, 5)).experimental_get_tracing_count()


def test_xla_streams_the_graphs_tokens():
    model = small("rope", num_layers=1)
    graph = model.generate([[1, 2]], 20, streaming=Streaming(5, sink_tokens=1))
    xla = model.generate(
        [[1, 2]], 20, streaming=Streaming(5, sink_tokens=1), jit_compile=True
    )
    np.testing.assert_array_equal(xla, graph)


@pytest.mark.parametrize(
    "position, options, match",
    [
        ("learned", {}, "streaming.*absolute position encoding"),
        ("hybrid", {}, "streaming.*absolute"),
        ("recursive", {}, "streaming.*recursive"),
        ("cope", {}, "streaming.*CoPE"),
        ("t5", {"share_position_bias": True}, "streaming.*share_position_bias"),
        ("t5", {"attention_window": 3}, "streaming.*attention_window"),
    ],
)
def test_models_a_rolling_cache_cannot_hold_are_refused(position, options, match):
    model = small(position, num_layers=1, **options)
    with pytest.raises(ValueError, match=match):
        model.generate([[1, 2]], 3, streaming=Streaming(4))
    with pytest.raises(ValueError, match=match):
        model.score(text(length=5), streaming=Streaming(4))
    cache = model.empty_cache(1, 6)
    with pytest.raises(ValueError, match="sink_tokens"):
        model.call_with_cache(np.ones((1, 1), "int32"), cache, 0, sink_tokens=1)


def test_a_rotary_scaling_that_reads_the_length_is_refused():
    from keras_posenc.utils import set_rope_scaling

    model = small("rope", num_layers=1)
    set_rope_scaling(
        model, "dynamic", scaling_factor=2.0, original_max_position_embeddings=24
    )
    with pytest.raises(ValueError, match="streaming.*'dynamic'"):
        model.generate([[1, 2]], 3, streaming=Streaming(4))
    cache = model.empty_cache(1, 6)
    with pytest.raises(ValueError, match="sink_tokens.*'dynamic'"):
        model.call_with_cache(np.ones((1, 1), "int32"), cache, 0, sink_tokens=1)


@pytest.mark.parametrize(
    "make, kwargs, error, match",
    [
        (lambda: Streaming(0), {}, ValueError, "cache_window"),
        (lambda: Streaming(4, sink_tokens=-1), {}, ValueError, "sink_tokens"),
        (lambda: Streaming(2.5), {}, TypeError, "cache_window"),
        (
            lambda: Streaming(4),
            dict(use_cache=False),
            ValueError,
            "use_cache.*streaming",
        ),
        (
            lambda: Streaming(4),
            dict(compiled_loop=False),
            ValueError,
            "compiled_loop.*streaming",
        ),
    ],
)
def test_bad_streaming_arguments_are_refused(make, kwargs, error, match):
    model = small("alibi", num_layers=1)
    with pytest.raises(error, match=match):
        model.generate([[1, 2]], 3, streaming=make(), **kwargs)


@pytest.mark.parametrize(
    "token_ids, match",
    [
        (np.ones((2,), "int32"), "token_ids.*\\(B, T\\)"),
        (np.ones((2, 1), "int32"), "token_ids.*at least 2"),
        (np.full((1, 4), VOCAB), "token_ids.*vocab_size"),
        (np.ones((1, 30), "int32"), "token_ids.*max_length=24"),
    ],
)
def test_bad_scoring_inputs_are_refused(token_ids, match):
    with pytest.raises(ValueError, match=match):
        small("learned", num_layers=1).score(token_ids)
    with pytest.raises(ValueError, match="sink_tokens"):
        small("t5", num_layers=1).score(
            np.ones((1, 4), "int32"), streaming=Streaming(4, sink_tokens=-1)
        )


def test_streaming_has_one_form_a_streaming_object():
    """`sink_tokens=` alone once did nothing; a window alone, an int or a
    dict is not a `Streaming`: each refused naming what the user passed."""
    model = small("t5", num_layers=1)
    tokens = np.ones((1, 4), "int32")
    with pytest.raises(TypeError, match="sink_tokens"):
        model.score(tokens, sink_tokens=2)
    with pytest.raises(TypeError, match="sink_tokens"):
        model.generate(tokens, 2, sink_tokens=2)
    for value in (8, {"cache_window": 8}):
        with pytest.raises(TypeError, match="`streaming` must be None or a "):
            model.generate(tokens, 2, streaming=value)
        with pytest.raises(TypeError, match="`streaming` must be None or a "):
            model.score(tokens, streaming=value)


def test_the_attention_checks_its_rolling_arguments():
    layer = RelativeMultiHeadAttention(2, 4)
    x = tf.zeros((1, 1, 8))
    with pytest.raises(ValueError, match="sink_tokens.*without a cache"):
        layer(x, sink_tokens=1)
    cache = tf.zeros((1, 2, 3, 2, 4))
    with pytest.raises(ValueError, match="sink_tokens.*fewer than the cache's 3"):
        layer(x, cache=cache, cache_update_index=0, sink_tokens=3)
    windowed = RelativeMultiHeadAttention(2, 4, attention_window=2)
    with pytest.raises(ValueError, match="sink_tokens.*attention_window"):
        windowed(x, cache=cache, cache_update_index=0, sink_tokens=1)


def test_exactly_the_methods_with_positions_in_the_attention_stream():
    from keras_posenc.models import POSITION_METHODS

    streams = set()
    for position in POSITION_METHODS:
        model = build_causal_lm(
            VOCAB,
            hidden_dim=8,
            num_layers=1,
            num_heads=2,
            position=position,
            position_options={"max_length": 8},
        )
        try:
            model.check_streaming(Streaming(4))
        except ValueError as error:
            assert "`streaming` must be None for this model" in str(error)
        else:
            streams.add(position)
    assert streams == set(STREAMING)
