"""One place that knows which Keras `tf.keras` is (Keras 3 or tf_keras 2)."""

import tensorflow as tf
from tensorflow.python.autograph.core import config as _autograph

keras = tf.keras

#: The layers and ops are written for graphs as they are (TensorFlow control
#: flow, no Python branch on a tensor): autograph leaves them as written.
#: Keras 2 converts every layer's `call` while building a functional model
#: (~0.17 s a new function) and then traces the converted code: Keras 2's
#: local-attention and SavedModel tests ran in 40 s instead of 57 (Keras 3's
#: model and LM export tests did not move). The models' decoding loops,
#: samplers and callbacks stay converted: they call code users write.
_autograph.CONVERSION_RULES = (
    _autograph.config_lib.DoNotConvert("keras_posenc.layers"),
    _autograph.config_lib.DoNotConvert("keras_posenc.ops"),
    *_autograph.CONVERSION_RULES,
)

#: True under Keras 3 (the default), False with `TF_USE_LEGACY_KERAS=1`.
IS_KERAS_3 = keras.layers.Layer.__module__.startswith("keras.")


#: Every class registered by `register`, by plain class name.
REGISTERED = {}


def register(cls):
    """Registers a class under the `keras_posenc` package for deserialization.

    Under Keras 2 a loaded layer is rebuilt by `build_from_config` outside its
    name scope, so its weights would lose the layer prefix (two LayerNorms
    both `gamma:0`, whose optimizer slots then clash in an `.h5` re-save);
    the rebuild runs under the layer's name scope, as the first build did.
    """
    REGISTERED[cls.__name__] = cls
    if not IS_KERAS_3 and not issubclass(cls, keras.Model):
        if "build_from_config" not in cls.__dict__:
            base = cls.build_from_config

            def build_from_config(self, config):
                with tf.name_scope(self.name):
                    base(self, config)

            cls.build_from_config = build_from_config
    return keras.utils.register_keras_serializable(package="keras_posenc")(cls)


def optional_layer(name, value, kind=None):
    """A layer argument: a Layer (of class `kind`), None, or a serialized dict.

    Keras 2's legacy (H5) loader looks classes up by plain name, so the
    package's classes are passed explicitly when deserializing.
    """
    if isinstance(value, dict):
        value = keras.layers.deserialize(value, custom_objects=REGISTERED)
    kind = kind or keras.layers.Layer
    if value is not None and not isinstance(value, kind):
        expected = (
            "a Keras layer" if kind is keras.layers.Layer else f"a {kind.__name__}"
        )
        raise TypeError(
            f"`{name}` must be {expected} or None. Received: {name}={value!r}"
        )
    return value


def dim(x, axis):
    """The static size of `x` on `axis` when known, else the dynamic one."""
    static = x.shape[axis]
    return static if static is not None else tf.shape(x)[axis]


def incoming_mask(tensor, explicit):
    """The Keras mask of `tensor`: Keras 3 passes it, Keras 2 attaches it."""
    if explicit is not None:
        return explicit
    return getattr(tensor, "_keras_mask", None)


def build_sublayer(layer, *shapes):
    """Builds `layer` under its own name scope (unique weight names in Keras 2)."""
    with tf.name_scope(layer.name):
        layer.build(*shapes)


def clone_initializer(initializer):
    """A fresh copy: Keras 2 gives identical values from one unseeded instance."""
    return initializer.__class__.from_config(initializer.get_config())


def not_equal(x, value):
    """Elementwise `x != value` on eager, graph or Keras 3 symbolic tensors."""
    if IS_KERAS_3:
        return keras.ops.not_equal(x, value)
    return tf.not_equal(x, value)


def add_float32_weight(layer, **kwargs):
    """A float32 weight that mixed precision never casts down when read."""
    kwargs.update(dtype="float32")
    kwargs["autocast" if IS_KERAS_3 else "experimental_autocast"] = False
    return layer.add_weight(**kwargs)


def serialize_layer(layer):
    """`keras.layers.serialize(layer)`, or None for no layer (configs)."""
    return None if layer is None else keras.layers.serialize(layer)


def keep_float32_inputs(layer):
    """Stops mixed precision from casting `layer`'s float32 inputs down."""
    if IS_KERAS_3:
        layer.autocast = False
    else:
        layer._autocast = False


def rank(x):
    """The rank of a tensor or a shape (None when TensorFlow does not know it)."""
    shape = getattr(x, "shape", x)
    return shape.rank if hasattr(shape, "rank") else len(shape)


def dtype_name(dtype):
    """`"float32"`, `"int32"`, `"bool"`...: any backend's dtype, by its name."""
    if IS_KERAS_3:
        return keras.backend.standardize_dtype(dtype)
    return tf.as_dtype(dtype).name


def is_integer(x):
    """Whether the tensor `x` holds (signed or unsigned) integers."""
    return dtype_name(x.dtype).startswith(("int", "uint"))
