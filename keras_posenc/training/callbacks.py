"""Training aids: position warm-up."""

from keras_posenc import _checks
from keras_posenc._compat import keras
from keras_posenc.layers.recursive_position_update import RecursivePositionUpdate
from keras_posenc.models.methods import POSITION_LAYERS
from keras_posenc.utils import nested_layers

#: Layers whose weights generate positions (frozen by `PositionWarmup`): the
#: position layers of every method (`methods.POSITION_LAYERS`; those without
#: weights freeze nothing) but the recursive block, of which only the
#: position path is a generator (`find_generators`).
POSITION_GENERATORS = tuple(
    cls for cls in POSITION_LAYERS if cls is not RecursivePositionUpdate
)


class PositionWarmup(keras.callbacks.Callback):
    """Freezes position generators, then releases their learning gradually.

    For the first `warmup_steps` training batches the weights of every
    position generator are restored after each step (they stay exactly as
    initialised while the rest of the model learns). Over the next
    `ramp_steps` batches each of their updates is scaled by
    `(step - warmup_steps) / ramp_steps`, a learning-rate multiplier rising
    from 0 to 1 that works with any optimizer (the scaling acts on the applied
    update, so Adam's normalisation cannot undo it). After that they train
    normally. Generators are the `POSITION_GENERATORS` layers and the position
    path of `RecursivePositionUpdate`, or the `layers` you pass.

    Args:
        warmup_steps: int, batches with frozen generators.
        ramp_steps: int, batches over which learning is released.
            Defaults to `0` (release at once).
        layers: optional list of layers to treat as generators.
            Defaults to `None` (found in the model).

    Example:

    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from keras_posenc import models
    >>> from keras_posenc.training.callbacks import PositionWarmup
    >>> model = models.build_classifier(2, vocab_size=5, hidden_dim=8,
    ...                                 num_heads=2, num_layers=1, position="hpn")
    >>> model.compile("adam", "sparse_categorical_crossentropy")
    >>> warmup = PositionWarmup(warmup_steps=2, ramp_steps=2)
    >>> _ = model.fit(np.ones((8, 4)), np.zeros(8), batch_size=4, epochs=1,
    ...               callbacks=[warmup], verbose=0)
    >>> warmup.step
    2
    """

    def __init__(self, warmup_steps, ramp_steps=0, layers=None):
        super().__init__()
        warmup_steps = _checks.positive_int("warmup_steps", warmup_steps, minimum=0)
        self.warmup_steps = warmup_steps
        self.ramp_steps = _checks.positive_int("ramp_steps", ramp_steps, minimum=0)
        if layers is not None and not all(
            isinstance(layer, keras.layers.Layer) for layer in layers
        ):
            expectation = "a list of Keras layers or None"
            _checks.fail("layers", expectation, layers, error=TypeError)
        self.layers = layers
        self.step = 0
        self._variables = []
        self._snapshot = None

    def on_train_begin(self, logs=None):
        layers = self.layers
        if layers is None:
            layers = find_generators(self.model)
        seen = set()
        self._variables = []
        for layer in layers:
            for variable in layer.trainable_weights:
                if id(variable) not in seen:
                    seen.add(id(variable))
                    self._variables.append(variable)

    def on_train_batch_begin(self, batch, logs=None):
        if self.scale() < 1.0:
            self._snapshot = [variable.numpy() for variable in self._variables]

    def on_train_batch_end(self, batch, logs=None):
        scale = self.scale()
        self.step += 1
        if scale >= 1.0 or self._snapshot is None:
            return
        for variable, before in zip(self._variables, self._snapshot):
            variable.assign(before + scale * (variable.numpy() - before))
        self._snapshot = None

    def scale(self):
        """The update multiplier of the current step: 0, rising to 1."""
        if self.step < self.warmup_steps:
            return 0.0
        if self.ramp_steps == 0:
            return 1.0
        return min(1.0, (self.step - self.warmup_steps + 1) / (self.ramp_steps + 1))


def find_generators(model):
    """The position-generating layers inside `model` (searched recursively)."""
    found = []
    for layer in nested_layers(
        model, descend=lambda layer: not isinstance(layer, RecursivePositionUpdate)
    ):
        if isinstance(layer, POSITION_GENERATORS):
            found.append(layer)
        elif isinstance(layer, RecursivePositionUpdate):
            found.extend(
                [layer.position_attention, layer.position_hidden, layer.position_output]
            )
    return found
