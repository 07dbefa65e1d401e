"""TensorFlow imported quietly: its start-up lines are not errors.

Importing TensorFlow prints, from C++ and before any Python logging can be
set, "All log messages before absl::InitializeLog() is called are written
to STDERR", "oneDNN custom operations are on" and "Could not find cuda
drivers" (twice: two libraries load). None is an error, and
`TF_CPP_MIN_LOG_LEVEL` does not reach them. The first `import keras_posenc`
(before TensorFlow) imports TensorFlow with the process' standard error
pointed at /dev/null, then restores it (a Python exception raised by the
import still shows), with `TF_CPP_MIN_LOG_LEVEL=3` unless set (later C++
notices, "failed call to cuInit" on a machine without a GPU). When the
user imported TensorFlow first, its start-up lines are printed already (they
cannot be taken back), but the first device query, which logs "failed call
to cuInit" as an error on a machine without a GPU, still runs here with
standard error on /dev/null. Set `KERAS_POSENC_VERBOSE=1` to keep them all.
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


def verbose():
    """Whether the user asked to see every log line (`KERAS_POSENC_VERBOSE=1`)."""
    return os.environ.get(VERBOSE_VARIABLE) == "1"


def import_tensorflow_quietly():
    """Imports TensorFlow without its start-up lines (once, if not yet), and
    queries the devices quietly (the "failed call to cuInit" line)."""
    if verbose():
        return
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # later C++ notices too
    with silenced_stderr():
        import tensorflow

        tensorflow.config.list_physical_devices()


import_tensorflow_quietly()
