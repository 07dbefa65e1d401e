"""Recipes shared by the demo, examples, benchmarks and tests.

One place for the digits task (data split, classifier, compile settings), so
every script that reports a digits number trains the same thing, and for the
small counting LM that export checks train.
"""

from keras_posenc import models
from keras_posenc._compat import keras
from keras_posenc.data import datasets, synthetic

#: The digits classifier's builder arguments (16 patch tokens of 4 pixels).
DIGITS_MODEL = dict(input_dim=4, sequence_length=16, num_heads=4)


def compile_classifier(model, learning_rate=2e-3):
    """Compiles `model` (integer labels, logits out) with Adam; returns it.

    Args:
        model: a `keras.Model` whose outputs are class logits.
        learning_rate: float or a Keras learning-rate schedule.
    """
    model.compile(
        keras.optimizers.Adam(learning_rate),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def digits_data(train_fraction=0.8, limit=None, seed=0):
    """`((train_x, train_y), (test_x, test_y))` from `datasets.digits_patches`.

    Args:
        train_fraction: float, the share of examples in the training split.
        limit: int or None, keep only the first `limit` (shuffled) examples.
        seed: int, the shuffle seed.
    """
    x, y = datasets.digits_patches(seed)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    split = int(train_fraction * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def digits_classifier(
    position="hybrid", hidden_dim=32, learning_rate=2e-3, **builder_kwargs
):
    """A compiled `models.build_classifier` for the digits patches.

    Args:
        position: str, one of `models.POSITION_METHODS`.
        hidden_dim: int, the model width.
        learning_rate: float or schedule, Adam's learning rate.
        **builder_kwargs: more `models.build_classifier` arguments.
    """
    arguments = dict(DIGITS_MODEL, hidden_dim=hidden_dim, position=position)
    arguments.update(builder_kwargs)
    return compile_classifier(models.build_classifier(10, **arguments), learning_rate)


#: The counting LM's builder arguments (`counting_lm`).
COUNTING_LM = dict(
    vocab_size=24,
    hidden_dim=32,
    num_layers=2,
    num_heads=4,
    position_options={"max_length": 32},
)


def counting_lm(position, steps=300, seed=0, length=16, **builder_kwargs):
    """A small causal LM trained on `synthetic.counting_sequences`.

    Args:
        position: str, one of `models.POSITION_METHODS`.
        steps: int, training batches of 32 sequences of `length`.
        seed: int, the weights' and the data's seed.
        length: int, the training sequences' length.
        **builder_kwargs: more `models.build_causal_lm` arguments.
    """
    keras.utils.set_random_seed(seed)
    arguments = dict(COUNTING_LM, position=position)
    arguments.update(builder_kwargs)
    arguments["position_options"] = {
        **COUNTING_LM["position_options"],
        **(builder_kwargs.get("position_options") or {}),
    }
    model = models.build_causal_lm(**arguments)
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rows = synthetic.counting_sequences(
        steps * 32, length + 1, arguments["vocab_size"], seed
    )
    model.fit(rows[:, :-1], rows[:, 1:], batch_size=32, epochs=1, verbose=0)
    return model
