"""The ops a header must list, read from a flatbuffer by another reader.

TFLM's own schema module (not the one `tflite_export` reads with) walks every
operator of every subgraph; the op names become TFLM's resolver methods by the
list in `tests/fixtures/tflm_replay/tensorflow/lite/micro/
micro_mutable_op_resolver.h`, copied from TFLM's resolver.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESOLVER = (
    ROOT
    / "tests/fixtures/tflm_replay/tensorflow/lite/micro/micro_mutable_op_resolver.h"
)


def resolver_methods():
    """Every `Add...` method of TFLM's `MicroMutableOpResolver`."""
    text = RESOLVER.read_text()
    block = text[text.index("#define TFLM_RESOLVER_METHODS") :]
    block = block[: block.index("\n\n")]
    return re.findall(r"X\((Add\w+)\)", block)


def operator_methods(model_bytes):
    """The resolver methods of the builtin ops the model's operators run."""
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as s

    names = {v: k for k, v in vars(s.BuiltinOperator).items() if k.isupper()}
    by_words = {m.lower(): m for m in resolver_methods()}
    model = s.Model.GetRootAs(bytes(model_bytes), 0)
    found = set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for o in range(subgraph.OperatorsLength()):
            code = model.OperatorCodes(subgraph.Operators(o).OpcodeIndex())
            op = names[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
            found.add(by_words["add" + op.replace("_", "").lower()])
    return found


def header_methods(header_text, prefix="G_MODEL"):
    """`(NUM_OPS, [methods of the X-macro])` of a generated header."""
    count = int(re.search(rf"#define {prefix}_NUM_OPS (\d+)", header_text).group(1))
    macro = header_text[header_text.index(f"#define {prefix}_OPS(X)") :]
    macro = macro[: macro.index("\n//")]
    return count, re.findall(r"X\((Add\w+)\)", macro)


def assert_header_lists_the_model_ops(model_bytes, header_text, prefix="G_MODEL"):
    count, methods = header_methods(header_text, prefix)
    assert count == len(methods) == len(set(methods))
    assert set(methods) == operator_methods(model_bytes)
