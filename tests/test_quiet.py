"""Quiet by default: TensorFlow's start-up lines and the converter's harmless
notes stay off a user's terminal (`keras_posenc/_startup.py`)."""

import os
import subprocess
import sys

import pytest

#: What TensorFlow prints at start-up (`keras_posenc/_startup.py`).
START_UP = ("absl::InitializeLog", "oneDNN custom operations", "cuda drivers")
CONVERT = """
import numpy as np
import tflite_export
from keras_posenc import models
model = models.build_classifier(2, vocab_size=5, sequence_length=4, hidden_dim=8,
                                num_heads=2, num_layers=1)
tflite_export.convert(model, np.ones((8, 4), "int32"), "int8")
print("converted")
"""


def _run(code, **environment):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    env.update(environment)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_importing_the_package_prints_no_tensorflow_start_up_lines():
    quiet = _run("import tflite_export")
    assert quiet.returncode == 0, quiet.stderr
    assert not [line for line in START_UP if line in quiet.stderr], quiet.stderr
    loud = _run("import keras_posenc", KERAS_POSENC_VERBOSE="1")
    assert any(line in loud.stderr for line in START_UP), loud.stderr


def test_a_conversion_prints_none_of_the_converters_harmless_notes():
    pytest.importorskip("ai_edge_litert", reason="needs ai-edge-litert (LiteRT)")
    run = _run("import keras_posenc\n" + CONVERT)
    assert run.returncode == 0 and run.stdout.strip().endswith("converted"), run.stderr
    for note in ("unsaved custom gradients", "inference_input_type", *START_UP):
        assert note not in run.stderr, run.stderr


def test_the_package_imports_with_no_standard_error_at_all():
    # A daemon may start with descriptor 2 closed: nothing to save or silence.
    run = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -c "import keras_posenc; print(7)" 2>&-'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout.strip() == "7", run
