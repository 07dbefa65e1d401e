"""What each builder method can do, read from the method table itself.

`capability_table()` is the README's table (a test compares the two, so it
cannot drift): one row per `position=` name of `METHODS`, what it is and its
paper (the row's `summary` and `paper`), then columns computed from the same
records and checks the builders and exporters use. Run `python -m
keras_posenc.models.capabilities` to print it.
"""

import dataclasses

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
    grouped-query attention where the stack takes `num_key_value_heads`.
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
    )


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


if __name__ == "__main__":
    print(capability_table())
