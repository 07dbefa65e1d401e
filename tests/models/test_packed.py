"""Packed rows: shared biases, block-local isolation, fitting, the layers' parts.

Every method's packed causal LM is held in `tests/models/test_causal_lm.py`
(dense and block-local, beside its caching contracts) and its packed
encoder in `tests/models/test_models.py`.
"""

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from packed_rows import assert_each_document_reads_as_alone, packed_row

from keras_posenc import (
    IS_KERAS_3,
    GatedPositionFusion,
    HierarchicalPositionNetwork,
    RelativeMultiHeadAttention,
    RotaryEmbedding,
    SegmentPositions,
    models,
)
from keras_posenc._compat import keras
from keras_posenc.data import language_modeling as lm

SMALL = dict(
    hidden_dim=8, num_heads=2, num_layers=2, position_options={"max_length": 32}
)


@pytest.mark.parametrize("position", ["fire", "t5"])
def test_a_shared_bias_reads_each_document_alone(position):
    """`fire` reads the query's own position: the shared bias becomes per row."""
    model = models.build_causal_lm(
        30,
        position=position,
        packed=True,
        **builder_kwargs(**SMALL, share_position_bias=True),
    )
    assert_each_document_reads_as_alone(model)


@pytest.mark.parametrize("position", ["t5", "fire", "hybrid", "learned"])
def test_unaligned_documents_never_see_each_other_block_local(position):
    """Off the window's grid a document's band is the row's, cut at its run:
    still no token of another document reaches it."""
    model = models.build_causal_lm(
        30, position=position, packed=True, attention_window=4, **SMALL
    )
    ids, segments = packed_row(((0, 5), (5, 6), (11, 3)))
    inputs = {"token_ids": ids, "segment_ids": segments}
    before = model(inputs).numpy()
    changed = ids.copy()
    changed[0, :5] = (changed[0, :5] + 7) % 29 + 1  # the first document only
    after = model({"token_ids": changed, "segment_ids": segments}).numpy()
    np.testing.assert_allclose(after[:, 5:], before[:, 5:], atol=1e-6)
    assert not np.allclose(after[:, :5], before[:, :5])


@pytest.mark.slow
def test_a_packed_lm_fits_on_packed_rows_and_saves(tmp_path):
    documents = [np.arange(1, n + 1) % 29 + 1 for n in (3, 9, 5, 12, 4, 7, 2, 10)]
    inputs, labels, weights = lm.pack(documents, 16)
    keras.utils.set_random_seed(0)
    model = models.build_causal_lm(30, position="rope", packed=True, **SMALL)
    model.compile(
        keras.optimizers.SGD(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(
        inputs, labels, sample_weight=weights, batch_size=2, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
    model.save(tmp_path / "packed.keras")
    loaded = keras.models.load_model(tmp_path / "packed.keras")
    assert loaded.get_config()["packed"] is True
    np.testing.assert_allclose(loaded(inputs).numpy(), model(inputs).numpy(), atol=1e-6)


if IS_KERAS_3:  # one pass: generation reads the model as the unpacked one

    def test_a_packed_lm_generates_and_scores_one_document_per_row():
        """Greedy tokens are the argmax of the recomputed logits (`logits`
        reads a row as one document), scores their log-softmax."""
        keras.utils.set_random_seed(0)
        model = models.build_causal_lm(30, position="alibi", packed=True, **SMALL)
        tokens = model.generate([[3, 4, 5]], max_new_tokens=4)[0]
        for t in range(3, 7):
            logits = model.logits(tokens[None, :t]).numpy()[0, -1]
            assert tokens[t] == np.argmax(logits)
        log_probs = tf.nn.log_softmax(model.logits(tokens[None, :-1]))[0].numpy()
        np.testing.assert_allclose(
            model.score(tokens[None])[0],
            log_probs[np.arange(6), tokens[1:]],
            atol=1e-5,
        )


def test_segment_positions_restart_in_each_run():
    got = SegmentPositions()(np.array([[4, 4, 4, 9, 9, 4, 0, 0]]))
    np.testing.assert_array_equal(got.numpy(), [[0, 1, 2, 0, 1, 0, 0, 1]])


def test_the_dense_relative_form_of_gated_fusion_averages_inside_each_run():
    """`(B, T, S, D)` relative input: each query's mean runs over its run only."""
    fusion = GatedPositionFusion(causal=True)
    rng = np.random.default_rng(0)
    absolute = rng.normal(size=(1, 5, 4)).astype("float32")
    relative = rng.normal(size=(1, 5, 5, 4)).astype("float32")
    segments = np.array([[1, 1, 1, 2, 2]])
    packed = fusion(absolute, relative, segment_ids=segments).numpy()
    first = fusion(absolute[:, :3], relative[:, :3, :3]).numpy()
    second = fusion(absolute[:, 3:], relative[:, 3:, 3:]).numpy()
    np.testing.assert_allclose(packed, np.concatenate([first, second], 1), atol=1e-6)


def test_pack_lays_every_document_once_in_order_with_its_labels():
    rng = np.random.default_rng(3)
    documents = [rng.integers(1, 50, n) for n in (5, 1, 9, 3, 20, 2, 6)]
    inputs, labels, weights = lm.pack(documents, 8, align=2)
    ids, segments = inputs["token_ids"], inputs["segment_ids"]
    pieces = [d[s : s + 8] for d in documents for s in range(0, len(d), 8)]
    found = []
    for r in range(len(ids)):
        for segment in range(1, segments[r].max() + 1):
            where = np.flatnonzero(segments[r] == segment)
            assert where[0] % 2 == 0  # aligned
            np.testing.assert_array_equal(where, np.arange(where[0], where[-1] + 1))
            found.append(ids[r, where])
            np.testing.assert_array_equal(labels[r, where[:-1]], ids[r, where[1:]])
            assert weights[r, where[:-1]].all() and weights[r, where[-1]] == 0
    assert sorted(map(tuple, found)) == sorted(map(tuple, pieces))
    assert (ids[segments == 0] == 0).all() and (weights[segments == 0] == 0).all()
    padded, pad_labels, pad_weights = lm.pad(documents, 8)
    assert len(padded) == len(pieces) > len(ids)
    assert pad_weights.sum() == weights.sum()  # the same predictions


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        (dict(documents=np.ones((3, 4), int)), TypeError, "`documents` must be a list"),
        (dict(documents=[np.ones(3)]), TypeError, "1-D integer token-id arrays"),
        (dict(documents=[]), ValueError, "at least one non-empty document"),
        (dict(sequence_length=0), ValueError, "`sequence_length` must be"),
        (dict(align=0), ValueError, "`align` must be"),
    ],
)
def test_pack_refuses_bad_arguments(arguments, error, match):
    args = dict(documents=[np.arange(1, 5)], sequence_length=8)
    args.update(arguments)
    with pytest.raises(error, match=match):
        lm.pack(**args)


def test_bad_packed_calls_are_refused():
    x = tf.zeros((1, 6, 8))
    segments = np.ones((1, 6), "int32")
    attention = RelativeMultiHeadAttention(2, 4)
    with pytest.raises(TypeError, match="`segment_ids` must be an integer tensor"):
        attention(x, segment_ids=np.ones((1, 6), "float32"))
    with pytest.raises(ValueError, match=r"`segment_ids` must be of shape \(B, T\)"):
        attention(x, segment_ids=np.ones((6,), "int32"))
    with pytest.raises(ValueError, match="`segment_ids` must be the length of the"):
        attention(x, segment_ids=np.ones((1, 5), "int32"))
    with pytest.raises(ValueError, match="`positions` must be None with `segment_"):
        attention(x, segment_ids=segments, positions=tf.range(6))
    cache = tf.zeros((1, 2, 6, 2, 4))
    with pytest.raises(ValueError, match="`cache` must be None with `segment_ids`"):
        attention(x, segment_ids=segments, cache=cache, cache_update_index=0)
    dynamic = RelativeMultiHeadAttention(
        2,
        4,
        rotary=RotaryEmbedding(
            rope_type="dynamic", scaling_factor=2.0, original_max_position_embeddings=8
        ),
    )
    with pytest.raises(ValueError, match="rotary type whose frequencies read"):
        dynamic(x, segment_ids=segments)
    hpn = HierarchicalPositionNetwork(8, 1, position_features="conv", causal=True)
    with pytest.raises(ValueError, match="`state` must be None with `segment_ids`"):
        hpn(x, 0, segment_ids=segments, state=tf.zeros((1, 6, 8)))


@pytest.mark.parametrize(
    "build, arguments, match",
    [
        (models.build_encoder, dict(input_dim=3), "`packed` must be False for feature"),
        (
            models.build_encoder,
            dict(vocab_size=9, position="rope", grid_shape=(2, 3)),
            "`packed` must be False for feature inputs",
        ),
        (
            lambda **a: models.build_classifier(2, **a),
            dict(vocab_size=9),
            "`packed` must be False for a classifier of whole rows",
        ),
    ],
)
def test_builders_refuse_packed_rows_they_cannot_read(build, arguments, match):
    args = dict(packed=True, **SMALL)
    args.update(arguments)
    with pytest.raises(ValueError, match=match):
        build(**builder_kwargs(**args))


@pytest.mark.parametrize("build", [models.build_encoder, models.build_causal_lm])
def test_packed_must_be_a_bool(build):
    with pytest.raises(TypeError, match="`packed` must be a bool"):
        build(vocab_size=9, packed="yes", **SMALL)


@pytest.mark.parametrize(
    "build",
    [
        lambda: models.build_encoder(vocab_size=9, packed=True, **SMALL),
        lambda: models.build_token_classifier(3, vocab_size=9, packed=True, **SMALL),
        lambda: models.build_causal_lm(9, packed=True, **SMALL),
    ],
)
def test_float_segment_ids_are_refused_not_truncated(build):
    # 1.6 and 1.2 would both become document 1: two documents merged.
    model = build()
    rows = {"token_ids": np.ones((1, 8), "int32")}
    segments = np.array([[1.6] * 4 + [1.2] * 4])
    match = "`segment_ids` must be integer document ids.*float"
    with pytest.raises(ValueError, match=match):
        model({**rows, "segment_ids": segments})
    with pytest.raises(ValueError, match=match):
        model.predict({**rows, "segment_ids": segments.astype("float32")}, verbose=0)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=match):
        model.fit({**rows, "segment_ids": segments}, np.zeros((1, 8)), verbose=0)
    whole = model({**rows, "segment_ids": np.ones((1, 8), "int64")})
    assert np.isfinite(np.asarray(whole)).all()  # any integer dtype reads


def test_a_packed_encoder_is_a_packed_model_that_saves_and_loads(tmp_path):
    model = models.build_token_classifier(3, vocab_size=9, packed=True, **SMALL)
    assert isinstance(model, models.PackedModel)
    rows = {
        "token_ids": np.arange(1, 9, dtype="int32")[None],
        "segment_ids": np.array([[1, 1, 1, 2, 2, 2, 2, 0]], "int32"),
    }
    model.save(tmp_path / "packed.keras")
    loaded = keras.models.load_model(tmp_path / "packed.keras")
    assert isinstance(loaded, models.PackedModel)
    np.testing.assert_allclose(np.asarray(loaded(rows)), np.asarray(model(rows)))
    with pytest.raises(ValueError, match="`segment_ids` must be integer"):
        loaded({**rows, "segment_ids": rows["segment_ids"] + 0.5})
