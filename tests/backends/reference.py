"""`python tests/backends/reference.py DIR`: every backend case, saved here.

Builds each case of `cases.py` on the backend it runs on
(`KERAS_BACKEND`), with the weights every backend draws alike
(`cases.shared_weights`), and writes `DIR/<case>.keras` with `DIR/<case>.npz`
(what the model gives: `cases.results`).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402


def main(directory):
    os.makedirs(directory, exist_ok=True)
    for name, build in cases.all_cases().items():
        keras.utils.set_random_seed(0)
        model = cases.shared_weights(build())
        np.savez(os.path.join(directory, f"{name}.npz"), **cases.results(name, model))
        model.save(os.path.join(directory, f"{name}.keras"))
    print(f"{len(cases.all_cases())} cases on {keras.backend.backend()}")


if __name__ == "__main__":
    main(sys.argv[1])
