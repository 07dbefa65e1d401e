"""The README's first example: train short, test long, export int8."""

import keras_posenc  # first: TensorFlow starts without its log lines
import numpy as np
import tensorflow as tf
import tflite_export

keras = tf.keras


def task(rows, length, rng):
    """Per token: was the token 3 places to the left a 7? Only position tells."""
    x = rng.integers(1, 10, size=(rows, length))
    y = np.zeros_like(x)
    y[:, 3:] = x[:, :-3] == 7
    return x, y


keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x_train, y_train = task(2048, 16, rng)
x_test, y_test = task(256, 16, rng)  # held out
x_long, y_long = task(128, 256, rng)  # held out, 16x the training length

# Package layers only, so the model exports to full int8 (see "Edge deployment").
tokens = keras.Input((None,), dtype="int32")
h = keras_posenc.TokenEmbedding(10, 32)(tokens)
attention = keras_posenc.RelativeMultiHeadAttention(
    num_heads=4,
    key_dim=8,
    position_bias=keras_posenc.DynamicPositionBias(num_heads=4),
    attention_window=8,  # blocks of 8 see the distances of training at any length
)
h = keras_posenc.LayerNorm()(h + attention(h, h))
outputs = keras.layers.Dense(2)(h)
model = keras.Model(tokens, outputs)
model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
model.fit(x_train, y_train, epochs=10, batch_size=64, verbose=0)


def report(name, x, y):
    found = np.argmax(model.predict(x, verbose=0), -1)
    print(
        f"{name}: accuracy {np.mean(found == y):.3f} (majority rate "
        f"{1 - y.mean():.3f}), 7s found {np.mean(found[y == 1] == 1):.3f}"
    )


report("held out, length 16", x_test, y_test)
report("held out, length 256", x_long, y_long)

# `import keras_posenc` (above) registers the layers that load_model finds.
model.save("first_example.keras")
reloaded = keras.models.load_model("first_example.keras")
print("reloaded equal:", np.allclose(model(x_long), reloaded(x_long), atol=1e-5))

# Full int8 for a phone (LiteRT) or a microcontroller (TFLM), at length 64.
model_bytes = tflite_export.convert(model, x_train[:256], "int8", sequence_length=64)
static = tflite_export.static_model(model, (64,), "int32")
checked = tflite_export.verify(model_bytes, static, x_long[:64, :64], y_long[:64, :64])
print(f"int8: {len(model_bytes)} bytes, accuracy in TFLM {checked.accuracy_tflm:.3f}")
