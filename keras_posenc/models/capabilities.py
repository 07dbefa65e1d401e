"""What each builder method can do, read from the method table itself.

`capability_table()` is the README's table (a test compares the two, so it
cannot drift): one row per `position=` name of `METHODS`, what it is and its
paper (the row's `summary` and `paper`), then columns computed from the same
records and checks the builders and exporters use. Run `python -m
keras_posenc.models.capabilities` to print it, and `python -m
keras_posenc.models.capabilities --docs README.md docs/*.md` to rewrite the
lists of methods the pages mark (`DOC_LISTS`) after adding a row.
"""

import dataclasses
import pathlib
import re
import sys

from keras_posenc._backend import BACKENDS
from keras_posenc.models.decoder_stack import DecoderStack
from keras_posenc.models.methods import (
    LOCAL_METHODS,
    LSH_METHODS,
    METHODS,
    QUANTIZED_METHODS,
)
from keras_posenc.models.stack import TransformerStack

#: The table's columns, in order.
COLUMNS = (
    "method",
    "what it is",
    "generated",
    "encoder",
    "causal LM",
    "int8 LiteRT",
    "int8 TFLM",
    "QAT",
    "streaming",
    "grouped-query",
    "block-local",
    "LSH",
    "packed",
    "JAX",
    "PyTorch",
)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What one builder method can do (each field a bool)."""

    method: str
    generated: bool
    encoder: bool
    causal_lm: bool
    int8: bool
    qat: bool
    streaming: bool
    grouped_query: bool
    block_local: bool
    lsh: bool
    packed: bool
    backends: dict

    def cells(self):
        """The row's cells, `COLUMNS` order: `yes`, or `-` for no."""
        marks = (
            self.generated,
            self.encoder,
            self.causal_lm,
            self.int8,
            self.int8,
            self.qat,
            self.streaming,
            self.grouped_query,
            self.block_local,
            self.lsh,
            self.packed,
            self.backends["jax"],
            self.backends["torch"],
        )
        record = METHODS[self.method]
        what, paper = record.summary, record.paper
        first = [f"`{self.method}`", what + (f" ({paper})" if paper else "")]
        return first + ["yes" if mark else "-" for mark in marks]


def capabilities(method):
    """The `Capabilities` of `METHODS[method]`.

    int8 (LiteRT and TFLM alike) needs int8 kernels for every op
    (`PositionMethod.int8_kernels`: `fox` and `cope` export at float32
    only), QAT every layer's rounding modelled (`rounding_modelled`);
    streaming needs positions that live in the attention
    (`TransformerStack.streaming_blocker` of a causal stack); every method
    builds encoders and causal LMs, block-local and on packed rows;
    grouped-query attention where the stack takes `num_key_value_heads`;
    `backends` `{backend: bool}` from the row (`PositionMethod.backends`:
    train, generate, `.keras` across backends; QAT and export are
    TensorFlow's).
    """
    record = METHODS[method]
    stack = TransformerStack(method, 8, 1, 2, causal=True)
    return Capabilities(
        method=method,
        generated=record.generated,
        encoder=True,
        causal_lm=True,
        int8=record.int8_kernels,
        qat=method in QUANTIZED_METHODS,
        streaming=stack.streaming_blocker() is None,
        grouped_query=_builds_grouped_query(method),
        block_local=method in LOCAL_METHODS,
        lsh=method in LSH_METHODS,
        packed=True,
        backends={b: b in record.backends for b in BACKENDS},
    )


def block_capabilities(position, num_layers, block_options, position_options=None):
    """The `Capabilities` of a causal LM of `position` with `block_options`.

    int8 as the method's, unless a layer says it has no integer kernels
    (`integer_blocker`: the exact GELU); no
    QAT (the blocks' rounding is not modelled: `quantize=True` is refused
    with `block_options`);
    streaming where the `DecoderStack` has no blocker (sliding layers and
    absolute tables have); grouped-query always; encoders, block-local, LSH
    and packed rows as the conformance page does not measure them (False).
    """
    record = METHODS[position]
    stack = DecoderStack(
        position,
        16,
        num_layers,
        2,
        position_options=position_options,
        block_options=block_options,
    )
    return Capabilities(
        method=position,
        generated=record.generated,
        encoder=False,
        causal_lm=True,
        int8=record.int8_kernels and not _integer_blocked(stack),
        qat=False,
        streaming=stack.streaming_blocker() is None,
        grouped_query=True,
        block_local=False,
        lsh=False,
        packed=False,
        backends={b: b in record.backends for b in BACKENDS},
    )


def _integer_blocked(stack):
    """Whether a stack's layer says it has no integer kernels."""
    layers = [*stack.blocks, *stack.ffn]
    return any(getattr(layer, "integer_blocker", None) for layer in layers)


def _builds_grouped_query(method):
    """Whether the stack of `method` takes `num_key_value_heads` (it checks)."""
    try:
        TransformerStack(method, 8, 1, 2, causal=True, num_key_value_heads=1)
    except ValueError:
        return False
    return True


def streaming_methods():
    """The methods a causal LM streams through a rolling cache, in order."""
    return tuple(name for name in METHODS if capabilities(name).streaming)


def capability_table():
    """The README's capability table, as Markdown."""
    rows = [COLUMNS, ("---",) * len(COLUMNS)]
    rows += [capabilities(method).cells() for method in METHODS]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


#: The lists of methods the docs write out, `{name: (methods, last word)}`.
DOC_LISTS = {
    "all": (lambda: tuple(METHODS), "or"),
    "quantized": (lambda: QUANTIZED_METHODS, "and"),
    "streaming": (streaming_methods, "and"),
}
#: A list in a page: `<!-- methods: NAME -->`, the list, `<!-- /methods -->`.
MARKED = re.compile(r"(<!-- methods: (\w+) -->)(.*?)(<!-- /methods -->)", re.S)


def method_list(name):
    """The Markdown of list `name` of `DOC_LISTS`: "`a`, `b` and `c`"."""
    methods, last = DOC_LISTS[name]
    names = [f"`{method}`" for method in methods()]
    return ", ".join(names[:-1]) + f" {last} " + names[-1]


#: The capability table in a page: its head row and every row after it.
TABLE = re.compile(r"^\| method \| what it is \|.*?\n(?:\|.*\n?)*", re.M)


def with_method_lists(text):
    """`text` with every marked list of methods, and the capability table
    if it holds one, written from the method table."""
    text = TABLE.sub(lambda found: capability_table() + "\n", text)
    return MARKED.sub(lambda found: found[1] + method_list(found[2]) + found[4], text)


def _write_docs(paths):
    """Rewrites the marked lists of `paths` in place; prints what changed."""
    for path in paths:
        text = pathlib.Path(path).read_text()
        new = with_method_lists(text)
        if new != text:
            pathlib.Path(path).write_text(new)
            print(f"rewrote the lists of methods in {path}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--docs"]:  # a new row: its docs lists follow
        _write_docs(sys.argv[2:])
    else:
        print(capability_table())
