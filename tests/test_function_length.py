"""Functions read in one screen: at most 60 lines of code in both packages.

A function's lines of code are its lines from `def` to its end, less its
docstring, blank lines and lines holding only a comment (a nested function's
lines count toward the function around it too).
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("keras_posenc", "tflite_export")
#: The longest function, in lines of code (`docs/style.md`).
LIMIT = 60


def code_lines(source, node):
    """Lines of code of the function `node` of `source`."""
    skip = set()
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):  # the docstring
            skip = set(range(first.lineno, first.end_lineno + 1))
    lines = source.splitlines()[node.lineno - 1 : node.end_lineno]
    return sum(
        1
        for number, line in enumerate(lines, start=node.lineno)
        if number not in skip and line.strip() and not line.strip().startswith("#")
    )


def long_functions(sources):
    """`{"path:line name": lines}` of every function over `LIMIT` lines."""
    found = {}
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = code_lines(source, node)
                if count > LIMIT:
                    found[f"{path}:{node.lineno} {node.name}"] = count
    return found


def test_no_function_is_over_sixty_lines_of_code():
    sources = {
        str(path.relative_to(ROOT)): path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert long_functions(sources) == {}


def test_the_counter_skips_the_docstring_blanks_and_comments():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 1))
    source = f'def f():\n    """One.\n\n    Two.\n    """\n    # a note\n\n{body}\n'
    assert long_functions({"a.py": source}) == {}  # def + 59 lines
    longer = source + "    return x0\n"
    assert long_functions({"a.py": longer}) == {"a.py:1 f": LIMIT + 1}
