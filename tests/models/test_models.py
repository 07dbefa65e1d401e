import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from layer_checks import PRODUCER_KINDS
from marks import fast_only, kinds_fast, per_kind_in_keras2
from packed_rows import assert_each_document_reads_as_alone

from keras_posenc import RelativeMultiHeadAttention, models

keras = tf.keras
SMALL = dict(
    hidden_dim=8, num_heads=2, num_layers=2, position_options={"max_length": 16}
)


def _compile(model):
    # SGD: these fits check that a model trains and saves, not how well; a
    # Keras 3 fit with Adam traces 4-5x longer (7.5 s against 1.5 s here).
    model.compile(
        keras.optimizers.SGD(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.mark.slow
@pytest.mark.parametrize(  # Keras 2: one per kind (each layer's own round trip,
    # fox's and cope's included, runs in both passes in `tests/layers`)
    "position",
    per_kind_in_keras2(models.POSITION_METHODS),
)
def test_every_method_builds_fits_saves_and_reloads(position, tmp_path):
    model = models.build_classifier(3, vocab_size=10, position=position, **SMALL)
    _compile(model)
    x = np.random.randint(0, 10, size=(16, 12))
    y = np.random.randint(0, 3, size=16)
    history = model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)
    # A loaded, compiled model re-saves as .h5 (Keras 2 used to fail: the
    # reloaded weights lost their layer prefix).
    loaded.save(tmp_path / "model.h5")
    again = keras.models.load_model(tmp_path / "model.h5", compile=False)
    np.testing.assert_allclose(again(x).numpy(), model(x).numpy(), atol=1e-6)


@pytest.mark.parametrize(
    "position",
    fast_only(models.POSITION_METHODS, (*PRODUCER_KINDS, "none"), per_kind=True),
)
def test_only_none_is_blind_to_token_order(position):
    keras.utils.set_random_seed(2)
    model = models.build_token_classifier(4, vocab_size=10, position=position, **SMALL)
    x = np.random.randint(1, 10, size=(2, 9))
    perm = np.random.default_rng(0).permutation(9)
    permuted_then_run = model(x[:, perm]).numpy()
    run_then_permuted = model(x).numpy()[:, perm]
    equivariant = np.allclose(permuted_then_run, run_then_permuted, atol=1e-5)
    assert equivariant == (position == "none")


@pytest.mark.parametrize(
    "position",
    kinds_fast(models.RELATIVE_METHODS),
)
def test_relative_methods_run_longer_than_their_tables(position):
    # 64 tokens, 8 real: the real tokens' logits equal those of the 8-token run.
    model = models.build_token_classifier(
        2, vocab_size=10, position=position, mask_zero=True, **SMALL
    )
    short = np.random.randint(1, 10, size=(2, 8))
    long = np.concatenate([short, np.zeros((2, 56), int)], axis=1)
    out = model(long).numpy()
    assert out.shape == (2, 64, 2)
    np.testing.assert_allclose(out[:, :8], model(short).numpy(), atol=1e-5)


def test_feature_inputs_and_fixed_length():
    model = models.build_classifier(
        5, input_dim=3, sequence_length=7, position="alibi", **SMALL
    )
    assert tuple(model.input.shape) == (None, 7, 3)
    assert model(np.zeros((2, 7, 3), "float32")).shape == (2, 5)


def test_padding_is_masked_when_mask_zero():
    model = models.build_token_classifier(
        3, vocab_size=10, position="t5", mask_zero=True, **SMALL
    )
    short = model(np.array([[4, 5, 6]])).numpy()
    long = model(np.array([[4, 5, 6, 0, 0]])).numpy()
    np.testing.assert_allclose(long[:, :3], short, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"position": "spiral"}, ValueError, "`position` must be one of"),
        ({"input_dim": 3}, ValueError, "`vocab_size` must be given, or input_dim"),
        ({"vocab_size": None}, ValueError, "`vocab_size` must be given, or input_dim"),
        ({"hidden_dim": 10}, ValueError, "`hidden_dim` must be divisible by"),
        ({"sequence_length": 0}, ValueError, "`sequence_length` must be an integer"),
        ({"dropout": 1.5}, ValueError, "`dropout` must be a number in"),
        (
            {"position": "learned", "sequence_length": 40, "max_length": 16},
            ValueError,
            "Use a relative method",
        ),
        ({"share_position_bias": 1}, TypeError, "`share_position_bias` must be a bool"),
        (
            {"position": "rope", "share_position_bias": True},
            ValueError,
            r"`share_position_bias` must be False unless position is in .*'rope'",
        ),
        (
            {"position": "hybrid", "share_position_bias": True},
            ValueError,
            r"`share_position_bias` must be False unless .*grid_shape=None",
        ),
        (
            {"share_position_bias": True, "attention_window": 4},
            ValueError,
            "`share_position_bias` must be False with block-local attention",
        ),
    ],
)
def test_rejects_bad_arguments(kwargs, error, match):
    args = {"vocab_size": 10, "hidden_dim": 8, "num_heads": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        models.build_encoder(**builder_kwargs(**args))


def test_rejects_bad_num_classes():
    with pytest.raises(ValueError, match="`num_classes` must be an integer >= 1"):
        models.build_classifier(0, vocab_size=10)


@pytest.mark.parametrize(
    "position, window",
    fast_only(
        [(p, None) for p in models.POSITION_METHODS]
        + [(p, 4) for p in models.LOCAL_METHODS],
        PRODUCER_KINDS,
        per_kind=True,
    ),
)
def test_padding_and_packing_never_change_real_token_outputs(position, window):
    """Every method, one packed model: real tokens read the same with 2 or 7
    padded slots (Keras masks), and each document of a packed row reads as
    alone (its positions restart, its attention stays inside it)."""
    model = models.build_token_classifier(
        3,
        vocab_size=30,
        position=position,
        mask_zero=True,
        attention_window=window,
        packed=True,
        **SMALL,
    )
    real = np.array([[4, 5, 6, 7, 8, 9], [3, 1, 4, 1, 5, 9]])

    def one_document(ids):
        return model({"token_ids": ids, "segment_ids": np.ones_like(ids)}).numpy()

    short = one_document(np.pad(real, [(0, 0), (0, 2)]))
    long = one_document(np.pad(real, [(0, 0), (0, 7)]))
    np.testing.assert_allclose(long[:, :6], short[:, :6], atol=1e-5)
    assert_each_document_reads_as_alone(model)  # starts at multiples of 4


@pytest.mark.parametrize(
    "position,grid", [("t5", None), ("dynamic_bias", None), ("hybrid", (2, 3))]
)
def test_a_shared_bias_is_every_layer_adding_the_same_bias(position, grid):
    """One producer, evaluated once, equals L producers holding its weights."""
    args = dict(vocab_size=10, position=position, grid_shape=grid, mask_zero=True)
    args.update(SMALL, num_layers=3)
    keras.utils.set_random_seed(4)
    shared = models.build_token_classifier(
        3, **builder_kwargs(**args, share_position_bias=True)
    )
    separate = models.build_token_classifier(3, **builder_kwargs(**args))
    producers = [layer for layer in shared.layers if "bias" in layer.name]
    assert [layer.name for layer in producers] == [
        ("dynamic_bias" if position != "t5" else "bias") + "_shared"
    ]
    bias_weights = producers[0].get_weights()
    for layer in separate.layers:
        if isinstance(layer, RelativeMultiHeadAttention):
            twin = shared.get_layer(layer.name)
            assert twin.position_bias is None
            layer.position_bias.set_weights(bias_weights)
            for part in ("query_dense", "key_dense", "value_dense", "output_dense"):
                getattr(layer, part).set_weights(getattr(twin, part).get_weights())
        elif layer.weights:
            layer.set_weights(shared.get_layer(layer.name).get_weights())
    per_producer = sum(w.size for w in bias_weights)
    assert separate.count_params() - shared.count_params() == 2 * per_producer
    x = np.array([[4, 5, 6, 0, 0, 0], [3, 1, 4, 1, 5, 9]])
    np.testing.assert_allclose(shared(x).numpy(), separate(x).numpy(), atol=1e-5)


def test_build_encoder_takes_each_option_in_one_form():
    window = models.build_encoder(
        vocab_size=9,
        hidden_dim=8,
        num_heads=2,
        num_layers=1,
        position="dynamic_bias",
        attention_window=4,
        position_options={"max_length": 16, "grid_shape": (2, 4)},
    )
    assert window.get_layer("attention_0").attention_window == 4
    lsh = models.build_encoder(
        vocab_size=9,
        hidden_dim=8,
        num_heads=2,
        num_layers=1,
        attention_options={"attention_type": "lsh", "bucket_size": 4},
    )
    attention = lsh.get_layer("attention_0")
    assert (attention.attention_type, attention.bucket_size) == ("lsh", 4)
    with pytest.raises(ValueError, match="keywords of their own"):
        models.build_encoder(vocab_size=9, attention_options={"attention_window": 4})
    for flat in ("max_length", "grid_shape", "attention_type", "windw"):
        with pytest.raises(TypeError, match=flat):
            models.build_encoder(vocab_size=9, **{flat: 4})
    with pytest.raises(TypeError, match="`position_options` must be a dict"):
        models.build_encoder(vocab_size=9, position_options=[("max_length", 4)])
