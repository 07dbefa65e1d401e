"""Causal language models: causality, cache == recompute, generation, errors."""

import os

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import fast_only, split_between_passes
from packed_rows import WINDOW, assert_each_document_reads_as_alone

from keras_posenc import generation, samplers
from keras_posenc._compat import keras
from keras_posenc.generation import Sampling
from keras_posenc.models import (
    METHODS,
    POSITION_METHODS,
    CausalLM,
    _loop,
    build_causal_lm,
)

VOCAB = 13


def small(position, **kwargs):
    tf.keras.utils.set_random_seed(3)
    options = dict(hidden_dim=16, num_layers=2, num_heads=2, max_length=48)
    options.update(kwargs)
    return build_causal_lm(VOCAB, position=position, **builder_kwargs(**options))


def tokens(batch=2, length=11, seed=0):
    return (
        np.random.default_rng(seed).integers(1, VOCAB, (batch, length)).astype("int32")
    )


def cached_logits(model, x, prefill):
    cache = model.empty_cache(x.shape[0], x.shape[1] + 3)
    logits, cache = model.call_with_cache(x[:, :prefill], cache, 0)
    outputs = [logits.numpy()]
    for t in range(prefill, x.shape[1]):
        logits, cache = model.call_with_cache(x[:, t : t + 1], cache, t)
        outputs.append(logits.numpy())
    return np.concatenate(outputs, axis=1)


#: One method per kind of position producer in `make check` (all in `make test`).
FAST = ("learned", "t5", "hybrid", "rope")


@pytest.mark.parametrize("position", fast_only(POSITION_METHODS, FAST, per_kind=True))
def test_each_method_is_causal_caches_exactly_and_generates_alike(position):
    """One packed model per method, four contracts (keras-hub#2861 lost ALiBi
    here); a packed model decodes one document per row (`logits`)."""
    model = small(position, packed=True)
    x = tokens()
    # Changing token t never changes the logits before t.
    for t in (0, 5, 10):
        changed = x.copy()
        changed[:, t] = changed[:, t] % (VOCAB - 1) + 1
        before, after = model.logits(x).numpy(), model.logits(changed).numpy()
        np.testing.assert_allclose(after[:, :t], before[:, :t], atol=1e-6)
        assert np.abs(after[:, t:] - before[:, t:]).max() > 1e-4  # t is read
    # Prefill then one token at a time equals the full recompute.
    x = x[:, :10]
    np.testing.assert_allclose(cached_logits(model, x, 4), model.logits(x), atol=2e-5)
    # Each document of a packed row reads as alone (positions restart in
    # each, attention stays inside it).
    assert_each_document_reads_as_alone(model, vocab=VOCAB)
    # Greedy tokens of the compiled loop with the cache equal tokens
    # recomputed every step by the step-by-step loop.
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]]  # different lengths
    cached = model.generate(prompts, max_new_tokens=7)
    recomputed = model.generate(
        prompts, max_new_tokens=7, use_cache=False, compiled_loop=False
    )
    np.testing.assert_array_equal(cached, recomputed)
    assert cached.shape == (3, 5 + 7)
    for row, prompt in zip(cached, prompts):
        np.testing.assert_array_equal(row[: len(prompt)], prompt)
        assert (row[len(prompt) + 7 :] == 0).all()  # padding after the new tokens


@pytest.mark.parametrize("position", fast_only(["t5", "dynamic_bias"], ("t5",)))
def test_a_shared_bias_is_every_layer_adding_it_and_caches_exactly(position, tmp_path):
    shared = small(position, share_position_bias=True)
    separate = small(position)
    producers = [layer for layer in shared.layers if "bias" in layer.name]
    assert len(producers) == 1
    for layer in separate.layers:
        if layer.name.startswith("attention_") and hasattr(layer, "position_bias"):
            twin = shared.get_layer(layer.name)
            assert twin.position_bias is None
            layer.position_bias.set_weights(producers[0].get_weights())
            for part in ("query_dense", "key_dense", "value_dense", "output_dense"):
                getattr(layer, part).set_weights(getattr(twin, part).get_weights())
        elif layer.weights:
            layer.set_weights(shared.get_layer(layer.name).get_weights())
    x = tokens()[:, :10]
    np.testing.assert_allclose(shared(x), separate(x), atol=1e-5)
    # Decoding evaluates the shared bias once per step, at the cache's positions.
    np.testing.assert_allclose(cached_logits(shared, x, 4), shared(x), atol=2e-5)
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    np.testing.assert_array_equal(
        shared.generate(prompts, 6), shared.generate(prompts, 6, use_cache=False)
    )
    shared.save(tmp_path / "lm.keras")
    loaded = keras.models.load_model(tmp_path / "lm.keras")
    np.testing.assert_allclose(loaded(x), shared(x), atol=1e-6)


#: Block-local variants: one method per kind of position producer.
WINDOWED = (
    "learned",
    "t5",
    "dynamic_bias",
    "hybrid",
    "recursive",
    "rope",
    "gated",
    "fox",
    "cope",
)


@pytest.mark.parametrize("position", fast_only(WINDOWED, ("t5", "rope"), per_kind=True))
def test_windowed_caching_and_generation_equal_full_recompute(position):
    """Packed too: documents at multiples of the window read as alone."""
    model = small(position, attention_window=WINDOW, packed=True)
    x = tokens(length=10)
    np.testing.assert_allclose(cached_logits(model, x, 4), model.logits(x), atol=2e-5)
    assert_each_document_reads_as_alone(model, vocab=VOCAB)
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    np.testing.assert_array_equal(
        model.generate(prompts, max_new_tokens=6),
        model.generate(prompts, max_new_tokens=6, use_cache=False),
    )


def test_greedy_generation_equals_argmax_of_full_logits():
    """A NumPy oracle: each new token is the argmax at the previous position."""
    model = small("alibi", attention_window=4)
    out = model.generate(np.array([[2, 7, 1]]), max_new_tokens=6)
    logits = model(out).numpy()
    np.testing.assert_array_equal(out[0, 3:], logits[0, 2:-1].argmax(-1))


def test_the_loop_and_the_step_are_traced_once_and_reused():
    """One trace of the compiled loop per batch size and prompt-length
    bucket (powers of two), whatever `max_new_tokens`: the loop is as wide
    as the model's cache (`max_length`, 48 here)."""
    model = small("rope", num_layers=1)
    model.generate([[1, 2, 3]], max_new_tokens=20)
    model.generate([[4, 5, 6, 1, 2]], max_new_tokens=19)  # another bucket (4)
    decode = model.compiled_loop(1, 48)
    traced = decode.experimental_get_tracing_count()
    assert 1 <= traced <= 2  # one per bucket at most
    for new in (11, 44, 3):  # other widths, stop lists and draw counts
        model.generate(
            [[1, 2, 3]], sampling=Sampling(stop_token_ids=[new]), max_new_tokens=new
        )
        model.generate(
            [[4, 5, 6, 1, 2]],
            sampling=Sampling(stop_token_ids=[1, 2]),
            max_new_tokens=new,
        )
    assert decode.experimental_get_tracing_count() == traced
    again = model.generate(
        [[4, 5, 6, 1, 2]], sampling=Sampling(sampler="random", seed=1), max_new_tokens=9
    )
    steps = model.generate(
        [[4, 5, 6, 1, 2]],
        9,
        sampling=Sampling(sampler="random", seed=1),
        compiled_loop=False,
    )
    np.testing.assert_array_equal(again, steps)  # a wider loop, the same tokens
    assert again.shape == (1, 14)
    model.generate([[1, 2, 3]], max_new_tokens=20, compiled_loop=False)
    model.generate([[4, 5, 6]], max_new_tokens=20, compiled_loop=False)
    _, step = model.compiled_steps(1, 23)
    assert step.experimental_get_tracing_count() == 1


#: Sampler arguments; and whether the case also runs without the cache, in XLA.
LOOP_CASES = {
    "greedy": (dict(), True),
    "top_p": (dict(sampler="top_p", top_p=0.8, temperature=1.5, seed=4), True),
    "top_k": (dict(sampler="top_k", top_k=4, seed=3, stop_token_ids=[5]), False),
    "random": (dict(sampler="random", seed=1, stop_token_ids=[2, 7]), False),
}


@pytest.mark.parametrize("case", fast_only(list(LOOP_CASES), ("top_p",)))
def test_the_compiled_loop_gives_the_step_loops_tokens(case):
    """Same tokens in one tf.while_loop as in the Python loop of the exports:
    ragged prompts, stop tokens, seeded draws, with and without the cache."""
    model = small("t5", max_length=24, num_layers=1)
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3]]
    kwargs, everywhere = LOOP_CASES[case]
    sampling = Sampling(**kwargs)
    steps = model.generate(prompts, 12, sampling, compiled_loop=False)
    loop = model.generate(prompts, 12, sampling)
    np.testing.assert_array_equal(loop, steps)
    assert (loop[:, 5:] != 0).any()  # it generated something
    if everywhere:
        recomputed = model.generate(prompts, 12, sampling, use_cache=False)
        np.testing.assert_array_equal(recomputed, steps)
        xla = model.generate(prompts, 12, sampling, jit_compile=True)
        np.testing.assert_array_equal(xla, steps)
    if "seed" in kwargs:  # the draws matter: another seed gives other tokens
        other = Sampling(**dict(kwargs, seed=kwargs["seed"] + 100))
        assert (model.generate(prompts, 12, other) != loop).any()


#: One method per kind of decoding state: a bias, a rotation, the conv
#: state, the gate's sums (an outside bias), a block's cache pair, CoPE's
#: counts over the logits (each one XLA compilation: not all 18). Split
#: between the passes: the loop is the package's own `tf.while_loop` around
#: `call_with_cache`, and both passes check the compiled loop against the
#: recompute for one method of each kind of producer or more (above).
DECODING_STATES = ("t5", "rope", "hpn", "fox", "recursive", "cope")
LOOPED = split_between_passes(DECODING_STATES, keras2=("t5", "rope", "cope"))


@pytest.mark.parametrize(  # `make check` (the Keras 3 pass) runs hpn's
    "position", fast_only(LOOPED, [p for p in LOOPED if p == "hpn"])
)
def test_the_loops_cache_reads_and_in_place_writes_give_the_step_loops_tokens(
    position, monkeypatch
):
    """48 slots: XLA's loop runs two phases (steps reading 32 slots, then
    48: phases of 32 slots here, where by default a phase spans at least
    256 and a 256-slot cache is one),
    the graph's steps read up to their own position and write their caches
    in place; both give the step loop's seeded tokens, every call alike, and
    the caller's prompts stay as they were."""
    assert _loop.phase_widths(256) == [256]
    assert _loop.phase_widths(1024) == [256, 512, 768, 1024]
    monkeypatch.setattr(_loop, "PHASE_SLOTS", 32)
    assert _loop.phase_widths(48) == [32, 48]
    model = small(position)
    prompts = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], "int32")
    given = prompts.copy()
    drawn = Sampling("random", temperature=2.0, seed=5)  # seeded draws
    steps = model.generate(prompts, 43, drawn, compiled_loop=False)  # 5 + 43
    for jit_compile in (False, True):
        for _ in range(2):  # a second call starts from the same empty caches
            loop = model.generate(prompts, 43, drawn, jit_compile=jit_compile)
            np.testing.assert_array_equal(loop, steps)
    np.testing.assert_array_equal(prompts, given)
    assert len(set(steps[:, 5:].ravel())) > 5  # it drew many tokens


def scripted(preferences, vocab=6):
    """prefill/step whose logits prefer `preferences[t]` at position t."""

    def logits(t, batch):
        row = np.zeros((batch, vocab))
        row[:, preferences[t]] = 5.0
        return row

    return (lambda x: logits(x.shape[1] - 1, len(x))), (lambda x, t: logits(t, len(x)))


def test_stop_tokens_end_a_row_and_the_rest_is_padding():
    prefill, step = scripted([1, 2, 3, 4, 5, 3, 1, 1, 1])
    prompts, lengths = generation.check_prompts([[1, 1], [1, 1, 1]], pad_token_id=0)
    out = generation.generate_tokens(
        prefill,
        step,
        prompts,
        lengths,
        5,
        sampling=Sampling(stop_token_ids=[4], pad_token_id=0),
    )
    # Slot t gets the preference of position t - 1; 4 stops both rows.
    np.testing.assert_array_equal(out[0], [1, 1, 2, 3, 4, 0, 0, 0])
    np.testing.assert_array_equal(out[1], [1, 1, 1, 3, 4, 0, 0, 0])


def test_samplers_against_numpy_oracles():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    picks = [
        generation.sample(logits, "top_k", 1.0, 2, 1.0, rng)[0] for _ in range(400)
    ]
    assert set(picks) == {0, 1}
    assert abs(np.mean(np.array(picks) == 0) - 0.5 / 0.8) < 0.08
    picks = [
        generation.sample(logits, "top_p", 1.0, 50, 0.7, rng)[0] for _ in range(400)
    ]
    assert set(picks) == {0, 1}  # 0.5 < 0.7 <= 0.8: the first two tokens
    assert generation.sample(logits, "top_p", 1.0, 50, 0.1, rng)[0] == 0
    assert generation.sample(logits, "greedy", 1.0, 50, 1.0, rng)[0] == 0


def test_seeded_sampling_is_reproducible_and_top_k_one_is_greedy():
    model = small("xpos")
    first = model.generate(
        [[1, 2]], 8, sampling=Sampling(sampler="top_p", seed=7, temperature=2.0)
    )
    again = model.generate(
        [[1, 2]], 8, sampling=Sampling(sampler="top_p", seed=7, temperature=2.0)
    )
    np.testing.assert_array_equal(first, again)
    greedy = model.generate([[1, 2]], 8)
    np.testing.assert_array_equal(
        model.generate([[1, 2]], 8, sampling=Sampling("top_k", top_k=1)), greedy
    )


def test_fit_traces_the_training_step_once(monkeypatch):
    """The optimizer built before the first trace (`make_train_function`)
    creates no variable inside it, which TensorFlow would trace again: the
    model's `call` runs once in the first `fit`, twice without the build."""
    model = small("t5", num_layers=1)
    calls = []
    call = CausalLM.call

    def counted(self, *args, **kwargs):
        calls.append(1)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(CausalLM, "call", counted)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(1e-3), loss)
    x = tokens(batch=8, length=9)
    model.fit(x[:, :-1], x[:, 1:], verbose=0)
    assert len(calls) == 1
    calls.clear()
    plain = small("t5", num_layers=1)
    plain.compile(keras.optimizers.Adam(1e-3), loss)
    monkeypatch.setattr(
        CausalLM, "make_train_function", keras.Model.make_train_function
    )
    plain.fit(x[:, :-1], x[:, 1:], verbose=0)
    assert len(calls) == 2  # the case the build avoids (so the count can fail)


@pytest.mark.slow
def test_fit_save_and_load_round_trip(tmp_path):
    model = small("hybrid", dropout=0.1)
    x = tokens(batch=8, length=12)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x[:, :-1], x[:, 1:], epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    path = os.path.join(tmp_path, "lm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, CausalLM)
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
    np.testing.assert_array_equal(
        loaded.generate([[1, 2]], 5), model.generate([[1, 2]], 5)
    )
    # Loaded compiled: it trains on without `compile`, its optimizer's state kept.
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 2
    loaded.fit(x[:, :-1], x[:, 1:], verbose=0)
    assert int(loaded.optimizer.iterations) == 3
    assert not np.allclose(loaded(x), model(x), atol=1e-6)


def test_config_holds_every_constructor_argument():
    import inspect

    model = small("clipped", attention_window=4, position_options={"max_distance": 5})
    arguments = set(inspect.signature(CausalLM.__init__).parameters) - {
        "self",
        "kwargs",
    }
    config = model.get_config()
    assert arguments <= set(config)
    assert config["position_options"] == {"max_distance": 5, "max_length": 48}
    assert config["attention_window"] == 4 and config["attention_options"] is None
    assert model.max_length == 48
    again = CausalLM.from_config(config)
    assert again.get_config() == config


@pytest.mark.parametrize(
    "keywords, error, match",
    [
        ({"max_length": 16}, TypeError, r"unexpected keyword arguments \['max_length"),
        ({"max_lenght": 8}, TypeError, "unexpected keyword arguments.*max_lenght"),
        ({"share_position_bias": True}, TypeError, "share_position_bias"),
        (
            {"attention_options": {"attention_window": 4}},
            ValueError,
            "attention_window and num_key_value_heads are keywords of their own",
        ),
        (
            {"attention_options": {"num_key_value_heads": 1}},
            ValueError,
            "`attention_options` must be a dict of attention_type",
        ),
        ({"position_options": 16}, TypeError, "`position_options` must be a dict"),
    ],
)
def test_each_option_has_one_form(keywords, error, match):
    """`max_length` and the other position keys live in `position_options`,
    the window and the key heads are keywords: a second form is refused."""
    with pytest.raises(error, match=match):
        build_causal_lm(VOCAB, **keywords)


class NumpyOnly(samplers.Sampler):
    """A sampler with a NumPy rule only: the least likely token."""

    def next_tokens(self, logits, rngs):
        return np.argmin(logits, axis=-1)


def test_a_sampler_without_a_compiled_rule_decodes_step_by_step():
    model = small("t5", num_layers=1)
    out = model.generate([[1, 2], [3]], 4, sampling=Sampling(NumpyOnly()))
    logits = model(out).numpy()
    for row, start in ((0, 2), (1, 1)):  # a NumPy oracle: each the argmin
        np.testing.assert_array_equal(
            out[row, start : start + 4], logits[row, start - 1 : start + 3].argmin(-1)
        )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: m.generate([[1, 2]], 0), "max_new_tokens"),
        (
            lambda m: m.generate([[1, 2]], 3, sampling=Sampling(sampler="beam")),
            "sampler",
        ),
        (
            lambda m: m.generate([[1, 2]], 3, sampling=Sampling("top_p", top_p=0.0)),
            "top_p",
        ),
        (
            lambda m: m.generate([[1, 2]], 3, sampling=Sampling("top_p", top_p=1.5)),
            "top_p",
        ),
        (
            lambda m: m.generate([[1, 2]], 3, sampling=Sampling("top_k", top_k=0)),
            "top_k",
        ),
        (
            lambda m: m.generate([[1, 2]], 3, sampling=Sampling(temperature=0.0)),
            "temperature",
        ),
        (lambda m: m.generate([[]], 3), "prompt_ids"),
        (lambda m: m.generate(np.ones((2, 3, 1), "int32"), 3), "prompt_ids"),
        (lambda m: m.generate([[1, 2]], 3, use_cache="yes"), "use_cache"),
        (lambda m: m.generate([[1, 2]], 3, compiled_loop="yes"), "compiled_loop"),
        (
            lambda m: m.generate(
                [[1, 2]], 3, sampling=Sampling(NumpyOnly()), compiled_loop=True
            ),
            "sampler.*compiled_next_tokens.*compiled_loop=False",
        ),
    ],
)
def test_bad_generation_arguments_are_refused(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(small("none", num_layers=1))


def test_a_prompt_past_the_learned_table_is_refused():
    model = small("learned", max_length=8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate([[1, 2, 3]], max_new_tokens=6)


@pytest.mark.parametrize(
    "position",
    [name for name, row in METHODS.items() if "bidirectional" in row.options],
)
def test_a_bidirectional_bias_is_refused(position):
    with pytest.raises(ValueError, match="without bidirectional=True for position"):
        build_causal_lm(
            VOCAB, position=position, position_options={"bidirectional": True}
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"position": "alibi2"}, "position"),
        ({"hidden_dim": 10, "num_heads": 4}, "hidden_dim"),
        (
            {"position": "learned", "sequence_length": 64, "max_length": 32},
            "max_length",
        ),
        ({"attention_window": 0}, "attention_window"),
        ({"position_options": {"nope": 1}}, "position_options"),
        ({"position": "rope", "share_position_bias": True}, "share_position_bias"),
        (
            {"position": "t5", "share_position_bias": True, "attention_window": 4},
            "share_position_bias` must be False with block-local",
        ),
    ],
)
def test_bad_model_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_causal_lm(VOCAB, **builder_kwargs(**kwargs))


def test_causal_clipped_table_mean_matches_a_numpy_oracle():
    from keras_posenc import ops

    table = np.random.default_rng(1).normal(size=(7, 3)).astype("float32")  # M = 3
    start, length = 2, 6
    expected = np.stack(
        [
            np.mean([table[np.clip(j - i, -3, 3) + 3] for j in range(i + 1)], axis=0)
            for i in range(start, start + length)
        ]
    )
    got = ops.clipped_table_mean(table, length, 99, start_index=start, causal=True)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_causal_gated_fusion_table_and_dense_forms_agree():
    from keras_posenc import GatedPositionFusion, ops

    fusion = GatedPositionFusion(causal=True)
    absolute = tf.random.normal((2, 5, 4))
    table = tf.random.normal((5, 4))  # M = 2
    dense = ops.dense_relative_table(table, 5, 5)[None]  # (1, T, S, D)
    dense = tf.broadcast_to(dense, (2, 5, 5, 4))
    np.testing.assert_allclose(
        fusion(absolute, table), fusion(absolute, dense), atol=1e-5
    )
    assert GatedPositionFusion.from_config(fusion.get_config()).causal


def test_causal_convolution_state_decoding_equals_the_whole_sequence():
    from keras_posenc import HierarchicalPositionNetwork

    hpn = HierarchicalPositionNetwork(
        4, 1, position_features="conv", kernel_size=5, causal=True
    )
    x = tf.random.normal((2, 9, 4))
    whole = hpn(x, 0).numpy()
    changed = hpn(tf.concat([x[:, :6], x[:, 6:] + 1.0], axis=1), 0).numpy()
    np.testing.assert_allclose(changed[:, :6], whole[:, :6], atol=1e-6)
    out, state = hpn(x[:, :3], 0, state=tf.zeros((2, 12, 4)), start_index=0)
    pieces = [out.numpy()]
    for t in range(3, 9):
        out, state = hpn(x[:, t : t + 1], 0, state=state, start_index=t)
        pieces.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, atol=1e-5)
    with pytest.raises(ValueError, match="state"):
        HierarchicalPositionNetwork(4, 1)(x, 0, state=state)


def test_a_misspelled_argument_is_refused():
    with pytest.raises(TypeError, match="hiden_dim"):
        build_causal_lm(32, hiden_dim=64)


@pytest.mark.parametrize("prompt", [[[1, VOCAB]], [[-1, 2]], [[1, 2], [3, 99]]])
def test_prompt_ids_outside_the_vocabulary_are_refused(prompt):
    with pytest.raises(ValueError, match=f"vocab_size={VOCAB}"):
        small("none", num_layers=1).generate(prompt, 2)


def test_a_negative_pad_id_with_a_ragged_batch_generates():
    model = small("t5", num_layers=1)
    out = model.generate([[1, 2, 3], [4]], 3, sampling=Sampling(pad_token_id=-1))
    same = model.generate([[1, 2, 3], [4]], 3)  # pad 0: the same real tokens
    np.testing.assert_array_equal(out[:, :4], same[:, :4])
    np.testing.assert_array_equal(out[1, 4:], [-1, -1])


def test_jit_compile_must_be_a_bool():
    with pytest.raises(TypeError, match="jit_compile"):
        small("none", num_layers=1).generate([[1, 2]], 2, jit_compile="no")


def test_a_learned_prompt_past_the_table_blames_the_prompt():
    model = small("learned", max_length=4)
    with pytest.raises(ValueError, match="prompt_ids.*max_length=4"):
        model.generate([[1, 2, 3, 4, 5]], max_new_tokens=1)


def test_compiled_steps_are_bounded_and_cleared():
    from keras_posenc.models.causal_lm import MAX_COMPILED_STEPS

    model = small("none", num_layers=1)
    for batch in range(1, MAX_COMPILED_STEPS + 3):
        model.compiled_steps(batch, 6)
    kept = model.__dict__["_generation_functions"]
    assert len(kept) == MAX_COMPILED_STEPS
    assert (1, 6, True, False) not in kept  # the least recently used went first
    model.clear_compiled_steps()
    assert "_generation_functions" not in model.__dict__


@pytest.mark.parametrize("cache", [[], "cache", None])
def test_call_with_cache_needs_every_cache_tensor(cache):
    model = small("t5", num_layers=1)
    with pytest.raises(TypeError, match="cache"):
        model.call_with_cache(tokens(1, 2), cache, 0)
    extra = model.empty_cache(1, 6) + [tf.zeros((1, 2, 6, 8))]
    with pytest.raises(TypeError, match="a list of 2 tensors"):
        model.call_with_cache(tokens(1, 2), extra, 0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("position", ["rope", "t5", "hybrid"])
def test_generation_runs_under_mixed_precision(policy, position):
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = small(position, num_layers=1)
        out = model.generate([[1, 2, 3], [4]], 4)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert out.shape == (2, 7) and out.min() >= 0 and out.max() < VOCAB


LENGTH_DEPENDENT = {
    "dynamic": {
        "rope_type": "dynamic",
        "scaling_factor": 2.0,
        "original_max_position_embeddings": 4,
    },
    "longrope": {
        "rope_type": "longrope",
        "scaling_factor": 4.0,
        "original_max_position_embeddings": 5,
        "rope_parameters": {
            "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0],
        },
    },
}


@pytest.mark.parametrize("rope_type", sorted(LENGTH_DEPENDENT))
def test_length_dependent_rotary_reads_each_token_at_its_length(rope_type):
    """The cache holds keys before rotation; each step turns them at its length.

    With one layer the logits of token t equal a recompute of tokens
    `0 .. t` (the attention reads the current length); with more, a recompute
    would re-read earlier hidden states at the new length, so `use_cache=False`
    is refused.
    """
    options = LENGTH_DEPENDENT[rope_type]
    model = small("rope", num_layers=1, position_options=options)
    assert model.reads_current_length
    x = tokens(length=10)
    cached = cached_logits(model, x, 3)
    np.testing.assert_allclose(cached[:, :3], model(x[:, :3]), atol=2e-5)
    for t in range(3, 10):
        recomputed = model(x[:, : t + 1]).numpy()[:, t]
        np.testing.assert_allclose(cached[:, t], recomputed, atol=2e-5)
    deep = small("rope", position_options=options)
    assert deep.generate([[3, 1, 4], [9, 2, 6, 5, 3, 5]], 6).shape == (2, 12)
    with pytest.raises(ValueError, match="use_cache"):
        deep.generate([[3, 1, 4]], 6, use_cache=False)
    assert not small("rope", num_layers=1).reads_current_length


def test_xpos_generation_stops_before_its_scales_overflow():
    import math

    model = small("xpos", num_layers=1, position_options={"xpos_scale_base": 1.0})
    limit = int(80 / math.log(1.4 / 0.4))  # the first position e^80 cannot hold
    out = model.generate([[1, 2, 3]], limit - 3)
    assert np.isfinite(model(out).numpy()).all()
    assert out.shape == (1, limit)
    with pytest.raises(ValueError, match="xpos_scale_base=1.0"):
        model.generate([[1, 2, 3]], limit - 2)
