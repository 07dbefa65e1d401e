"""Runs a model in the TFLM interpreter, in its own process (it may abort).

Usage: python -m tflite_export._tflm.worker, fed by `child.run_worker` with
`model` (the .tflite bytes as uint8) and either `inputs` (already quantized,
one example per row: it returns `output_0 ..`, one per model output, and
reads `num_outputs`, 1 by default) or `arena_search`, the sizes
`(low, high)` to bisect between (it returns `arena`, the smallest arena that
runs the model: `tflite_export.firmware.bisect_arena`, and `arena_32bit`,
that less the 32-bit savings of what TFLM recorded in it).
"""

import os
import sys

import numpy as np

from tflite_export._tflm.child import serve
from tflite_export.firmware import bisect_arena, bytes_32bit

#: Arena given to the interpreter that computes the outputs.
ARENA_BYTES = 8 << 20


def run(arrays):
    from tflite_micro.python.tflite_micro import runtime

    model = arrays["model"].tobytes()
    if "arena_search" in arrays:
        low, high = (int(size) for size in arrays["arena_search"])
        found = bisect_arena(model, runtime, low, high, log=sys.stderr)
        interpreter = runtime.Interpreter.from_bytes(model, arena_size=found)
        records = printed(interpreter.print_allocations)
        return {
            "arena": np.array(found),
            "arena_32bit": np.array(bytes_32bit(found, records)),
        }
    interpreter = runtime.Interpreter.from_bytes(model, arena_size=ARENA_BYTES)
    count = int(arrays.get("num_outputs", 1))
    outputs = [[] for _ in range(count)]
    for example in arrays["inputs"]:
        interpreter.set_input(example[None], 0)
        interpreter.invoke()
        for k in range(count):
            outputs[k].append(np.array(interpreter.get_output(k))[0])
    return {f"output_{k}": np.stack(rows) for k, rows in enumerate(outputs)}


def printed(function):
    """What `function` prints to the C standard error (TFLM's log), as text."""
    sys.stderr.flush()
    read, write = os.pipe()  # a few kilobytes: within the pipe's buffer
    saved = os.dup(2)
    os.dup2(write, 2)
    try:
        function()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write)
    with os.fdopen(read, "rb") as stream:
        return stream.read().decode("utf-8", errors="replace")


if __name__ == "__main__":
    serve(run)
