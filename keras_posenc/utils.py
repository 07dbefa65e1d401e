"""Public helpers for other packages: layer walks and the package's registry.

`tflite_export`, the examples and the benchmarks use these instead of the
package's private modules.
"""

from keras_posenc._compat import REGISTERED, keras

__all__ = ["nested_layers", "package_classes"]


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
            children.extend(i for i in items if isinstance(i, keras.layers.Layer))
        stack.extend(children)
    return found
