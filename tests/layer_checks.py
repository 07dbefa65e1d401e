"""The per-layer checks every keras_posenc layer runs (see docs/style.md)."""

import numpy as np
import tensorflow as tf

from keras_posenc import IS_KERAS_3

keras = tf.keras


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
    call_kwargs=None,
    fit=True,
    atol=1e-5,
    passes_mask=True,
    padding_invariant=True,
):
    """Config, weights, shape, eager/graph/XLA, save/load, fit, masks, precision.

    `num_weights` is the exact number of weights once built; `passes_mask`
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
    shapes = [tuple(t.shape) for t in _as_list(model.inputs)]
    expected = tuple(layer.compute_output_shape(*shapes))
    assert tuple(model.output.shape) == expected

    tensors = [tf.constant(a) for a in inputs]
    reference = _run(model, tensors)
    eager = np.asarray(layer(*tensors, **call_kwargs))
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
    check_mixed_precision(make_layer, inputs, call_kwargs)


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


def check_mixed_precision(make_layer, inputs, call_kwargs=None):
    """Finite outputs in the policy's compute dtype under mixed precision."""
    for policy, dtype in (("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")):
        keras.mixed_precision.set_global_policy(policy)
        try:
            layer = make_layer()
            floats = [
                tf.constant(a, dtype) if a.dtype.kind == "f" else tf.constant(a)
                for a in inputs
            ]
            output = layer(*floats, **(call_kwargs or {}))
            assert output.dtype.name == dtype
            assert np.all(np.isfinite(tf.cast(output, tf.float32).numpy()))
        finally:
            keras.mixed_precision.set_global_policy("float32")


#: One builder method per kind of position producer. The slower Keras 2 pass
#: runs the per-method TFLite conversions on these only: the TFLite graph is
#: built from the same TensorFlow ops in both modes, and the Keras 3 pass
#: converts every method.
PRODUCER_KINDS = ("t5", "dynamic_bias", "hybrid", "recursive", "rope", "gated")
