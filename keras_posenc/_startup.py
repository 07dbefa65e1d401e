"""TensorFlow imported quietly: its start-up lines are not errors.

Importing TensorFlow prints, from C++ and before any Python logging can be
set, "All log messages before absl::InitializeLog() is called are written
to STDERR", "oneDNN custom operations are on" and "Could not find cuda
drivers" (twice: two libraries load). None is an error, and
`TF_CPP_MIN_LOG_LEVEL` does not reach them. The first `import keras_posenc`
(before TensorFlow) imports TensorFlow with the process' standard error
pointed at /dev/null, then restores it (a Python exception raised by the
import still shows), with `TF_CPP_MIN_LOG_LEVEL=3` unless set (later C++
notices, "failed call to cuInit" on a machine without a GPU). Set
`KERAS_POSENC_VERBOSE=1` to keep them all.
"""

import contextlib
import os
import sys

#: Set to 1 to see TensorFlow's start-up lines.
VERBOSE_VARIABLE = "KERAS_POSENC_VERBOSE"


@contextlib.contextmanager
def silenced_stderr():
    """The process' file descriptor 2 on /dev/null inside the block (left
    as it is where there is no descriptor 2 to save)."""
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error at all: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def import_tensorflow_quietly():
    """Imports TensorFlow without its start-up lines (once, if not yet)."""
    if "tensorflow" in sys.modules or os.environ.get(VERBOSE_VARIABLE) == "1":
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # later C++ notices too
    with silenced_stderr():
        import tensorflow  # noqa: F401


import_tensorflow_quietly()
