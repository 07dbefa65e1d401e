"""Compiling a model for a test's `fit`: traced once, not twice."""

import tensorflow as tf

keras = tf.keras


def compile_built(model, learning_rate):
    """`model` compiled with Adam and a from-logits sparse cross-entropy, its
    optimizer built before `fit`.

    Both Keras modes create the optimizer's variables inside the first trace
    of the training step, and TensorFlow traces a function that created
    variables a second time. Built first, over the same trainable variables
    (the same variables and initial values), the step is traced once: a test
    that trains a QAT LM (`tests/export/test_export_qat_lm.py`) 31 -> 21 s
    here. No metrics: a compiled metric's variables would be created in the
    trace too. A `CausalLM` (the QAT LMs) now builds it itself
    (`CausalLM.make_train_function`); the functional QAT classifiers
    (`tests/export/test_export_qat.py`) still need it here.
    """
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(learning_rate), loss)
    model.optimizer.build(model.trainable_variables)
