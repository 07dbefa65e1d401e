"""Worker processes that die with their parent and leave no files behind.

TFLM may abort a process, so it runs in a child. Arrays go to the child on
its stdin and come back on a private copy of its stdout (the interpreter's C
prints go to stderr); no temporary folder is made. On Linux the child is
killed when its parent dies (`PR_SET_PDEATHSIG`), and the parent kills the
child when it is interrupted or times out.
"""

import io
import os
import signal
import subprocess
import sys

import numpy as np

#: prctl option that signals a process when its parent dies (Linux).
PR_SET_PDEATHSIG = 1
#: Packages a worker imports from without their `__init__`.
LIGHT_PACKAGES = ("keras_posenc", "tflite_export")
#: The child's program: `python -c START module`.
START = f"""
import importlib.util, runpy, sys
for package in {LIGHT_PACKAGES!r}:
    spec = importlib.util.find_spec(package)
    sys.modules[package] = importlib.util.module_from_spec(spec)
runpy.run_module(sys.argv[1], run_name="__main__", alter_sys=True)
"""


def run_worker(module, arrays, timeout):
    """Runs `module` in a child on `arrays`; `(result arrays or None, log, code)`."""
    payload = io.BytesIO()
    np.savez(payload, **arrays)
    child = subprocess.Popen(
        [sys.executable, "-c", START, module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with(os.getpid()),
    )
    try:
        out, err = child.communicate(payload.getvalue(), timeout=timeout)
    finally:
        if child.poll() is None:  # a timeout or an interrupt: no orphan
            child.kill()
            child.wait()
    log = err.decode("utf-8", errors="replace")
    if child.returncode != 0 or not out:
        return None, log, child.returncode
    with np.load(io.BytesIO(out)) as results:
        return dict(results), log, 0


def serve(handler):
    """In the child: reads arrays from stdin, writes `handler(arrays)` back."""
    data = os.dup(1)
    os.dup2(2, 1)  # C-level prints go to stderr, not into the results
    sys.stdout = sys.stderr
    with np.load(io.BytesIO(sys.stdin.buffer.read())) as arrays:
        results = handler(dict(arrays))
    buffer = io.BytesIO()
    np.savez(buffer, **results)
    with os.fdopen(data, "wb") as stream:
        stream.write(buffer.getvalue())


def _die_with(parent):
    def arrange():  # runs in the child, before exec
        try:
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # not Linux: the parent still kills it
            return
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)

    return arrange
