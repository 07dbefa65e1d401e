"""Every Python block and export command of docs/ runs here, as written."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: The docs that hold Python blocks, with how many: a new block needs a test.
BLOCKS = {"decoders.md": 1, "layers.md": 1, "lm_on_device.md": 2, "phones.md": 1}


def python_blocks(name):
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_every_python_block_of_the_docs_is_one_this_file_runs():
    found = {
        path.name: len(python_blocks(path.name))
        for path in sorted(DOCS.glob("*.md"))
        if python_blocks(path.name)
    }
    assert found == BLOCKS


def test_the_rotary_snippet_prints_its_shapes(capsys):
    exec(python_blocks("layers.md")[0], {})
    printed = capsys.readouterr().out.split()
    assert printed == ["(2,", "16,", "512)", "(1,", "4096,", "64)"]


def test_the_decoder_snippet_prints_what_the_guide_says(capsys):
    exec(python_blocks("decoders.md")[0], {})
    printed = capsys.readouterr().out.strip()
    doc = (DOCS / "decoders.md").read_text()
    assert f"It prints `{printed}`." in doc


def test_the_decoder_guide_lists_every_block_option_and_family():
    from keras_posenc.models.blocks import BLOCK_KEYS
    from keras_posenc.models.families import FAMILIES
    from keras_posenc.models.families.keras_hub import BACKBONES

    doc = (DOCS / "decoders.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", doc, flags=re.M)
    assert [key for key in rows if key in BLOCK_KEYS] == list(BLOCK_KEYS)
    assert set(FAMILIES) <= set(rows)
    assert all(f"`{name}`" in doc for name in BACKBONES)


@pytest.mark.slow
def test_the_microcontroller_guide_runs_from_training_to_the_firmware_files(tmp_path):
    """Its blocks in one process (make lm.keras and ids.npy, then QAT and
    convert), then its export command on those files."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    script = "\n".join(python_blocks("lm_on_device.md"))
    script += "\nassert tflite_export.device_contract(model_bytes).vocab_size == 256\n"
    _run([sys.executable, "-c", script], tmp_path)
    doc = (DOCS / "lm_on_device.md").read_text()
    commands = re.findall(r"```\n(python -m tflite_export lm\.keras.*?)```", doc, re.S)
    assert len(commands) == 2  # the stopping step, then the streaming one
    for command in commands:  # in order, in one folder, as a reader runs them
        words = command.replace("\\\n", " ").split()
        run = _run([sys.executable, *words[1:]], tmp_path)
        assert "| TFLM == LiteRT | True |" in run.stdout
    written = {"lm.tflite", "lm.cc", "lm.h", "lm_decode.h", "lm_streaming.tflite"}
    assert written <= {path.name for path in tmp_path.iterdir()}


@pytest.mark.slow
def test_the_microcontroller_guides_contract_is_what_its_export_prints():
    """The guide's contract table and protocol, word for word, are those of
    the LM it names (seeded), so a change to the exporter shows there."""
    pytest.importorskip("tflite_micro", reason="needs tflite-micro (TFLM)")
    import numpy as np
    import tensorflow as tf

    from keras_posenc import IS_KERAS_3
    from keras_posenc.models import build_causal_lm
    from tflite_export import convert_causal_lm, device_contract

    tf.keras.utils.set_random_seed(0)
    options = dict(
        hidden_dim=16, num_layers=2, num_heads=2, position_options={"max_length": 16}
    )
    model = build_causal_lm(19, position="hybrid", **options)
    ids = np.random.default_rng(0).integers(1, 19, (8, 16))
    model_bytes = convert_causal_lm(model, ids, max_length=16, target="tflm")
    contract = device_contract(model_bytes)
    doc = (DOCS / "lm_on_device.md").read_text()
    printed = [line for line in contract.table().splitlines() if line.startswith("|")]
    shown = [
        line
        for line in doc.splitlines()
        if line.startswith(
            (
                "| input |",
                "| output |",
                "| | index |",
                "| --- | --- | --- | --- | --- | --- |",
            )
        )
    ]
    assert len(shown) == len(printed)
    # The scales and zero points are the default Keras' weights' (Keras 2
    # draws other initial weights from the same seed): checked there only.
    numbers = slice(None) if IS_KERAS_3 else [0, 1, 2, 3, 4, 5, 8]
    for want, got in zip(printed, shown):
        assert np.array(want.split("|"))[numbers].tolist() == (
            np.array(got.split("|"))[numbers].tolist()
        ), (want, got)
    assert "\n".join(contract.protocol()) in doc


@pytest.mark.slow
def test_the_phone_guide_runs_from_training_to_the_engine_and_its_cli(tmp_path):
    """Its block (train, one call, the engine's text equal to Keras'), then
    its `litert-lm run` command on the file it wrote."""
    pytest.importorskip("litert_lm", reason="needs litert-lm-api (LiteRT-LM)")
    run = _run([sys.executable, "-c", python_blocks("phones.md")[0]], tmp_path)
    assert run.stdout.splitlines()[-1] == "True", run.stdout[-2000:]
    doc = (DOCS / "phones.md").read_text()
    command = re.search(r"```\n(litert-lm run .*?)\n```", doc, re.S).group(1)
    cli = pathlib.Path(sys.executable).with_name("litert-lm")
    if not cli.exists():
        pytest.skip("needs the litert-lm CLI (the litertlm extra)")
    words = shlex.split(command)
    run = _run([str(cli), *words[1:]], tmp_path)
    assert run.stdout.strip(), run.stderr[-2000:]


def _run(command, folder):
    """`command` in `folder` with the repository importable; it must succeed."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        env=environment,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run
