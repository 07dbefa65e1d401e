"""Every docstring example of every public module runs (a broken one fails)."""

import doctest
import importlib
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def public_modules():
    """Dotted names of the modules of both packages that users import."""
    names = []
    for package in ("keras_posenc", "tflite_export"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts):
                continue
            names.append(".".join(parts))
    return names


def test_public_modules_include_every_role_folder():
    names = set(public_modules())
    for role in ("layers", "models", "ops", "data", "training"):
        assert f"keras_posenc.{role}" in names, role


@pytest.mark.parametrize("name", public_modules())
def test_docstring_examples_run(name):
    if name == "keras_posenc.viz":
        pytest.importorskip("matplotlib", reason="keras_posenc.viz needs matplotlib")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    # Only the module's own objects, not those it imports from elsewhere.
    tests = [
        test
        for test in finder.find(module, globs={"np": np})
        if test.name == name or test.name.startswith(name + ".")
    ]
    for test in tests:
        if getattr(test, "filename", None) and module.__file__ != test.filename:
            continue
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing examples in {name}"
