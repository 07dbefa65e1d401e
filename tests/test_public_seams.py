"""Other packages reach keras_posenc through public doors only (docs/style.md)."""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OTHER_ROOMS = ("tflite_export", "examples", "benchmarks")


def sources(*folders):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


@functools.cache
def private_attributes():
    """Every `_name` (not dunder) that keras_posenc defines or assigns (read
    once a pass: the package's sources do not change under the tests)."""
    names = set()
    for path in sources("keras_posenc"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def is_private(name):
    return any(p.startswith("_") and not p.startswith("__") for p in name.split("."))


def problems_in(source, private):
    """What in `source` goes through a private door of keras_posenc."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "keras_posenc"
        ):
            names = [node.module] + [alias.name for alias in node.names]
            problems += [f"imports {n}" for n in names if is_private(n)]
        elif isinstance(node, ast.Import):
            problems += [
                f"imports {alias.name}"
                for alias in node.names
                if alias.name.startswith("keras_posenc") and is_private(alias.name)
            ]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            problems.append(f"reads .{node.attr} (line {node.lineno})")
        elif isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Attribute) and side.attr == "__name__"
            for side in [node.left, *node.comparators]
        ):
            if "__main__" not in ast.unparse(node):
                problems.append(f"matches a class name (line {node.lineno})")
    return problems


@pytest.mark.parametrize("path", list(sources(*OTHER_ROOMS)), ids=lambda p: p.name)
def test_no_private_import_attribute_or_class_name_match(path):
    assert problems_in(path.read_text(), private_attributes()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "from keras_posenc._compat import keras",
        "from keras_posenc.layers import _positions",
        "import keras_posenc._checks",
        "width = attention._query_dense.kernel.shape[0]",
        "ok = type(layer).__name__ == 'Embedding'",
    ],
)
def test_the_checker_catches_each_private_door(snippet):
    assert problems_in(snippet, private_attributes())
