"""The README's first example: relative-bias attention, fit, save, reload."""

import numpy as np
import tensorflow as tf

import keras_posenc

keras = tf.keras

# Per token: was the token 3 places to the left a 7? Only position tells.
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.integers(1, 10, size=(2048, 16))
y = np.zeros_like(x)
y[:, 3:] = x[:, :-3] == 7

tokens = keras.Input((None,), dtype="int32")
h = keras.layers.Embedding(10, 32)(tokens)
attention = keras_posenc.RelativeMultiHeadAttention(
    num_heads=4,
    key_dim=8,
    position_bias=keras_posenc.RelativePositionBias(num_heads=4, mode="t5"),
)
h = keras.layers.LayerNormalization()(h + attention(h, h))
outputs = keras.layers.Dense(2)(h)
model = keras.Model(tokens, outputs)

model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
model.fit(x, y, epochs=10, batch_size=64, validation_split=0.2, verbose=2)

model.save("relative_bias_example.keras")
reloaded = keras.models.load_model("relative_bias_example.keras")
long_x = rng.integers(1, 10, size=(4, 64))  # 4x the training length
same = np.allclose(model(long_x), reloaded(long_x), atol=1e-6)
print("accuracy:", model.evaluate(x, y, verbose=0)[1], "reloaded equal:", same)
