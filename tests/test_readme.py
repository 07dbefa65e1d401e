import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _first_python_block(text):
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_example_is_the_example_script():
    block = _first_python_block((ROOT / "README.md").read_text())
    script = (ROOT / "examples" / "readme_example.py").read_text()
    assert block.strip() in script


@pytest.mark.slow
def test_readme_example_runs_trains_and_reloads(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "readme_example.py")],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip().splitlines()[-1]
    accuracy = float(line.split("accuracy:")[1].split()[0])
    assert accuracy > 0.95, line
    assert line.endswith("reloaded equal: True"), line


def test_rotary_snippet_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = text.split("### Rotary positions", 1)[1].split("```python\n", 1)[1]
    exec(block.split("```", 1)[0], {})
    printed = capsys.readouterr().out.split()
    assert printed == ["(2,", "16,", "512)", "(1,", "4096,", "64)"]


@pytest.mark.slow
def test_generation_snippet_runs(capsys):
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    text = (ROOT / "README.md").read_text()
    section = text.split("## Text generation: causal language models", 1)[1]
    exec(section.split("```python\n", 1)[1].split("```", 1)[0], {})
    printed = capsys.readouterr().out
    assert printed.count("The return value ") == 2  # Keras, then TFLM
