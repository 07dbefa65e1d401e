"""Custom gradients registered once per kind, not once per trace."""

import functools

import tensorflow as tf
from tensorflow.python.eager import record  # tf.custom_gradient's tape hook

from keras_posenc._backend import IS_TENSORFLOW


def registered_gradient(name):
    """Decorate `gradient(upstream)` (one gradient per input) into
    `apply(forward, *inputs)`: `forward(*inputs)`, one tensor, whose gradient
    into `inputs` is `gradient` of its upstream gradient.

    `tf.custom_gradient` in a graph registers a new gradient function in
    TensorFlow's global registry at every trace, and the registry keeps it,
    and through it the traced graph (a model's whole training step), alive
    for the rest of the process. Here a graph gets an IdentityN over the
    output and `inputs` whose gradient is registered once, under `name` (for
    `tf.gradients` and SavedModels), and recorded on the running tapes as
    `tf.custom_gradient` records it. Eager calls use `tf.custom_gradient`
    (which registers nothing there). `gradient` reads only `upstream`: a
    SavedModel traces it without the op. On JAX and PyTorch, `apply` is
    `forward(*inputs)`, differentiated as written.
    """

    def decorate(gradient):
        if not IS_TENSORFLOW:  # JAX and PyTorch differentiate `forward` itself
            return lambda forward, *inputs: forward(*inputs)

        def identity_n_gradient(unused_op, upstream, *unused):
            return [None, *gradient(upstream)]  # none into `forward`'s own ops

        tf.RegisterGradient(name)(identity_n_gradient)

        def apply(forward, *inputs):
            if tf.executing_eagerly():

                @tf.custom_gradient
                def call(*inputs):
                    return forward(*inputs), gradient

                return call(*inputs)
            tensors = [forward(*inputs), *inputs]
            graph = tf.compat.v1.get_default_graph()
            with graph.gradient_override_map({"IdentityN": name}):
                outputs = tf.identity_n(tensors)
            tape_gradient = functools.partial(identity_n_gradient, None)
            record.record_operation(name, outputs, tensors, tape_gradient)
            return outputs[0]

        return apply

    return decorate
