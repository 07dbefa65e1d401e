"""A worker that reports what its start imported (see `tflite_export._tflm.child`)."""

import sys

import numpy as np

from tflite_export._tflm.child import serve

if __name__ == "__main__":
    serve(
        lambda arrays: {
            "tensorflow": np.array("tensorflow" in sys.modules),
            "child": np.array("tflite_export._tflm.child" in sys.modules),
        }
    )
