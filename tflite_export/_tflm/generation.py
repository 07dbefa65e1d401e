"""TFLM generation in a child process (an unsupported op may abort it).

Usage: python -m tflite_export._tflm.generation, fed by `child.run_worker`
with `model` (uint8), `prompts`, `lengths` and `options` (JSON text); it
returns `tokens`.
"""

import json

from keras_posenc import generation, samplers
from tflite_export._tflm.child import serve
from tflite_export.generate import Decoder, decode_rows


def _generate(arrays):
    options = json.loads(str(arrays["options"]))
    if isinstance(options["sampler"], dict):  # a Sampler instance, serialized
        options["sampler"] = samplers.deserialize(options["sampler"])
    # The user's Sampling, rebuilt on this side of the process boundary.
    sampling = generation.Sampling(
        **{name: options[name] for name in generation.SAMPLING_FIELDS}
    )
    decoder = Decoder(arrays["model"].tobytes(), "tflm")
    new = options["max_new_tokens"]
    tokens = decode_rows(decoder, arrays["prompts"], arrays["lengths"], new, sampling)
    return {"tokens": tokens}


if __name__ == "__main__":
    serve(_generate)
