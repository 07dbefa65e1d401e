"""TFLM generation in a child process (an unsupported op may abort it).

Usage: python -m tflite_export._tflm_generation WORKDIR
WORKDIR holds model.tflite, prompts.npz and options.json; tokens.npy is
written there.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from tflite_export.generate import Decoder, decode_rows

#: Seconds a TFLM generation subprocess may run.
TFLM_GENERATE_TIMEOUT_SECONDS = 600
#: TFLM log lines that say why a model did not run.
TFLM_CAUSE = re.compile(r"Didn't find op|failed to prepare|not supported|!=")


def in_subprocess(model_bytes, prompts, lengths, options):
    """TFLM generation in a child process (an unsupported op may abort it)."""
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "model.tflite"), "wb") as handle:
            handle.write(model_bytes)
        np.savez(os.path.join(workdir, "prompts.npz"), prompts=prompts, lengths=lengths)
        with open(os.path.join(workdir, "options.json"), "w") as handle:
            json.dump(options, handle)
        result = subprocess.run(
            [sys.executable, "-m", "tflite_export._tflm_generation", workdir],
            capture_output=True,
            text=True,
            timeout=TFLM_GENERATE_TIMEOUT_SECONDS,
        )
        if result.returncode != 0:
            lines = [
                line for line in (result.stdout + result.stderr).splitlines() if line
            ]
            causes = [line for line in lines if TFLM_CAUSE.search(line)]
            reason = (causes or lines or [f"exit status {result.returncode}"])[-1]
            raise RuntimeError(f"TFLM generation failed: {reason}")
        return np.load(os.path.join(workdir, "tokens.npy"))


def _worker(workdir):
    with open(os.path.join(workdir, "model.tflite"), "rb") as handle:
        model_bytes = handle.read()
    arrays = np.load(os.path.join(workdir, "prompts.npz"))
    with open(os.path.join(workdir, "options.json")) as handle:
        options = json.load(handle)
    decoder = Decoder(model_bytes, "tflm")
    tokens = decode_rows(decoder, arrays["prompts"], arrays["lengths"], options)
    np.save(os.path.join(workdir, "tokens.npy"), tokens)


if __name__ == "__main__":
    _worker(sys.argv[1])
