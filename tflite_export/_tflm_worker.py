"""Runs a model in the TFLM interpreter, in its own process (it may abort).

Usage: python -m tflite_export._tflm_worker WORKDIR
WORKDIR holds model.tflite and inputs.npy (already quantized, one example per
row); outputs.npy is written there. The allocation record goes to stdout.
"""

import pathlib
import sys

import numpy as np
from tflite_micro.python.tflite_micro import runtime

#: Arena given to the interpreter; the report states what it really used.
ARENA_BYTES = 8 << 20


def main(workdir):
    workdir = pathlib.Path(workdir)
    model = (workdir / "model.tflite").read_bytes()
    inputs = np.load(workdir / "inputs.npy")
    interpreter = runtime.Interpreter.from_bytes(model, arena_size=ARENA_BYTES)
    outputs = []
    for example in inputs:
        interpreter.set_input(example[None], 0)
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_output(0))[0])
    np.save(workdir / "outputs.npy", np.stack(outputs))
    sys.stdout.flush()
    interpreter.print_allocations()


if __name__ == "__main__":
    main(sys.argv[1])
