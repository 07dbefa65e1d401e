"""No import circles in the packages, lazy (function-level) imports included."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("keras_posenc", "tflite_export")


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources):
    """`{module: {imported module, ...}}` of `{module: source text}`.

    `from package import name` points at `package.name` when that is a module
    of `sources`, else at `package`; only modules of `sources` count.
    """
    graph = {}
    for module, text in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in sources else node.module)
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def cycles(graph):
    """Every import circle found by a depth-first walk, as a list of modules."""
    found, state = [], {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                found.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def package_sources():
    return {
        module_name(path): path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_no_import_circles_in_the_packages():
    assert cycles(import_graph(package_sources())) == []


def test_the_checker_finds_a_lazy_import_circle():
    sources = {
        "pkg": "",
        "pkg.a": "from pkg import b\n",
        "pkg.b": "def f():\n    from pkg.a import g\n",
        "pkg.c": "import pkg.a\n",
    }
    assert cycles(import_graph(sources)) == [["pkg.a", "pkg.b", "pkg.a"]]
