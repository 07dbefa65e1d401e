"""Position-aware auxiliary tasks for multi-task pre-training.

Each task is a data transform (NumPy, run before `model.fit`), a head on the
encoder's `(B, T, D)` output, and a loss. `build_pretraining_model` shares one
encoder across tasks; `pretraining_data` makes the matching inputs and targets:

    model = build_pretraining_model(encoder, tasks)
    model.compile("adam", loss=task_losses(tasks))
    model.fit(*pretraining_data(tasks, tokens, rng), epochs=...)
"""

import abc

import numpy as np

from keras_posenc import _checks
from keras_posenc._backend import xp
from keras_posenc._compat import keras, register


class PositionTask(abc.ABC):
    """Base class: a `name`, a data `transform`, a `head` and a `loss`."""

    name = "task"

    @abc.abstractmethod
    def transform(self, tokens, rng):
        """`(inputs dict, target)` from a `(B, T)` batch of sequences."""

    @abc.abstractmethod
    def head(self, encoded, inputs):
        """Output logits from the encoder output and this task's inputs."""

    def extra_inputs(self):
        """Inputs besides the task's token sequence, by name."""
        return {}

    def loss(self):
        """Sparse categorical cross-entropy on the head's logits."""
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class PositionPrediction(PositionTask):
    """Predict each token's absolute index `t` in `[0, T)` from its output."""

    name = "position"

    def __init__(self, sequence_length):
        self.sequence_length = _checks.positive_int("sequence_length", sequence_length)

    def transform(self, tokens, rng):
        tokens = np.asarray(tokens)
        target = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape).copy()
        return {f"{self.name}_tokens": tokens}, target

    def head(self, encoded, inputs):
        return keras.layers.Dense(self.sequence_length, name="position_head")(encoded)


class RelativeDistancePrediction(PositionTask):
    """Predict `clip(j - i, -M, M)` for sampled token pairs `(i, j)`."""

    name = "distance"

    def __init__(self, max_distance, num_pairs=8):
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        self.num_pairs = _checks.positive_int("num_pairs", num_pairs)

    def transform(self, tokens, rng):
        tokens = np.asarray(tokens)
        batch, length = tokens.shape
        pairs = rng.integers(0, length, size=(batch, self.num_pairs, 2))
        distance = pairs[..., 1] - pairs[..., 0]
        target = np.clip(distance, -self.max_distance, self.max_distance)
        inputs = {f"{self.name}_tokens": tokens, "distance_pairs": pairs}
        return inputs, target + self.max_distance

    def head(self, encoded, inputs):
        gather = PairGather(name="distance_pair_gather")
        pair = gather(encoded, inputs["distance_pairs"])
        hidden = keras.layers.Dense(encoded.shape[-1], "relu", name="distance_hidden")
        logits = keras.layers.Dense(2 * self.max_distance + 1, name="distance_head")
        return logits(hidden(pair))

    def extra_inputs(self):
        pairs = keras.Input((self.num_pairs, 2), dtype="int32", name="distance_pairs")
        return {"distance_pairs": pairs}


class OrderRecovery(PositionTask):
    """Shuffle a fraction of positions; predict each token's original index."""

    name = "order"

    def __init__(self, sequence_length, shuffle_fraction=0.25):
        self.sequence_length = _checks.positive_int("sequence_length", sequence_length)
        self.shuffle_fraction = _checks.rate("shuffle_fraction", shuffle_fraction)

    def transform(self, tokens, rng):
        tokens = np.asarray(tokens)
        batch, length = tokens.shape
        order = np.broadcast_to(np.arange(length), (batch, length)).copy()
        count = max(2, int(round(self.shuffle_fraction * length)))
        for row in order:
            chosen = rng.choice(length, size=count, replace=False)
            row[chosen] = rng.permutation(row[chosen])
        shuffled = np.take_along_axis(tokens, order, axis=1)
        return {f"{self.name}_tokens": shuffled}, order

    def head(self, encoded, inputs):
        return keras.layers.Dense(self.sequence_length, name="order_head")(encoded)


@register
class PairGather(keras.layers.Layer):
    """Concatenated encoder outputs at index pairs: `(B, P, 2) -> (B, P, 2D)`."""

    def call(self, encoded, pairs):
        pairs = xp.cast(pairs, xp.int32)
        gathered = xp.gather(encoded, pairs, batch_dims=1)  # (B, P, 2, D)
        shape = xp.shape(gathered)
        return xp.reshape(gathered, [shape[0], shape[1], 2 * encoded.shape[-1]])

    def compute_output_shape(self, encoded_shape, pairs_shape=None):
        pairs = pairs_shape[1] if pairs_shape is not None else None
        return (encoded_shape[0], pairs, 2 * encoded_shape[-1])


def build_pretraining_model(encoder, tasks):
    """One model with a head per task, all sharing `encoder`'s weights."""
    if not tasks or not all(isinstance(task, PositionTask) for task in tasks):
        expectation = "a non-empty list of PositionTask"
        _checks.fail("tasks", expectation, tasks, error=TypeError)
    inputs, outputs = {}, {}
    for task in tasks:
        key = f"{task.name}_tokens"
        # Keras 2 matches dict inputs by layer name, Keras 3 by key: use both.
        shape, dtype = encoder.input.shape[1:], encoder.input.dtype
        task_inputs = {key: keras.Input(shape, dtype=dtype, name=key)}
        task_inputs.update(task.extra_inputs())
        encoded = encoder(task_inputs[f"{task.name}_tokens"])
        outputs[task.name] = task.head(encoded, task_inputs)
        inputs.update(task_inputs)
    return keras.Model(inputs, outputs, name="pretraining")


def task_losses(tasks):
    """The `loss=` dict for `model.compile`."""
    return {task.name: task.loss() for task in tasks}


def pretraining_data(tasks, tokens, rng):
    """`(inputs dict, targets dict)` for `model.fit` from `(B, T)` tokens."""
    inputs, targets = {}, {}
    for task in tasks:
        task_inputs, target = task.transform(tokens, rng)
        inputs.update(task_inputs)
        targets[task.name] = target
    return inputs, targets
