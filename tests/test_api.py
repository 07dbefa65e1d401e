import doctest
import inspect
import re

import pytest
import tensorflow as tf

import keras_posenc

SECTIONS = ["Call arguments:", "Returns:", "Example:", "References:"]
LAYERS = [
    getattr(keras_posenc, name)
    for name in keras_posenc.__all__
    if inspect.isclass(getattr(keras_posenc, name))
    and issubclass(getattr(keras_posenc, name), tf.keras.layers.Layer)
]
FUNCTIONS = [
    getattr(keras_posenc, name)
    for name in keras_posenc.__all__
    if inspect.isfunction(getattr(keras_posenc, name))
]


def constructor_args(cls):
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p not in ("self", "kwargs")]


def test_all_names_exist():
    for name in keras_posenc.__all__:
        assert hasattr(keras_posenc, name), name


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_docstring_has_the_sections_in_order(cls):
    doc = inspect.getdoc(cls)
    sections = (["Args:"] if constructor_args(cls) else []) + SECTIONS
    positions = [doc.find(section) for section in sections]
    assert -1 not in positions, (cls.__name__, sections, positions)
    assert positions == sorted(positions)


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_every_constructor_argument_is_documented(cls):
    doc = inspect.getdoc(cls)
    args_section = doc.split("Args:", 1)[-1].split("Call arguments:", 1)[0]
    for arg in constructor_args(cls):
        assert f"    {arg}:" in "    " + args_section.replace("\n", "\n    "), arg
        entry = args_section.split(f"{arg}:", 1)[1].split(":\n", 1)[0]
        assert "Defaults to" in entry or arg in (
            "num_heads",
            "key_dim",
            "max_length",
            "num_classes",
            "dim",
            "depth",
        ), arg


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_every_call_argument_is_documented(cls):
    doc = inspect.getdoc(cls)
    section = doc.split("Call arguments:", 1)[1].split("Returns:", 1)[0]
    params = inspect.signature(cls.call).parameters
    # `mask` is Keras' own plumbing: Keras fills it from the inputs.
    names = [p for p in params if p not in ("self", "kwargs", "mask")]
    documented = set()
    for header in re.findall(r"^    ([\w, ]+):", section, flags=re.MULTILINE):
        documented.update(part.strip() for part in header.split(","))
    assert set(names) <= documented, set(names) - documented


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_every_constructor_argument_is_in_get_config(cls):
    example = _example_instance(cls)
    config = example.get_config()
    for arg in constructor_args(cls):
        assert arg in config, arg


@pytest.mark.parametrize("cls", LAYERS, ids=lambda c: c.__name__)
def test_layer_resolves_through_the_keras_registry(cls):
    found = tf.keras.utils.get_registered_object(f"keras_posenc>{cls.__name__}")
    assert found is cls


@pytest.mark.parametrize("obj", LAYERS + FUNCTIONS, ids=lambda c: c.__name__)
def test_docstring_example_runs(obj):
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(obj, globs={})
    assert tests and tests[0].examples, f"{obj.__name__} has no doctest example"
    for test in tests:
        runner.run(test)
    assert runner.failures == 0


def _example_instance(cls):
    required = {
        "num_heads": 2,
        "key_dim": 4,
        "max_length": 8,
        "dim": 4,
        "depth": 2,
        "hidden_dim": 8,
        "num_classes": 3,
        "vocab_size": 10,
        "output_dim": 4,
        "units": 4,
        "intermediate_dim": 8,
        "static_bias": keras_posenc.KerpleBias(2),
    }
    params = inspect.signature(cls.__init__).parameters
    kwargs = {
        name: required[name]
        for name, p in params.items()
        if p.default is inspect.Parameter.empty and name in required
    }
    return cls(**kwargs)


def test_root_holds_the_role_namespaces():
    import types

    for name in ("layers", "models", "ops", "data", "training", "generation", "utils"):
        assert isinstance(getattr(keras_posenc, name), types.ModuleType), name
        assert name in keras_posenc.__all__


def test_layers_namespace_holds_the_public_layers():
    assert LAYERS
    for cls in LAYERS:
        assert getattr(keras_posenc.layers, cls.__name__) is cls
    for name in keras_posenc.layers.__all__:
        assert getattr(keras_posenc.layers, name) is getattr(keras_posenc, name)


def test_attention_exposes_only_keras_names_and_the_override_point():
    cls = keras_posenc.RelativeMultiHeadAttention
    public = {name for name in vars(cls) if not name.startswith("_")}
    public.discard("build_from_config")  # Keras' own (wrapped under Keras 2)
    assert public == {
        "build",
        "call",
        "compute_attention",
        "compute_output_shape",
        "compute_output_spec",
        "get_config",
        "key_dense",
        "output_dense",
        "query_dense",
        "value_dense",
    }


def test_the_attention_class_reads_in_one_sitting():
    """Its module at most 600 lines, its docstring at most 80; the other
    paths live in modules named for them (`docs/attention.md`)."""
    module = inspect.getsourcefile(keras_posenc.RelativeMultiHeadAttention)
    with open(module) as source:
        assert len(source.read().splitlines()) <= 600
    assert (
        len(inspect.getdoc(keras_posenc.RelativeMultiHeadAttention).splitlines()) <= 80
    )


#: Signatures above 12 named parameters, with why: Keras' own
#: `MultiHeadAttention` takes 16 (its projections' dims, bias and
#: initializers, which this layer keeps under the same names).
#: Wider than 12, each for the keywords Keras users pass by name: the
#: attention's window and key heads (keras-hub's and Keras'
#: `GroupedQueryAttention`'s names), taken the same way by the builders, and
#: the attention's kernel grid for int4 LMs (an argument, not a context);
#: the LM's `block_options`, the one dict of its layers' make-up; the
#: rotary layer's M-RoPE layout (Qwen2-VL chunked or Qwen3-VL interleaved).
WIDER = {
    "RelativeMultiHeadAttention.__init__": 16,
    "build_encoder": 15,
    "CausalLM.__init__": 14,
    "RotaryEmbedding.__init__": 13,
}


def _named(function):
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    params = inspect.signature(function).parameters.values()
    return [p for p in params if p.name != "self" and p.kind not in kinds]


def test_public_signatures_are_twelve_parameters_at_most():
    """Functions, constructors and `generate` (calls mirror Keras' own)."""
    found = {}
    for obj in _public_objects():
        if inspect.isclass(obj) and "__dataclass_fields__" not in vars(obj):
            found[f"{obj.__qualname__}.__init__"] = len(_named(obj.__init__))
            if inspect.isfunction(getattr(obj, "generate", None)):
                found[f"{obj.__qualname__}.generate"] = len(_named(obj.generate))
        elif inspect.isfunction(obj) and "." not in obj.__qualname__:
            found[obj.__qualname__] = len(_named(obj))
    wide = {name: n for name, n in found.items() if n > 12}
    assert wide == WIDER
    assert found["CausalLM.generate"] <= 12


def _public_objects():
    """Public classes and functions of both packages, with their methods."""
    import importlib
    import pkgutil

    import tflite_export

    seen = {}
    for package in (keras_posenc, tflite_export):
        names = [package.__name__] + [
            m.name
            for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
            if not any(part.startswith("_") for part in m.name.split("."))
        ]
        for module in map(importlib.import_module, names):
            for name, obj in vars(module).items():
                if (
                    name.startswith("_")
                    or getattr(obj, "__module__", "") != module.__name__
                ):
                    continue
                seen[id(obj)] = obj
                if inspect.isclass(obj):
                    for key, method in vars(obj).items():
                        if not key.startswith("_") and inspect.isfunction(method):
                            seen[id(method)] = method
    return list(seen.values())


def test_every_argument_doc_is_three_lines_at_most():
    long = []
    for obj in _public_objects():
        doc = inspect.cleandoc(obj.__doc__ or "")  # its own, not a base class's
        if "Args:" not in doc:
            continue
        section = doc.split("Args:", 1)[1]
        section = re.split(
            r"\n(?:Call arguments|Returns|Example|References):", section
        )[0]
        for entry in re.split(r"\n    (?=[\w*][\w, *]*:)", "\n" + section):
            lines = [line for line in entry.splitlines() if line.strip()]
            if len(lines) > 3:
                long.append(f"{obj.__qualname__}: {lines[0].strip()[:30]}")
    assert long == []
