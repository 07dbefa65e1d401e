"""The per-layer checks every keras_posenc layer runs (see docs/style.md)."""

import inspect

import numpy as np
import tensorflow as tf

from keras_posenc import IS_KERAS_3
from keras_posenc.utils import keras, nested_layers


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _model(layer, inputs, call_kwargs):
    symbolic = [keras.Input(a.shape[1:], dtype=a.dtype.name) for a in inputs]
    output = layer(*symbolic, **call_kwargs)
    return keras.Model(symbolic if len(symbolic) > 1 else symbolic[0], output)


def _run(fn, inputs):
    return np.asarray(fn(inputs if len(inputs) > 1 else inputs[0]))


def check_config_round_trip(make_layer):
    layer = make_layer()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config


def check_layer(
    make_layer,
    inputs,
    tmp_path,
    num_weights,
    expected_output_shape,
    call_kwargs=None,
    fit=True,
    atol=1e-5,
    passes_mask=True,
    padding_invariant=True,
):
    """Config, weights, shape, eager/graph/XLA, save/load, fit, masks, precision.

    `make_layer(**kwargs)` builds the layer (`dtype=` is passed to check
    mixed precision); `num_weights` is the exact number of weights once
    built; `expected_output_shape` the eager output's shape on `inputs`,
    given by the test (the symbolic shape may leave the batch as None);
    `passes_mask`
    says whether the first input's Keras mask reaches the output (a bias
    has no tokens, so it passes none); `padding_invariant` whether outputs at
    real tokens ignore what the masked tokens hold.
    """
    call_kwargs = call_kwargs or {}
    inputs = _as_list(inputs)
    check_config_round_trip(make_layer)

    layer = make_layer()
    model = _model(layer, inputs, call_kwargs)
    assert len(layer.weights) == num_weights, [w.name for w in layer.weights]
    expected = tuple(expected_output_shape)
    symbolic = tuple(model.output.shape)
    assert len(symbolic) == len(expected), (symbolic, expected)
    assert all(s in (None, e) for s, e in zip(symbolic, expected)), symbolic
    shapes = [tuple(a.shape) for a in inputs]
    assert tuple(layer.compute_output_shape(*shapes)) == expected

    tensors = [tf.constant(a) for a in inputs]
    reference = _run(model, tensors)
    eager = np.asarray(layer(*tensors, **call_kwargs))
    assert eager.shape == expected, (eager.shape, expected)
    np.testing.assert_allclose(eager, reference, atol=atol)
    graph = _run(tf.function(model), tensors)
    np.testing.assert_allclose(graph, reference, atol=atol)
    xla = _run(tf.function(model, jit_compile=True), tensors)
    np.testing.assert_allclose(xla, reference, atol=1e-4)

    formats = ["model.keras"] if IS_KERAS_3 else ["model.keras", "model.h5"]
    for name in formats:
        path = str(tmp_path / name)
        model.save(path)
        loaded = keras.models.load_model(path)
        np.testing.assert_allclose(_run(loaded, tensors), reference, atol=1e-6)

    if fit:
        model.compile(optimizer="sgd", loss="mse")
        target = np.zeros_like(reference)
        x = inputs if len(inputs) > 1 else inputs[0]
        history = model.fit(x, target, epochs=1, batch_size=len(target), verbose=0)
        assert np.isfinite(history.history["loss"][0])

    check_masking(make_layer, inputs, call_kwargs, passes_mask, padding_invariant)
    check_mixed_precision(make_layer, inputs, call_kwargs, expected)


def _masked(array, mask):
    tensor = tf.constant(array)
    tensor._keras_mask = tf.constant(mask)  # as Keras attaches masks
    return tensor


def check_masking(make_layer, inputs, call_kwargs, passes_mask, padding_invariant):
    """The first input's mask (last token padded) passes on, or not, and
    changing what the padded token holds leaves real tokens unchanged."""
    first, rest = inputs[0], [tf.constant(a) for a in inputs[1:]]
    if first.dtype.kind != "f":
        return  # token ids: the embedding makes the mask (tested there)
    layer = make_layer()
    assert layer.supports_masking
    mask = np.ones(first.shape[:2], bool)
    mask[:, -1] = False
    out = layer(_masked(first, mask), *rest, **call_kwargs)
    got = getattr(out, "_keras_mask", None)
    if passes_mask:
        np.testing.assert_array_equal(np.asarray(got), mask)
    else:
        assert got is None
    if padding_invariant:
        other = first.copy()
        other[:, -1] = 100.0 * np.random.normal(size=other[:, -1].shape)
        again = layer(_masked(other, mask), *rest, **call_kwargs)
        real = (slice(None), slice(0, -1)) if passes_mask else (Ellipsis,)
        np.testing.assert_allclose(
            np.asarray(again)[real], np.asarray(out)[real], atol=1e-5
        )


def check_mixed_precision(make_layer, inputs, call_kwargs=None, expected=None):
    """Built with `dtype=` a mixed policy: finite outputs in its compute dtype,
    float32 weights, and every sublayer it creates on that policy (or float32,
    for position math). The global policy is the other mixed policy meanwhile,
    so a sublayer created without `dtype=self.dtype_policy` is caught."""
    policies = (("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16"))
    for (policy, dtype), (other, _) in zip(policies, policies[::-1]):
        keras.mixed_precision.set_global_policy(other)
        try:
            layer = make_layer(dtype=policy)
            floats = [
                tf.constant(a, dtype) if a.dtype.kind == "f" else tf.constant(a)
                for a in inputs
            ]
            output = layer(*floats, **(call_kwargs or {}))
        finally:
            keras.mixed_precision.set_global_policy("float32")
        assert output.dtype.name == dtype
        assert expected is None or tuple(output.shape) == expected
        assert np.all(np.isfinite(tf.cast(output, tf.float32).numpy()))
        for weight in layer.weights:
            assert tf.as_dtype(weight.dtype).name == "float32", weight.name
        given = set()  # sublayers passed in as arguments keep their own policy
        names = {  # a subclass passes its base's arguments on in **kwargs
            name
            for cls in type(layer).__mro__
            if "__init__" in vars(cls) and cls.__module__.startswith("keras_posenc")
            for name in inspect.signature(cls.__init__).parameters
        }
        for name in names:
            value = getattr(layer, name, None)
            if isinstance(value, keras.layers.Layer):
                given.update(id(x) for x in nested_layers(value))
        for sublayer in nested_layers(layer):
            if id(sublayer) not in given:
                policy_name = sublayer.dtype_policy.name
                assert policy_name in (policy, "float32"), (sublayer.name, policy_name)


#: One builder method per kind of position producer. The slower Keras 2 pass
#: runs the per-method TFLite conversions on these only: the TFLite graph is
#: built from the same TensorFlow ops in both modes, and the Keras 3 pass
#: converts every method.
PRODUCER_KINDS = ("t5", "dynamic_bias", "hybrid", "recursive", "rope", "gated")
