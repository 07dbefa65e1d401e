"""Teacher-forced TFLM decoding in a child process (an unsupported op may abort it).

Usage: python -m tflite_export._tflm.teacher, fed by `child.run_worker`
with `model` (uint8) and `ids` (the tokens); it returns `logits` `(T, V)`.
"""

from tflite_export._tflm.child import serve
from tflite_export.generate import Decoder, forced_logits


def _teacher(arrays):
    decoder = Decoder(arrays["model"].tobytes(), "tflm")
    return {"logits": forced_logits(decoder, arrays["ids"])}


if __name__ == "__main__":
    serve(_teacher)
