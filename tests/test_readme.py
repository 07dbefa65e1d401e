"""Every Python block of the README runs here, and prints what the README says."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import keras_posenc
from keras_posenc import IS_KERAS_3

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

#: The heading above each Python block of the README, in order: a new block
#: needs a test here (and a line in this tuple).
BLOCKS = (
    "## First example",
    "## Text generation: causal language models",
    "## Edge deployment: `tflite_export`",
)


def python_blocks():
    """`{heading: code}` of every ```python block, under its nearest heading."""
    found, heading = {}, None
    for part in re.split(
        r"(^#{1,3} [^\n]*$|```python\n.*?```)", README, flags=re.M | re.S
    ):
        if re.match(r"#{1,3} ", part):
            heading = part.strip()
        elif part.startswith("```python\n"):
            assert heading not in found, f"two blocks under {heading}"
            found[heading] = part[len("```python\n") : -3]
    return found


def test_every_python_block_is_one_this_file_runs():
    assert tuple(python_blocks()) == BLOCKS


def test_the_first_example_is_the_example_script():
    script = (ROOT / "examples" / "readme_example.py").read_text()
    assert python_blocks()["## First example"].strip() in script


#: Printed to standard error after TensorFlow's own import, before the snippet.
AFTER_TENSORFLOW = "--- TensorFlow imported first ---"


@pytest.mark.slow
def test_the_first_example_prints_what_the_readme_shows(tmp_path):
    """Run as a user who imported TensorFlow before it: past TensorFlow's own
    start-up lines (printed before the package could act), not one line of
    standard error."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    script = ROOT / "examples" / "readme_example.py"
    first = (
        "import sys\nimport tensorflow\n"
        f"print({AFTER_TENSORFLOW!r}, file=sys.stderr, flush=True)\n"
        f"exec(compile(open({str(script)!r}).read(), {str(script)!r}, 'exec'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP")}
    result = subprocess.run(
        [sys.executable, "-c", first],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = result.stderr.split(AFTER_TENSORFLOW + "\n")
    assert before.count("\n") >= 1  # TensorFlow's start-up lines, already out
    assert after.splitlines() == [], after
    printed = result.stdout.strip().splitlines()[-4:]
    section = README.split("## First example", 1)[1]
    shown = section.split("It prints", 1)[1].split("```\n", 2)[1].strip().splitlines()
    if keras_posenc.IS_KERAS_3:  # the README's numbers are this mode's
        assert printed == shown
    else:  # other initial weights: the claims, not the digits
        found = [
            float(re.search(r"7s found ([\d.]+)", line)[1]) for line in printed[:2]
        ]
        assert min(found) > 0.95, printed
        assert printed[2] == "reloaded equal: True"
        assert float(printed[3].rsplit(" ", 1)[1]) > 0.95, printed
    for line in printed[:2]:  # far above always answering "no"
        accuracy, majority = re.search(
            r"accuracy ([\d.]+) \(majority rate ([\d.]+)", line
        ).groups()
        assert float(accuracy) > float(majority) + 0.05, line


def test_the_capability_table_is_the_method_tables():
    from keras_posenc.models.capabilities import capability_table

    assert capability_table() in README


def test_the_readme_reads_in_ten_minutes():
    assert len(README.splitlines()) <= 300


def test_every_docs_page_the_readme_names_exists():
    for name in re.findall(r"`(docs/[\w.]+\.md)`", README):
        assert (ROOT / name).exists(), name


if not IS_KERAS_3:  # one pass each (both train for 30-50 s): the layers and
    # exporters they call run in both passes elsewhere

    @pytest.mark.slow
    def test_generation_snippet_trains_enough_to_print_words(capsys):
        pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
        namespace = {}
        exec(python_blocks()["## Text generation: causal language models"], namespace)
        printed = capsys.readouterr().out
        texts = [  # Keras, then TFLM; generated text may hold line breaks
            namespace["lm"].text_of(namespace[name][0])
            for name in ("tokens", "on_device")
        ]
        assert printed.endswith(f"{texts[0]}\n{texts[1]}\n")
        # Words of the training text (Python's docs), not random bytes: each
        # continuation (40 bytes, which may hold a line break and indentation,
        # as the docs do) writes one at least, the two three.
        lm = namespace["lm"]
        vocabulary = set(re.findall(r"[a-z]{2,}", lm.text_of(namespace["train_ids"])))
        known = []
        for text in texts:
            assert text.startswith("The return value "), text
            words = re.findall(r"[a-z]{2,}", text[17:].lower())
            known.append(sum(word in vocabulary for word in words))
        assert min(known) >= 1 and sum(known) >= 3, (texts, known)


if IS_KERAS_3:

    @pytest.mark.slow
    def test_edge_snippet_runs_and_writes_the_c_array(capsys, tmp_path, monkeypatch):
        pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
        monkeypatch.chdir(tmp_path)
        namespace = {}
        exec(python_blocks()["## Edge deployment: `tflite_export`"], namespace)
        table = capsys.readouterr().out
        assert re.search(r"\| TFLM\s+\| runs \|", table), table
        # The rows the README shows are rows it printed.
        section = README.split("## Edge deployment", 1)[1].split("It prints", 1)[1]
        shown = section.split("```\n", 2)[1].strip().splitlines()
        assert len(shown) >= 4 and set(shown) <= set(table.splitlines()), table
        accuracy = float(re.search(r"accuracy TFLM\s*\| ([\d.]+)", table)[1])
        labels = namespace["y"][512:]
        assert accuracy > max(labels.mean(), 1 - labels.mean())  # beats the majority
        assert (tmp_path / "model.cc").exists() and (tmp_path / "model.h").exists()
        # The QAT model converted without data: as accurate as the float model.
        model, x = namespace["model"], namespace["x"][512:]
        float_accuracy = np.mean(np.argmax(model.predict(x, verbose=0), -1) == labels)
        qat_table = table.split("| ops", 2)[2]  # the QAT model's report
        for runtime in ("LiteRT", "TFLM"):
            found = re.search(rf"accuracy {runtime}\s*\| ([\d.]+)", qat_table)
            assert float(found[1]) >= float_accuracy - 0.01, (runtime, qat_table)
