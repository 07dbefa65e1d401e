import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import tflite_export

INT8 = {"dtype": np.int8, "quantization": (0.5, -3)}
FLOAT = {"dtype": np.float32, "quantization": (0.0, 0)}


def test_quantize_is_round_of_value_over_scale_plus_zero_point():
    values = np.array([-70.0, -1.3, 0.0, 0.26, 2.0, 70.0], np.float32)
    got = tflite_export.quantize(values, INT8)
    want = np.clip(np.round(values / 0.5 - 3), -128, 127).astype(np.int8)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, want)


def test_dequantize_inverts_quantize_within_half_a_step():
    values = np.linspace(-60, 60, 41).astype(np.float32)
    back = tflite_export.dequantize(tflite_export.quantize(values, INT8), INT8)
    np.testing.assert_allclose(back, values, atol=0.25 + 1e-6)


@pytest.mark.parametrize("function", [tflite_export.quantize, tflite_export.dequantize])
def test_float_tensors_pass_through(function):
    values = np.array([1.5, -2.25], np.float32)
    np.testing.assert_array_equal(function(values, FLOAT), values)


def _children(pid, module=None):
    """The processes whose parent is `pid` (running `module`, if given)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[1]) == pid:
            if module is None or module in _command_line(entry):
                found.append(int(entry))
    return found


def _command_line(pid):
    """The process' arguments as one string ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")
def test_a_killed_parent_takes_its_tflm_worker_along():
    """Killing an export mid-verification leaves no orphaned worker behind."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    script = (
        "import numpy as np\n"
        "from tflite_export._tflm.child import run_worker\n"
        "run_worker('sleepy_worker', {'x': np.zeros(1)}, 300)\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tests}{os.pathsep}{tests.parent}")
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.time() + 60
    workers = []
    while not workers and time.time() < deadline:
        time.sleep(0.2)
        workers = _children(parent.pid)
    assert workers, "the worker never started"
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while any(map(_alive, workers)) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, workers))


def test_a_worker_starts_without_importing_tensorflow(monkeypatch):
    """The packages' `__init__` (TensorFlow: 5 s) is skipped in every worker."""
    from tflite_export._tflm.child import run_worker

    tests = pathlib.Path(__file__).resolve().parents[1]
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tests), path])))
    results, log, code = run_worker("imports_worker", {"x": np.zeros(1)}, 60)
    assert code == 0, log
    assert results["child"] and not results["tensorflow"]


@pytest.mark.slow
def test_causal_lm_bytes_are_refused_with_the_door_that_runs_them():
    import tensorflow as tf

    from keras_posenc.models import build_causal_lm

    tf.keras.utils.set_random_seed(0)
    model = build_causal_lm(11, hidden_dim=8, num_layers=1, num_heads=2)
    ids = np.random.default_rng(0).integers(1, 11, (2, 6))
    model_bytes = tflite_export.convert_causal_lm(
        model, ids, mode="float32", max_length=8
    )
    with pytest.raises(ValueError, match="generate_tflite"):
        tflite_export.verify(model_bytes)


def test_the_reports_are_titled_headed_tables_with_errors_beside_their_scales():
    """An error in output units alone says nothing: in int8 steps (error /
    scale) and as a share of the outputs' range beside it; a title, a head
    row, and two cells a line (no `|` inside a cell)."""
    from tflite_export import LMReport, Report

    report = Report(
        ops=["ADD"],
        input_dtype="int8",
        output_dtype="int8",
        size_bytes=10,
        output_scale=0.5,
        tflm_ok=True,
        tflm_missing_ops=[],
        output_range=4.0,
        max_error=1.0,
    )
    lm = LMReport(
        10, ["decode"], 8, bits_per_token_keras=2.0, bits_per_token_litert=2.02
    )
    for table, title in (
        (report.table(), "The exported model"),
        (lm.table(), "The causal LM"),
    ):
        lines = table.splitlines()
        assert lines[0].startswith(title)
        assert [cell.strip() for cell in lines[1].split("|")] == [
            "",
            "what",
            "value",
            "",
        ]
        assert all(line.count("|") == 3 for line in lines[1:]), table
    assert (
        "| 1.0000 (2.0 int8 steps; 25.0% of the outputs' range 4) |" in report.table()
    )
    assert "| 2.0200 (+1.00% over Keras) |" in lm.table()
