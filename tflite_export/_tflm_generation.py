"""TFLM generation in a child process (an unsupported op may abort it).

Usage: python -m tflite_export._tflm_generation, fed by `_child.run_worker`
with `model` (uint8), `prompts`, `lengths` and `options` (JSON text).
"""

import json
import re

import numpy as np

from tflite_export._child import run_worker, serve

#: Seconds a TFLM generation subprocess may run.
TFLM_GENERATE_TIMEOUT_SECONDS = 600
#: TFLM log lines that say why a model did not run.
TFLM_CAUSE = re.compile(r"Didn't find op|failed to prepare|not supported|!=")


def in_subprocess(model_bytes, prompts, lengths, options):
    """Generated tokens from TFLM in a child; a RuntimeError says why it failed."""
    arrays = {
        "model": np.frombuffer(bytes(model_bytes), np.uint8),
        "prompts": prompts,
        "lengths": lengths,
        "options": np.array(json.dumps(options)),
    }
    results, log, code = run_worker(
        "tflite_export._tflm_generation", arrays, TFLM_GENERATE_TIMEOUT_SECONDS
    )
    if results is None:
        lines = [line for line in log.splitlines() if line.strip()]
        causes = [line for line in lines if TFLM_CAUSE.search(line)]
        reason = (causes or lines or [f"exit status {code}"])[-1]
        raise RuntimeError(f"TFLM generation failed: {reason}")
    return results["tokens"]


def _generate(arrays):
    from tflite_export.generate import Decoder, decode_rows

    options = json.loads(str(arrays["options"]))
    decoder = Decoder(arrays["model"].tobytes(), "tflm")
    return {
        "tokens": decode_rows(decoder, arrays["prompts"], arrays["lengths"], options)
    }


if __name__ == "__main__":
    serve(_generate)
