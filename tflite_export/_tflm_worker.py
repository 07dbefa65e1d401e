"""Runs a model in the TFLM interpreter, in its own process (it may abort).

Usage: python -m tflite_export._tflm_worker, fed by `_child.run_worker` with
`model` (the .tflite bytes as uint8) and `inputs` (already quantized, one
example per row); it returns `outputs`. The allocation record goes to stderr.
"""

import numpy as np

from tflite_export._child import serve

#: Arena given to the interpreter; the report states what it really used.
ARENA_BYTES = 8 << 20


def run(arrays):
    from tflite_micro.python.tflite_micro import runtime

    model = arrays["model"].tobytes()
    interpreter = runtime.Interpreter.from_bytes(model, arena_size=ARENA_BYTES)
    outputs = []
    for example in arrays["inputs"]:
        interpreter.set_input(example[None], 0)
        interpreter.invoke()
        outputs.append(np.array(interpreter.get_output(0))[0])
    interpreter.print_allocations()
    return {"outputs": np.stack(outputs)}


if __name__ == "__main__":
    serve(run)
