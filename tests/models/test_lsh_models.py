"""LSH encoders (`{"attention_type": "lsh"}`), every method that runs it."""

import numpy as np
import pytest
import tensorflow as tf
from builders import builder_kwargs
from marks import kinds_fast

from keras_posenc import models

keras = tf.keras
LSH = dict(
    attention_options={"attention_type": "lsh", "num_hashes": 2, "bucket_size": 4}
)


def _classifier(position, attention_options=None, **kwargs):
    """An LSH token classifier; `attention_options` keys override `LSH`'s."""
    options = {**LSH["attention_options"], **(attention_options or {})}
    return models.build_token_classifier(
        3,
        vocab_size=10,
        hidden_dim=8,
        num_heads=2,
        num_layers=2,
        position=position,
        mask_zero=True,
        attention_options={k: v for k, v in options.items() if v is not None},
        **builder_kwargs(max_length=32, **kwargs),
    )


@pytest.mark.parametrize(
    "position",
    kinds_fast(models.LSH_METHODS, per_kind=True),
)
def test_every_method_runs_lsh_and_padding_never_reaches_real_tokens(position):
    model = _classifier(position)
    ids = np.random.default_rng(0).integers(1, 10, size=(2, 15))
    ids[1, 11:] = 0  # padding, in the same 4 chunks
    out = model(ids).numpy()
    assert out.shape == (2, 15, 3) and np.isfinite(out).all()
    # The row alone (3 chunks) and padded to 32 tokens: each row hashes
    # into the buckets of its real tokens, padding sorts after them.
    alone = model(ids[1:, :11]).numpy()
    np.testing.assert_allclose(out[1, :11], alone[0], atol=1e-5)
    longer = model(np.pad(ids[1:, :11], [(0, 0), (0, 21)])).numpy()  # 8 chunks
    np.testing.assert_allclose(longer[0, :11], alone[0], atol=1e-5)


def test_packed_rows_are_refused_with_lsh():
    with pytest.raises(ValueError, match="`packed` must be False with attention_t"):
        _classifier("t5", packed=True)


@pytest.mark.slow
def test_an_lsh_encoder_fits_saves_and_reloads(tmp_path):
    model = _classifier("t5")
    model.compile(
        keras.optimizers.SGD(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = np.random.default_rng(1).integers(1, 10, size=(8, 16))
    y = np.random.default_rng(2).integers(0, 3, size=(8, 16))
    history = model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    model.save(tmp_path / "lsh.keras")
    loaded = keras.models.load_model(tmp_path / "lsh.keras")
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attention_options": {"attention_type": "local"}}, "attention_type.*'dense'"),
        ({"position": "recursive"}, "attention_type.*'dense' unless position"),
        ({"position": "fox"}, "attention_type.*'dense' unless position"),
        ({"position": "cope"}, "attention_type.*'dense' unless position"),
        ({"attention_window": 4}, "attention_window.*unset with attention_type"),
        ({"share_position_bias": True}, "share_position_bias.*unset"),
        ({"attention_options": {"buckets": 4}}, "Unknown keys: \\['buckets'\\]"),
        (
            {"attention_options": {"attention_type": "dense", "bucket_size": None}},
            "attention_options.*None with attention_type='dense'",
        ),
    ],
)
def test_rejects_what_an_lsh_encoder_cannot_be(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _classifier(kwargs.pop("position", "t5"), **kwargs)
