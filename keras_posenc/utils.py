"""Public helpers for other packages: layer walks and the package's registry.

`tflite_export`, the examples and the benchmarks use these instead of the
package's private modules.
"""

import collections.abc

from keras_posenc._backend import BACKEND, IS_TENSORFLOW
from keras_posenc._compat import REGISTERED, keras
from keras_posenc._startup import verbose
from keras_posenc.layers import _rope_checks
from keras_posenc.layers.rotary_embedding import RotaryEmbedding

__all__ = [
    "BACKEND",
    "keras",
    "nested_layers",
    "package_classes",
    "require_tensorflow",
    "set_rope_scaling",
    "verbose",
]

#: The Keras `tf.keras` resolves to (Keras 3, or tf_keras 2 with
#: `TF_USE_LEGACY_KERAS=1`): the one alias, defined in `keras_posenc._compat`.
keras = keras


def require_tensorflow(function):
    """Refuses `function` (a name) in a JAX or PyTorch process: the TFLite
    converter and the TF-MOT tools read TensorFlow graphs."""
    if not IS_TENSORFLOW:
        raise RuntimeError(
            f"`{function}` runs with KERAS_BACKEND=tensorflow: the TFLite "
            "converter reads TensorFlow graphs. Save the model as .keras on "
            f"{BACKEND} and export that file in a TensorFlow process "
            "(`KERAS_BACKEND=tensorflow python -m tflite_export ...`, "
            f"docs/backends.md). Received: the {BACKEND} backend"
        )


def package_classes():
    """`{name: class}` of every class the package registers with Keras.

    These are the names a saved model refers to as `keras_posenc>Name`; pass
    them as `custom_objects` to loaders that look classes up by plain name.
    """
    return dict(REGISTERED)


def nested_layers(root, descend=None):
    """`root` and every layer nested in it (model layers, attributes, lists), once.

    `descend(layer)` returning False stops the walk below that layer.
    """
    found, stack, seen = [], [root], set()
    while stack:
        layer = stack.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        if descend is not None and not descend(layer):
            continue
        children = list(layer.layers) if isinstance(layer, keras.Model) else []
        for value in vars(layer).values():
            items = value if isinstance(value, (list, tuple)) else [value]
            if isinstance(value, collections.abc.Mapping):  # named sublayers
                items = list(value.values())
            children.extend(i for i in items if isinstance(i, keras.layers.Layer))
        stack.extend(children)
    return found


def set_rope_scaling(
    model,
    rope_type="default",
    scaling_factor=1.0,
    original_max_position_embeddings=None,
    **type_parameters,
):
    """Switches every `RotaryEmbedding` in `model` to another context scaling.

    Context extension after training, as done with Llama-style models: the
    weights stay as trained and only the rotary frequencies change (e.g.
    `rope_type="yarn", scaling_factor=4.0,
    original_max_position_embeddings=512`). Everything is checked before any
    layer changes; the model's compiled functions are reset so `predict`
    and `evaluate` trace again.

    Args:
        model: a `keras.Model` or layer holding `RotaryEmbedding` layers.
        rope_type: str, one of `keras_posenc.ops.rotary.ROPE_TYPES`.
        scaling_factor: float, s >= 1.
        original_max_position_embeddings: int, L0, the training context.
        **type_parameters: the type's other parameters (`beta_fast`, ...).

    Returns:
        The number of `RotaryEmbedding` layers switched.
    """
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            "`model` must be a keras.Model or layer holding RotaryEmbedding "
            f"layers. Received: model={model!r}"
        )
    scaling = _rope_checks.rope_scaling(
        rope_type, scaling_factor, original_max_position_embeddings, type_parameters
    )
    layers = [x for x in nested_layers(model) if isinstance(x, RotaryEmbedding)]
    if not layers:
        raise ValueError(
            f"`model` must hold a RotaryEmbedding. Received: model={model.name!r}"
        )
    for layer in layers:
        _rope_checks.coordinates(
            layer.coordinate_dim,
            layer.grid_shape,
            layer.sections,
            layer.learned_frequencies,
            layer.rotary_dim,
            rope_type,
            layer.xpos_scale_base,
        )
        if layer.built:
            _rope_checks.rotary_width(  # r is known: the new type's limits
                layer.rotary_width,
                layer.rotary_width,
                layer.coordinate_dim,
                layer.sections,
                scaling.rope_parameters,
                rope_type,
            )
    for layer in layers:
        layer.rope_type = rope_type
        layer.scaling_factor = scaling.scaling_factor
        layer.original_max_position_embeddings = (
            scaling.original_max_position_embeddings
        )
        layer.rope_parameters = scaling.rope_parameters
    for name in ("predict_function", "test_function", "train_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)
    clear = getattr(model, "clear_compiled_steps", None)  # a CausalLM's
    if clear is not None:
        clear()
    return len(layers)
